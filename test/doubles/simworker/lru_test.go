package simworker

import "testing"

func TestLRU(t *testing.T) {
	tests := []struct {
		name    string
		cap     int
		puts    []string
		touch   []string // read between the puts and the checks
		want    []string
		notWant []string
	}{
		{"under capacity", 3, []string{"a", "b"}, nil, []string{"a", "b"}, nil},
		{"evicts oldest", 2, []string{"a", "b", "c"}, nil, []string{"b", "c"}, []string{"a"}},
		{"refresh on put", 2, []string{"a", "b", "a", "c"}, nil, []string{"a", "c"}, []string{"b"}},
		{"zero capacity holds one", 0, []string{"a", "b"}, nil, []string{"b"}, []string{"a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newLRU[string, int](tt.cap)
			for i, k := range tt.puts {
				c.put(k, i)
			}
			for _, k := range tt.want {
				if !c.contains(k) {
					t.Errorf("missing %q", k)
				}
			}
			for _, k := range tt.notWant {
				if c.contains(k) {
					t.Errorf("unexpected %q", k)
				}
			}
		})
	}

	c := newLRU[string, int](2)
	c.put("a", 1)
	c.put("b", 2)
	if _, ok := c.get("a"); !ok { // a becomes most recent
		t.Fatal("a missing")
	}
	c.put("c", 3)
	if c.contains("b") || !c.contains("a") {
		t.Error("get did not refresh recency")
	}
	if v, _ := c.get("c"); v != 3 || c.len() != 2 {
		t.Errorf("get(c) = %d, len %d", v, c.len())
	}
	c.clear()
	if c.len() != 0 || c.contains("a") {
		t.Error("clear left entries")
	}
}

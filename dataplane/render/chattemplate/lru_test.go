package chattemplate

import (
	"slices"
	"testing"
)

// TestByteLRU: entries are evicted oldest first once the bytes pass the budget, but for a
// second chance: an entry a get used since it was last put at the front is moved there instead,
// once (a get that does not use leaves it as it was), and the entry being put is not evicted to
// make room for itself while another can be; a key put again replaces its entry and its size.
func TestByteLRU(t *testing.T) {
	type op struct {
		put, get string // a key to put (with size) or get (with use)
		size     int64
		use      bool
	}
	tests := map[string]struct {
		ops   []op
		keys  []string // kept, in the list's order (the next considered for eviction last)
		bytes int64
	}{
		"within the budget":            {ops: []op{{put: "a", size: 4}, {put: "b", size: 4}, {put: "c", size: 2}}, keys: []string{"c", "b", "a"}, bytes: 10},
		"the oldest evicted":           {ops: []op{{put: "a", size: 4}, {put: "b", size: 4}, {put: "c", size: 4}}, keys: []string{"c", "b"}, bytes: 8},
		"a get that uses keeps it":     {ops: []op{{put: "a", size: 4}, {put: "b", size: 4}, {get: "a", use: true}, {put: "c", size: 4}}, keys: []string{"a", "c"}, bytes: 8},
		"a second chance, once":        {ops: []op{{put: "a", size: 4}, {put: "b", size: 4}, {get: "a", use: true}, {put: "c", size: 4}, {put: "d", size: 4}, {put: "e", size: 4}}, keys: []string{"e", "d"}, bytes: 8},
		"used twice, one chance":       {ops: []op{{put: "a", size: 4}, {put: "b", size: 4}, {get: "a", use: true}, {get: "a", use: true}, {put: "c", size: 4}, {put: "d", size: 4}}, keys: []string{"d", "a"}, bytes: 8},
		"all used, the new one kept":   {ops: []op{{put: "a", size: 4}, {put: "b", size: 4}, {get: "a", use: true}, {get: "b", use: true}, {put: "c", size: 4}}, keys: []string{"c", "b"}, bytes: 8},
		"all used, the oldest evicted": {ops: []op{{put: "a", size: 3}, {put: "b", size: 3}, {put: "c", size: 3}, {get: "c", use: true}, {get: "a", use: true}, {get: "b", use: true}, {put: "d", size: 3}}, keys: []string{"d", "c", "b"}, bytes: 9},
		"a get that does not use":      {ops: []op{{put: "a", size: 4}, {put: "b", size: 4}, {get: "a"}, {put: "c", size: 4}}, keys: []string{"c", "b"}, bytes: 8},
		"a key put again replaces":     {ops: []op{{put: "a", size: 4}, {put: "b", size: 4}, {put: "a", size: 6}}, keys: []string{"a", "b"}, bytes: 10},
		"several evicted for one":      {ops: []op{{put: "a", size: 3}, {put: "b", size: 3}, {put: "c", size: 3}, {put: "d", size: 9}}, keys: []string{"d"}, bytes: 9},
		"one over the budget, dropped": {ops: []op{{put: "a", size: 3}, {put: "b", size: 11}}, keys: nil, bytes: 0},
		"a get of a missing key":       {ops: []op{{get: "x", use: true}, {put: "a", size: 1}}, keys: []string{"a"}, bytes: 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := newByteLRU[string, int](10)
			for i, o := range tc.ops {
				if o.put != "" {
					c.put(o.put, i, o.size)
					continue
				}
				c.get(o.get, o.use)
			}
			var keys []string
			for e := c.root.next; e != &c.root; e = e.next {
				keys = append(keys, e.key)
				if v, ok := c.get(e.key, false); !ok || v != e.val {
					t.Fatalf("%q in the list is not in the map", e.key)
				}
			}
			if !slices.Equal(keys, tc.keys) || len(c.m) != len(keys) || c.bytes != tc.bytes {
				t.Fatalf("kept %q (map %d), %d bytes; want %q, %d bytes", keys, len(c.m), c.bytes, tc.keys, tc.bytes)
			}
		})
	}
}

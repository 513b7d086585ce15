package jinja

import "testing"

// TestNewInt: every integer, boxed once or not, is itself, and one below 4096 costs no
// allocation.
func TestNewInt(t *testing.T) {
	for _, n := range []int64{0, 1, 255, 256, 680, 4095, 4096, -1, -4096, 1 << 40} {
		v := NewInt(n)
		if !v.IsInt() || v.AsInt() != n || !same(v, NewInt(n)) || v.String() != NewInt(n).String() {
			t.Fatalf("NewInt(%d) = %v", n, v)
		}
	}
	var sink Value
	if allocs := testing.AllocsPerRun(100, func() { sink = NewInt(intBelow) }); allocs != 0 {
		t.Fatalf("NewInt(%d) allocates %v times", intBelow, allocs)
	}
	if allocs := testing.AllocsPerRun(100, func() { sink = NewInt(intAbove) }); allocs != 1 {
		t.Fatalf("NewInt(%d) allocates %v times: the test no longer tells", intAbove, allocs)
	}
	_ = sink
}

// Variables, not constants: a constant's interface is made at compile time.
var intBelow, intAbove int64 = 3000, 5000

package conn

import (
	"testing"
	"time"
)

// TestIdleTrim: memory is returned once per stretch of load, after idleTrimAfter without a
// request in flight or started, never while one runs, and not again while nothing new came.
func TestIdleTrim(t *testing.T) {
	frees := 0
	tr := &IdleTrim{free: func() { frees++ }}
	st := tr.stepper(time.Second)
	need := int(idleTrimAfter / time.Second)
	tick := func(n int) (trims int) {
		for range n {
			if st.step() {
				trims++
			}
		}
		return trims
	}
	if n := tick(2 * need); n != 0 {
		t.Fatalf("%d trims while idle from the start, with nothing served", n)
	}
	tr.Begin()
	if n := tick(2 * need); n != 0 {
		t.Fatalf("%d trims while a request is in flight", n)
	}
	tr.End()
	if n := tick(need - 1); n != 0 { // the first of these sees the request ended
		t.Fatalf("%d trims before the server was idle for %s", n, idleTrimAfter)
	}
	if n := tick(1); n != 1 {
		t.Fatalf("%d trims after %s idle, want 1", n, idleTrimAfter)
	}
	if n := tick(3 * need); n != 0 {
		t.Fatalf("%d more trims while still idle", n)
	}
	tr.Begin()
	tr.End()
	if n := tick(need + 1); n != 1 { // a new stretch of load: one more
		t.Fatalf("%d trims after a new stretch of load, want 1", n)
	}
	if frees != 2 {
		t.Fatalf("free called %d times, want 2", frees)
	}
}

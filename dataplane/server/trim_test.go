package server

import (
	"context"
	"testing"
	"time"
)

// TestIdleTrim: memory is returned once per stretch of load, after idleTrimAfter without a
// request in flight or started, never while one runs, and not again while nothing new came.
func TestIdleTrim(t *testing.T) {
	frees := make(chan struct{}, 10)
	tr := &idleTrim{free: func() { frees <- struct{}{} }}
	ticks := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { tr.run(ctx, ticks, time.Second); close(done) }()
	need := int(idleTrimAfter / time.Second)
	tick := func(n int) {
		for range n {
			ticks <- time.Time{}
		}
	}
	tick(2 * need) // idle from the start, nothing served: nothing to give back
	tr.begin()
	tick(2 * need) // a long request in flight
	tr.end()
	tick(need - 1) // idle, not yet for idleTrimAfter
	if len(frees) != 0 {
		t.Fatalf("%d trims before the server was idle for %s", len(frees), idleTrimAfter)
	}
	tick(1) // idleTrimAfter idle: the trim
	if len(frees) != 1 {
		t.Fatalf("%d trims after %s idle, want 1", len(frees), idleTrimAfter)
	}
	tick(3 * need) // still idle: no second trim
	tr.begin()
	tr.end()
	tick(need + 1) // a new stretch of load: one more trim
	cancel()
	<-done
	if len(frees) != 2 {
		t.Fatalf("%d trims, want one per stretch of load (2)", len(frees))
	}
}

package server

import (
	"context"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// idleTrimAfter is how long the server must have been idle before it returns memory to the OS.
const idleTrimAfter = 5 * time.Second

// idleTrim gives back what a burst of load left behind once the server falls idle. Go keeps a
// freed heap (and sync.Pool keeps the buffers of the last burst) until later collections, which
// an idle process hardly runs, and the scavenger returns pages slowly: without a trim the
// resident set of a coordinator that served a peak stays near the peak long after it.
type idleTrim struct {
	inflight atomic.Int64
	served   atomic.Uint64
	// free returns memory to the OS (freeMemory; a test counts the calls).
	free func()
}

// begin and end bracket a request.
func (t *idleTrim) begin() { t.inflight.Add(1); t.served.Add(1) }
func (t *idleTrim) end()   { t.inflight.Add(-1) }

// run trims once after every stretch of load: when no request was in flight or started for
// idleTrimAfter's worth of ticks since the last one that served something. It returns when ctx
// ends.
func (t *idleTrim) run(ctx context.Context, ticks <-chan time.Time, perTick time.Duration) {
	need := int(idleTrimAfter / perTick)
	idle, seen, trimmed := 0, t.served.Load(), t.served.Load()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
		}
		served := t.served.Load()
		if t.inflight.Load() != 0 || served != seen {
			idle, seen = 0, served
			continue
		}
		if idle++; idle >= need && served != trimmed {
			t.free()
			trimmed = served
		}
	}
}

// freeMemory collects twice, so that the sync.Pools (whose contents survive one collection in
// their victim caches) are emptied, and returns the freed pages to the OS.
func freeMemory() {
	runtime.GC()
	debug.FreeOSMemory()
}

func newIdleTrim() *idleTrim { return &idleTrim{free: freeMemory} }

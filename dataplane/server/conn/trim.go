package conn

import (
	"context"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// idleTrimAfter is how long the server must have been idle before it returns memory to the OS.
const idleTrimAfter = 5 * time.Second

// IdleTrim gives back what a burst of load left behind once the server falls idle. Go keeps a
// freed heap (and sync.Pool keeps the buffers of the last burst) until later collections, which
// an idle process hardly runs, and the scavenger returns pages slowly: without a trim the
// resident set of a coordinator that served a peak stays near the peak long after it.
type IdleTrim struct {
	inflight atomic.Int64
	served   atomic.Uint64
	// free returns memory to the OS (freeMemory; a test counts the calls).
	free func()
}

// Begin counts a request in.
func (t *IdleTrim) Begin() { t.inflight.Add(1); t.served.Add(1) }

// End counts a request out.
func (t *IdleTrim) End() { t.inflight.Add(-1) }

// Run calls step every tick until ctx ends.
func (t *IdleTrim) Run(ctx context.Context, ticks <-chan time.Time, perTick time.Duration) {
	st := t.stepper(perTick)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
			st.step()
		}
	}
}

// stepper starts counting idle ticks of perTick from now.
func (t *IdleTrim) stepper(perTick time.Duration) *trimStep {
	served := t.served.Load()
	return &trimStep{t: t, need: int(idleTrimAfter / perTick), seen: served, trimmed: served}
}

// trimStep is the state of run between ticks.
type trimStep struct {
	t             *IdleTrim
	need, idle    int
	seen, trimmed uint64
}

// step counts one tick and trims once after every stretch of load: when no request was in
// flight or started for idleTrimAfter's worth of ticks since the last one that served
// something. It reports whether it trimmed.
func (s *trimStep) step() bool {
	served := s.t.served.Load()
	if s.t.inflight.Load() != 0 || served != s.seen {
		s.idle, s.seen = 0, served
		return false
	}
	if s.idle++; s.idle >= s.need && served != s.trimmed {
		s.t.free()
		s.trimmed = served
		return true
	}
	return false
}

// freeMemory collects twice, so that the sync.Pools (whose contents survive one collection in
// their victim caches) are emptied, and returns the freed pages to the OS.
func freeMemory() {
	runtime.GC()
	debug.FreeOSMemory()
}

// NewIdleTrim is a trim that returns memory with the runtime's debug.FreeOSMemory.
func NewIdleTrim() *IdleTrim { return &IdleTrim{free: freeMemory} }

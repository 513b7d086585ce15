// Package heap weighs what a structure keeps on the Go heap, for tests of memory bounds.
package heap

import "runtime"

// Live is the bytes of the heap's live objects after two collections: what a structure keeps is
// the difference of two calls, one before it is made and one after it is filled (kept alive
// past the second with runtime.KeepAlive). One collection is not enough: it moves what
// sync.Pools hold to their victim caches, freed only by the next, and frees an object whose
// cleanup or finalizer runs only then, so one call could count what the call after it does not
// (TestHistoryHeld once weighed a model without caches at -1.3 MB).
func Live() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

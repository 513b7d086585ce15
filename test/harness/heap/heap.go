// Package heap weighs what a structure keeps on the Go heap, for tests of memory bounds.
package heap

import "runtime"

// Live is the bytes of the heap's live objects after a collection: what a structure keeps is
// the difference of two calls, one before it is made and one after it is filled (kept alive
// past the second with runtime.KeepAlive).
func Live() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

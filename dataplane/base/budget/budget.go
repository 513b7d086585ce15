// Package budget counts the bytes that requests in flight hold of a process-wide budget: the
// media that replace-media-urls downloads and inlines, the answers that force_stream folds. A
// process makes one Bytes per budget and hands it to every step it builds, so that the count
// outlives pipeline reloads; each step checks a reservation against its own limit.
package budget

import "sync/atomic"

// Bytes is a count of bytes held process-wide. The zero value is an empty budget; it is safe for
// concurrent use.
type Bytes struct {
	held atomic.Int64
}

// Reserve takes n bytes when that leaves at most limit held, and reports whether it did.
func (b *Bytes) Reserve(n, limit int64) bool {
	for {
		cur := b.held.Load()
		if cur+n > limit {
			return false
		}
		if b.held.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// Release gives back n reserved bytes.
func (b *Bytes) Release(n int64) { b.held.Add(-n) }

// Held is the bytes reserved now.
func (b *Bytes) Held() int64 { return b.held.Load() }

package chattemplate

import (
	"sync"
	"sync/atomic"

	"github.com/epd-dev/coordinator/dataplane/render/jinja"
)

// IterationCache is a bounded, concurrency-safe jinja.Memo, for Options.Iterations: what each
// iteration of a template's loop over a conversation's messages read, wrote and output, so that
// the conversation's next turn replays the iterations whose reads are unchanged (every earlier
// message, as a rule) instead of running them. It is used with a MessageCache, whose shared
// message values make an iteration's item the same value turn after turn.
type IterationCache struct {
	mu      sync.Mutex
	entries byteLRU[jinja.IterationKey, *jinja.Iteration]

	replayed, ran atomic.Uint64
}

// iterationOverhead approximates an entry's bookkeeping besides its Size.
const iterationOverhead = 160

// NewIterationCache returns a cache that holds at most about maxBytes (the iterations' output,
// their reads and writes, bookkeeping).
func NewIterationCache(maxBytes int64) *IterationCache {
	return &IterationCache{entries: newByteLRU[jinja.IterationKey, *jinja.Iteration](maxBytes)}
}

// Iterations implements jinja.Memo, under one lock.
func (c *IterationCache) Iterations(loop *jinja.Loop, items []jinja.Value, found []*jinja.Iteration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, item := range items {
		found[i] = nil
		if item.IsDict() {
			found[i], _ = c.entries.get(jinja.IterationKey{Loop: loop, Item: item.AsDict()}, true)
		}
	}
}

// Keep implements jinja.Memo: an iteration over an eighth of the cache is not kept.
func (c *IterationCache) Keep(key jinja.IterationKey, it *jinja.Iteration) {
	size := it.Size(c.entries.maxBytes/maxEntryShare) + iterationOverhead
	if !c.entries.fits(size) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries.put(key, it, size)
}

// count adds a render's iterations to the cache's counts.
func (c *IterationCache) count(s *jinja.MemoStats) {
	c.replayed.Add(uint64(s.Replayed))
	c.ran.Add(uint64(s.Kept + s.NotKept))
}

// Stats returns the iterations replayed and those run, and the bytes held.
func (c *IterationCache) Stats() (replayed, ran uint64, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.replayed.Load(), c.ran.Load(), c.entries.bytes
}

package chattemplate

import (
	"container/list"
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
	maxBytes int64

	mu    sync.Mutex
	m     map[jinja.IterationKey]*list.Element // of *iterationEntry
	lru   list.List                            // the most recently used first
	bytes int64

	replayed, ran atomic.Uint64
}

type iterationEntry struct {
	key  jinja.IterationKey
	it   *jinja.Iteration
	size int64
}

// iterationOverhead approximates an entry's bookkeeping besides its Size.
const iterationOverhead = 160

// NewIterationCache returns a cache that holds at most about maxBytes (the iterations' output,
// their reads and writes, bookkeeping).
func NewIterationCache(maxBytes int64) *IterationCache {
	return &IterationCache{maxBytes: maxBytes, m: map[jinja.IterationKey]*list.Element{}}
}

// Iteration implements jinja.Memo.
func (c *IterationCache) Iteration(key jinja.IterationKey) *jinja.Iteration {
	c.mu.Lock()
	defer c.mu.Unlock()
	el := c.m[key]
	if el == nil {
		return nil
	}
	c.lru.MoveToFront(el)
	return el.Value.(*iterationEntry).it
}

// Keep implements jinja.Memo: an iteration over an eighth of the cache is not kept.
func (c *IterationCache) Keep(key jinja.IterationKey, it *jinja.Iteration) {
	e := &iterationEntry{key: key, it: it, size: it.Size() + iterationOverhead}
	if e.size > c.maxBytes/maxEntryShare {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.m[key]; old != nil {
		c.remove(old)
	}
	c.m[key] = c.lru.PushFront(e)
	c.bytes += e.size
	for c.bytes > c.maxBytes {
		c.remove(c.lru.Back())
	}
}

func (c *IterationCache) remove(el *list.Element) {
	e := c.lru.Remove(el).(*iterationEntry)
	delete(c.m, e.key)
	c.bytes -= e.size
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
	return c.replayed.Load(), c.ran.Load(), c.bytes
}

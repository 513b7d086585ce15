package tokenizer

import (
	"strings"
	"sync"
	"sync/atomic"
)

// SegmentCache is a bounded, concurrency-safe cache of encoded segments keyed by their content
// (multi-turn conversations re-send their history: each earlier message is a segment between special tokens).
// It evicts the least recently used segments past its byte budget. One cache may serve several
// tokenizers: entries are keyed by tokenizer too.
type SegmentCache struct {
	maxBytes   int64
	minSegment int

	mu      sync.Mutex
	entries map[segKey]*segEntry
	lru     segEntry // sentinel: lru.next is the most recently used
	bytes   int64

	hits, misses atomic.Uint64
}

type segKey struct {
	tok  uint64
	text string
}

type segEntry struct {
	key        segKey
	ids        []int32
	size       int64
	prev, next *segEntry
}

// maxEntryShare is the least number of entries the cache has room for: a segment over
// maxBytes/maxEntryShare is not cached.
const maxEntryShare = 8

// segOverhead approximates an entry's bookkeeping (map slot, entry, slice and string headers).
const segOverhead = 128

// NewSegmentCache returns a cache holding at most maxBytes (segment text plus 4 bytes an id plus
// bookkeeping) of segments at least minSegmentBytes long.
func NewSegmentCache(maxBytes int64, minSegmentBytes int) *SegmentCache {
	c := &SegmentCache{maxBytes: maxBytes, minSegment: max(minSegmentBytes, 1), entries: map[segKey]*segEntry{}}
	c.lru.next, c.lru.prev = &c.lru, &c.lru
	return c
}

// Stats returns the lookups that hit and missed, and the bytes held (for metrics and tests).
func (c *SegmentCache) Stats() (hits, misses uint64, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits.Load(), c.misses.Load(), c.bytes
}

func (c *SegmentCache) get(tok uint64, text string) ([]int32, bool) {
	c.mu.Lock()
	e, ok := c.entries[segKey{tok, text}]
	if ok {
		c.unlink(e)
		c.pushFront(e)
	}
	c.mu.Unlock()
	if !ok {
		c.misses.Add(1)
		return nil, false
	}
	c.hits.Add(1)
	return e.ids, true // never modified once stored
}

func (c *SegmentCache) put(tok uint64, text string, ids []int) {
	size := int64(len(text)) + 4*int64(len(ids)) + segOverhead
	if size > c.maxBytes/maxEntryShare {
		return // one long segment would evict the conversations the cache is for, for a copy of itself
	}
	e := &segEntry{key: segKey{tok, strings.Clone(text)}, ids: make([]int32, len(ids)), size: size}
	for i, id := range ids {
		e.ids[i] = int32(id)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.entries[e.key]; ok {
		c.unlink(old)
		c.bytes -= old.size
	}
	c.entries[e.key] = e
	c.pushFront(e)
	c.bytes += size
	for c.bytes > c.maxBytes {
		last := c.lru.prev
		c.unlink(last)
		delete(c.entries, last.key)
		c.bytes -= last.size
	}
}

func (c *SegmentCache) unlink(e *segEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
}

func (c *SegmentCache) pushFront(e *segEntry) {
	e.prev, e.next = &c.lru, c.lru.next
	c.lru.next.prev = e
	c.lru.next = e
}

package tokenizer

import (
	"hash/maphash"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"
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

	// seen, when not nil, admits a segment the second time it is encoded: each slot holds the
	// hash of the last segment encoded once whose hash falls in it (a doorkeeper).
	seen []atomic.Uint64
	seed maphash.Seed
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

// segOverhead approximates an entry's bookkeeping: the entry (80 bytes) and its map slot, with
// the map's room to grow and the slots its evictions leave deleted until it is rehashed
// (TestSegmentCacheHeld measures the whole on the heap).
const segOverhead = 256

// NewSegmentCache returns a cache holding at most maxBytes (segment text plus 4 bytes an id plus
// bookkeeping) of segments at least minSegmentBytes long.
func NewSegmentCache(maxBytes int64, minSegmentBytes int) *SegmentCache {
	c := &SegmentCache{maxBytes: maxBytes, minSegment: max(minSegmentBytes, 1), entries: map[segKey]*segEntry{}}
	c.lru.next, c.lru.prev = &c.lru, &c.lru
	return c
}

// A doorkeeper has a slot (8 bytes) for each seenBytesPerSlot of the cache's budget, a power of
// two, at least one and at most maxSeenSlots.
const (
	seenBytesPerSlot = 4 << 10
	maxSeenSlots     = 1 << 16
)

// AdmitOnSecondSight makes c keep a segment only when it is encoded the second time (seen within
// a fixed number of slots, a hash each, taken from c's budget: 8 bytes for each 4 KiB, at most
// 512 KiB). Where a conversation's next turn finds its history elsewhere (the rendered-history
// cache), a segment encoded once is most often one of its own new messages, which no later turn
// looks up here: not keeping it saves copying it into the cache each turn, and keeps a client's
// one-off segments from evicting those encoded again (a system prompt or a document several
// conversations send). Call it before c is used.
func (c *SegmentCache) AdmitOnSecondSight() {
	n := 1
	if per := uint64(c.maxBytes / seenBytesPerSlot); per > 1 {
		n = min(maxSeenSlots, 1<<(bits.Len64(per)-1))
	}
	c.seen = make([]atomic.Uint64, n)
	c.seed = maphash.MakeSeed()
	c.maxBytes -= int64(8 * n)
}

// secondSight reports whether the segment text of tokenizer tok was encoded before (as far as
// c's slots remember), and notes it.
func (c *SegmentCache) secondSight(tok uint64, text string) bool {
	h := maphash.String(c.seed, text) ^ tok*0x9e3779b97f4a7c15 | 1 // 0 is an empty slot
	slot := &c.seen[h>>1&uint64(len(c.seen)-1)]
	if slot.Load() == h {
		return true
	}
	slot.Store(h)
	return false
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
	if int64(len(text))+4*int64(len(ids))+segOverhead > c.maxBytes/maxEntryShare {
		return // one long segment would evict the conversations the cache is for, for a copy of itself
	}
	if c.seen != nil && !c.secondSight(tok, text) {
		return
	}
	// The text and ids in arrays of the allocations' sizes (Go rounds an allocation up to a size
	// class): what they keep is what is counted.
	copied := append(slices.Grow([]byte(nil), len(text)), text...)
	e := &segEntry{key: segKey{tok, unsafe.String(unsafe.SliceData(copied), len(copied))}, ids: slices.Grow([]int32(nil), len(ids))[:len(ids)]}
	for i, id := range ids {
		e.ids[i] = int32(id)
	}
	e.size = int64(cap(copied)) + 4*int64(cap(e.ids)) + segOverhead
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.entries[e.key]; ok {
		c.unlink(old)
		c.bytes -= old.size
	}
	c.entries[e.key] = e
	c.pushFront(e)
	c.bytes += e.size
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

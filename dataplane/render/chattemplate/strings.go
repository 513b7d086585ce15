package chattemplate

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// StringCache is a bounded, concurrency-safe cache of decoded JSON strings, for Options.Strings.
// A multi-turn client sends every earlier message again with each turn, and decoding a long
// message (unescaping it into a string of its own) costs about as much as the rest of its
// render's passes over it; with the cache, each long string is decoded once.
//
// Only strings that need decoding are kept (those with escapes, or with bytes that are not
// UTF-8: a plain string shares the request's memory and costs nothing), and only long ones
// (minCachedString). The key is a seeded hash of the string's JSON text, and a string found is
// compared byte for byte with the one kept before its text is used: a collision, or a flood of
// them, costs a miss, never another string. What is shared is a Go string, which nothing can
// change: a template that changes a list or a dict (append, pop, update) changes its own
// render's, never a cached value.
type StringCache struct {
	maxBytes int64
	seed     maphash.Seed

	mu    sync.Mutex
	m     map[uint64]*stringEntry
	lru   stringEntry // sentinel: lru.next is the most recently used
	bytes int64

	hits, misses atomic.Uint64
}

// stringEntry is one decoded string: raw, its JSON text (quotes included), and text, what it
// stands for.
type stringEntry struct {
	key        uint64
	raw, text  string
	prev, next *stringEntry
}

const (
	// minCachedString is the shortest JSON string (quotes included) worth keeping: a shorter
	// one decodes in about as long as its look-up takes.
	minCachedString = 256
	// stringOverhead approximates an entry's bookkeeping (the entry and its map slot).
	stringOverhead = 96
	// maxStringShare is the least number of entries the cache has room for: a string over
	// maxBytes/maxStringShare is not kept.
	maxStringShare = 8
)

// NewStringCache returns a cache that holds at most maxBytes (texts and bookkeeping).
func NewStringCache(maxBytes int64) *StringCache {
	c := &StringCache{maxBytes: maxBytes, seed: maphash.MakeSeed(), m: map[uint64]*stringEntry{}}
	c.lru.next, c.lru.prev = &c.lru, &c.lru
	return c
}

// Stats returns the look-ups that found their string and those that did not, and the bytes held.
func (c *StringCache) Stats() (hits, misses uint64, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits.Load(), c.misses.Load(), c.bytes
}

// get returns the text of the JSON string raw, when kept, and raw's key.
func (c *StringCache) get(raw []byte) (string, uint64, bool) {
	key := maphash.Bytes(c.seed, raw)
	c.mu.Lock()
	e := c.m[key]
	if e != nil && e.raw == string(raw) {
		c.unlink(e)
		c.pushFront(e)
		c.mu.Unlock()
		c.hits.Add(1)
		return e.text, key, true
	}
	c.mu.Unlock()
	c.misses.Add(1)
	return "", key, false
}

// put keeps text, what the JSON string raw (its key: get's) stands for; raw is copied.
func (c *StringCache) put(key uint64, raw []byte, text string) {
	size := int64(len(raw)+len(text)) + stringOverhead
	if size > c.maxBytes/maxStringShare {
		return
	}
	e := &stringEntry{key: key, raw: string(raw), text: text}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.m[key]; old != nil {
		c.remove(old)
	}
	c.m[key] = e
	c.pushFront(e)
	c.bytes += size
	for c.bytes > c.maxBytes {
		c.remove(c.lru.prev)
	}
}

// remove takes e out.
func (c *StringCache) remove(e *stringEntry) {
	delete(c.m, e.key)
	c.unlink(e)
	c.bytes -= int64(len(e.raw)+len(e.text)) + stringOverhead
}

func (c *StringCache) unlink(e *stringEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
}

func (c *StringCache) pushFront(e *stringEntry) {
	e.prev, e.next = &c.lru, c.lru.next
	c.lru.next.prev = e
	c.lru.next = e
}

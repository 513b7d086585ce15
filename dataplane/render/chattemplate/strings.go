package chattemplate

import (
	"container/list"
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
	m     map[uint64]*list.Element // of *stringEntry
	lru   list.List                // the most recently used first
	bytes int64

	hits, misses atomic.Uint64
}

// stringEntry is one decoded string: raw, its JSON text (quotes included), and text, what it
// stands for.
type stringEntry struct {
	key       uint64
	raw, text string
}

// size is what e holds.
func (e *stringEntry) size() int64 { return int64(len(e.raw)+len(e.text)) + stringOverhead }

const (
	// minCachedString is the shortest JSON string (quotes included) worth keeping: a shorter
	// one decodes in about as long as its look-up takes.
	minCachedString = 256
	// stringOverhead approximates an entry's bookkeeping (the entry, its list element and its map
	// slot).
	stringOverhead = 144
	// maxStringShare is the least number of entries the cache has room for: a string over
	// maxBytes/maxStringShare is not kept.
	maxStringShare = 8
)

// NewStringCache returns a cache that holds at most maxBytes (texts and bookkeeping).
func NewStringCache(maxBytes int64) *StringCache {
	return &StringCache{maxBytes: maxBytes, seed: maphash.MakeSeed(), m: map[uint64]*list.Element{}}
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
	if el := c.m[key]; el != nil {
		if e := el.Value.(*stringEntry); e.raw == string(raw) {
			c.lru.MoveToFront(el)
			c.mu.Unlock()
			c.hits.Add(1)
			return e.text, key, true
		}
	}
	c.mu.Unlock()
	c.misses.Add(1)
	return "", key, false
}

// put keeps text, what the JSON string raw (its key: get's) stands for; raw is copied.
func (c *StringCache) put(key uint64, raw []byte, text string) {
	e := &stringEntry{key: key, text: text}
	if e.size()+int64(len(raw)) > c.maxBytes/maxStringShare {
		return
	}
	e.raw = string(raw)
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.m[key]; old != nil {
		c.remove(old)
	}
	c.m[key] = c.lru.PushFront(e)
	c.bytes += e.size()
	for c.bytes > c.maxBytes {
		c.remove(c.lru.Back())
	}
}

// remove takes el's entry out.
func (c *StringCache) remove(el *list.Element) {
	e := c.lru.Remove(el).(*stringEntry)
	delete(c.m, e.key)
	c.bytes -= e.size()
}

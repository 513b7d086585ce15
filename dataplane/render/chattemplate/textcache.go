package chattemplate

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// textCache is a bounded, concurrency-safe LRU of values decoded from JSON text. The key is a
// seeded hash of the text, and a value found is used only after its text is compared byte for
// byte with the one looked up: a collision, or a flood of them, costs a miss, never another
// text's value. So what one client is answered from the cache is what its own bytes decode to.
type textCache[V any] struct {
	seed maphash.Seed

	mu      sync.Mutex
	entries byteLRU[uint64, textEntry[V]]

	hits, misses atomic.Uint64
}

// textEntry is one decoded text: raw, the JSON text, and val, what it decodes to.
type textEntry[V any] struct {
	raw string
	val V
}

func newTextCache[V any](maxBytes int64) textCache[V] {
	return textCache[V]{seed: maphash.MakeSeed(), entries: newByteLRU[uint64, textEntry[V]](maxBytes)}
}

// Stats returns the look-ups that found their text and those that did not, and the bytes held.
func (c *textCache[V]) Stats() (hits, misses uint64, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits.Load(), c.misses.Load(), c.entries.bytes
}

// get returns what the JSON text raw decodes to, when kept, and raw's key, counted.
func (c *textCache[V]) get(raw []byte) (V, uint64, bool) {
	v, key, ok := c.find(raw)
	c.count(ok)
	return v, key, ok
}

// find is get, not counted.
func (c *textCache[V]) find(raw []byte) (V, uint64, bool) {
	key := maphash.Bytes(c.seed, raw)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries.get(key, true); ok && e.raw == string(raw) {
		return e.val, key, true
	}
	var zero V
	return zero, key, false
}

// count counts a look-up that found its text (hit) or did not.
func (c *textCache[V]) count(hit bool) {
	if hit {
		c.hits.Add(1)
	} else {
		c.misses.Add(1)
	}
}

// fits reports whether an entry of size bytes (its JSON text included) may be kept.
func (c *textCache[V]) fits(size int64) bool { return c.entries.fits(size) }

// put keeps val, what the JSON text raw (its key: get's) decodes to, holding size bytes besides
// raw (which is kept as it is: a caller's copy nothing modifies).
func (c *textCache[V]) put(key uint64, raw string, val V, size int64) {
	c.putAll([]textPut[V]{{key, raw, val, size}})
}

// textPut is a put of a textCache's.
type textPut[V any] struct {
	key  uint64
	raw  string
	val  V
	size int64
}

// putAll is put of each of puts, under one lock.
func (c *textCache[V]) putAll(puts []textPut[V]) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range puts {
		if size := p.size + int64(len(p.raw)); c.fits(size) {
			c.entries.put(p.key, textEntry[V]{raw: p.raw, val: p.val}, size)
		}
	}
}

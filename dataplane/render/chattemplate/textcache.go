package chattemplate

import (
	"container/list"
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// textCache is a bounded, concurrency-safe LRU of values decoded from JSON text. The key is a
// seeded hash of the text, and a value found is used only after its text is compared byte for
// byte with the one looked up: a collision, or a flood of them, costs a miss, never another
// text's value. So what one client is answered from the cache is what its own bytes decode to.
type textCache[V any] struct {
	maxBytes int64
	seed     maphash.Seed

	mu    sync.Mutex
	m     map[uint64]*list.Element // of *textEntry[V]
	lru   list.List                // the most recently used first
	bytes int64

	hits, misses atomic.Uint64
}

// textEntry is one decoded text: raw, the JSON text, and val, what it decodes to, which holds
// size bytes besides raw.
type textEntry[V any] struct {
	key  uint64
	raw  string
	val  V
	size int64
}

// maxEntryShare is the least number of entries a cache has room for: an entry over
// maxBytes/maxEntryShare is not kept.
const maxEntryShare = 8

func newTextCache[V any](maxBytes int64) textCache[V] {
	return textCache[V]{maxBytes: maxBytes, seed: maphash.MakeSeed(), m: map[uint64]*list.Element{}}
}

// Stats returns the look-ups that found their text and those that did not, and the bytes held.
func (c *textCache[V]) Stats() (hits, misses uint64, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits.Load(), c.misses.Load(), c.bytes
}

// get returns what the JSON text raw decodes to, when kept, and raw's key.
func (c *textCache[V]) get(raw []byte) (V, uint64, bool) {
	key := maphash.Bytes(c.seed, raw)
	c.mu.Lock()
	if el := c.m[key]; el != nil {
		if e := el.Value.(*textEntry[V]); e.raw == string(raw) {
			c.lru.MoveToFront(el)
			c.mu.Unlock()
			c.hits.Add(1)
			return e.val, key, true
		}
	}
	c.mu.Unlock()
	c.misses.Add(1)
	var zero V
	return zero, key, false
}

// has reports whether the JSON text raw is kept (not counted as a look-up, nor as a use).
func (c *textCache[V]) has(raw []byte) bool {
	key := maphash.Bytes(c.seed, raw)
	c.mu.Lock()
	defer c.mu.Unlock()
	el := c.m[key]
	return el != nil && el.Value.(*textEntry[V]).raw == string(raw)
}

// fits reports whether an entry of size bytes (its JSON text included) may be kept.
func (c *textCache[V]) fits(size int64) bool { return size <= c.maxBytes/maxEntryShare }

// put keeps val, what the JSON text raw (its key: get's) decodes to, holding size bytes besides
// raw; raw is copied.
func (c *textCache[V]) put(key uint64, raw []byte, val V, size int64) {
	e := &textEntry[V]{key: key, val: val, size: size + int64(len(raw))}
	if !c.fits(e.size) {
		return
	}
	e.raw = string(raw)
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

// remove takes el's entry out.
func (c *textCache[V]) remove(el *list.Element) {
	e := c.lru.Remove(el).(*textEntry[V])
	delete(c.m, e.key)
	c.bytes -= e.size
}

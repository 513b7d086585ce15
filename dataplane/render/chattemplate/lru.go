package chattemplate

import "container/list"

// byteLRU is a map whose entries hold a known number of bytes, evicting the least recently used
// past its budget. Its owner locks around it.
type byteLRU[K comparable, V any] struct {
	maxBytes int64
	m        map[K]*list.Element // of *lruEntry[K, V]
	order    list.List           // the most recently used first
	bytes    int64
}

type lruEntry[K comparable, V any] struct {
	key  K
	val  V
	size int64
}

// maxEntryShare is the least number of entries a byteLRU has room for: its owners keep no entry
// over maxBytes/maxEntryShare (fits).
const maxEntryShare = 8

// fits reports whether an entry of size bytes may be kept.
func (c *byteLRU[K, V]) fits(size int64) bool { return size <= c.maxBytes/maxEntryShare }

func newByteLRU[K comparable, V any](maxBytes int64) byteLRU[K, V] {
	return byteLRU[K, V]{maxBytes: maxBytes, m: map[K]*list.Element{}}
}

// get returns key's value, when kept, and makes it the most recently used if use.
func (c *byteLRU[K, V]) get(key K, use bool) (V, bool) {
	el := c.m[key]
	if el == nil {
		var zero V
		return zero, false
	}
	if use {
		c.order.MoveToFront(el)
	}
	return el.Value.(*lruEntry[K, V]).val, true
}

// put keeps val under key (replacing what was), holding size bytes, and evicts past the budget.
func (c *byteLRU[K, V]) put(key K, val V, size int64) {
	if old := c.m[key]; old != nil {
		c.remove(old)
	}
	c.m[key] = c.order.PushFront(&lruEntry[K, V]{key, val, size})
	c.bytes += size
	for c.bytes > c.maxBytes {
		c.remove(c.order.Back())
	}
}

func (c *byteLRU[K, V]) remove(el *list.Element) {
	e := c.order.Remove(el).(*lruEntry[K, V])
	delete(c.m, e.key)
	c.bytes -= e.size
}

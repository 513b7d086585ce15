package chattemplate

// byteLRU is a map whose entries hold a known number of bytes, evicting the least recently used
// past its budget. Its owner locks around it, and keeps it where it is once used (its list's
// ends point into it).
type byteLRU[K comparable, V any] struct {
	maxBytes int64
	m        map[K]*lruEntry[K, V]
	root     lruEntry[K, V] // the list's sentinel: root.next is the most recently used
	bytes    int64
}

type lruEntry[K comparable, V any] struct {
	key        K
	val        V
	size       int64
	prev, next *lruEntry[K, V]
}

// maxEntryShare is the least number of entries a byteLRU has room for: its owners keep no entry
// over maxBytes/maxEntryShare (fits).
const maxEntryShare = 8

// fits reports whether an entry of size bytes may be kept.
func (c *byteLRU[K, V]) fits(size int64) bool { return size <= c.maxBytes/maxEntryShare }

func newByteLRU[K comparable, V any](maxBytes int64) byteLRU[K, V] {
	return byteLRU[K, V]{maxBytes: maxBytes, m: map[K]*lruEntry[K, V]{}}
}

// get returns key's value, when kept, and makes it the most recently used if use.
func (c *byteLRU[K, V]) get(key K, use bool) (V, bool) {
	e := c.m[key]
	if e == nil {
		var zero V
		return zero, false
	}
	if use {
		c.unlink(e)
		c.pushFront(e)
	}
	return e.val, true
}

// put keeps val under key (replacing what was), holding size bytes, and evicts past the budget.
func (c *byteLRU[K, V]) put(key K, val V, size int64) {
	if c.root.next == nil {
		c.root.next, c.root.prev = &c.root, &c.root
	}
	if old := c.m[key]; old != nil {
		c.remove(old)
	}
	e := &lruEntry[K, V]{key: key, val: val, size: size}
	c.m[key] = e
	c.pushFront(e)
	c.bytes += size
	for c.bytes > c.maxBytes {
		c.remove(c.root.prev)
	}
}

func (c *byteLRU[K, V]) remove(e *lruEntry[K, V]) {
	c.unlink(e)
	delete(c.m, e.key)
	c.bytes -= e.size
}

func (c *byteLRU[K, V]) unlink(e *lruEntry[K, V]) {
	e.prev.next, e.next.prev = e.next, e.prev
}

func (c *byteLRU[K, V]) pushFront(e *lruEntry[K, V]) {
	e.prev, e.next = &c.root, c.root.next
	c.root.next.prev = e
	c.root.next = e
}

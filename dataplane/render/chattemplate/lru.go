package chattemplate

// byteLRU is a map whose entries hold a known number of bytes, evicting past its budget the
// least recently used, as second chance (CLOCK) approximates it: a get that uses an entry only
// marks it, and eviction, from the oldest end, moves a marked entry to the front unmarked
// instead of evicting it. A look-up so writes nothing but the entry it reads: moving the entry
// to the front at each use wrote its two neighbours too, and in a cache that many
// conversations share, they are rarely in the processor's caches (a turn of a conversation of
// many short messages looks up an entry or two a message). Its owner locks around it, and
// keeps it where it is once used (its list's ends point into it).
type byteLRU[K comparable, V any] struct {
	maxBytes int64
	m        map[K]*lruEntry[K, V]
	root     lruEntry[K, V] // the list's sentinel: root.next is the entry last put at the front
	bytes    int64
	removed  func(e *lruEntry[K, V]) // when not nil, called with each entry taken out
}

type lruEntry[K comparable, V any] struct {
	key        K
	val        V
	size       int64
	used       bool // got with use since it was last put at the front
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

// get returns key's value, when kept, and marks it used if use: eviction passes it over once.
func (c *byteLRU[K, V]) get(key K, use bool) (V, bool) {
	e := c.m[key]
	if e == nil {
		var zero V
		return zero, false
	}
	if use && !e.used {
		e.used = true
	}
	return e.val, true
}

// put keeps val under key (replacing what was), holding size bytes, and evicts past the budget;
// it returns the entry, or nil when it was evicted itself.
func (c *byteLRU[K, V]) put(key K, val V, size int64) *lruEntry[K, V] {
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
		// A second chance for a used entry, and for the new one while another is behind it:
		// each is moved once, the lock held, so this ends.
		old := c.root.prev
		if old != e && old.used || old == e && old.prev != &c.root {
			old.used = false
			c.unlink(old)
			c.pushFront(old)
			continue
		}
		c.remove(old)
	}
	if e.next == nil {
		return nil
	}
	return e
}

func (c *byteLRU[K, V]) remove(e *lruEntry[K, V]) {
	c.unlink(e)
	e.prev, e.next = nil, nil
	delete(c.m, e.key)
	c.bytes -= e.size
	if c.removed != nil {
		c.removed(e)
	}
}

func (c *byteLRU[K, V]) unlink(e *lruEntry[K, V]) {
	e.prev.next, e.next.prev = e.next, e.prev
}

func (c *byteLRU[K, V]) pushFront(e *lruEntry[K, V]) {
	e.prev, e.next = &c.root, c.root.next
	c.root.next.prev = e
	c.root.next = e
}

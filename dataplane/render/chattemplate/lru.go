package chattemplate

// lruList is a list of entries holding a known number of bytes, evicting past its budget the
// least recently used, as second chance (CLOCK) approximates it: a use of an entry only marks
// it, and eviction, from the oldest end, moves a marked entry to the front unmarked instead of
// evicting it. A use so writes nothing but the entry it reads: moving the entry to the front at
// each use wrote its two neighbours too, and in a cache that many conversations share, they are
// rarely in the processor's caches (a turn of a conversation of many short messages uses an
// entry or two a message). Its owner finds its entries (byteLRU, by key; IterationCache, from
// the dicts they are kept for), locks around it, and keeps it where it is once used (its ends
// point into it).
type lruList[K comparable, V any] struct {
	maxBytes int64
	root     lruEntry[K, V] // the sentinel: root.next is the entry last put at the front
	bytes    int64
	removed  func(e *lruEntry[K, V]) // when not nil, called with each entry taken out
}

type lruEntry[K comparable, V any] struct {
	key        K
	val        V
	size       int64
	used       bool // used since it was last put at the front
	prev, next *lruEntry[K, V]
}

// maxEntryShare is the least number of entries an lruList has room for: its owners keep no entry
// over maxBytes/maxEntryShare (fits).
const maxEntryShare = 8

// fits reports whether an entry of size bytes may be kept.
func (l *lruList[K, V]) fits(size int64) bool { return size <= l.maxBytes/maxEntryShare }

// use marks e used: eviction passes it over once.
func (l *lruList[K, V]) use(e *lruEntry[K, V]) {
	if !e.used {
		e.used = true
	}
}

// add puts e at the front and evicts past the budget (e itself, when nothing else is left to
// evict).
func (l *lruList[K, V]) add(e *lruEntry[K, V]) {
	if l.root.next == nil {
		l.root.next, l.root.prev = &l.root, &l.root
	}
	l.pushFront(e)
	l.bytes += e.size
	for l.bytes > l.maxBytes {
		// A second chance for a used entry, and for the new one while another is behind it:
		// each is moved once, the lock held, so this ends.
		old := l.root.prev
		if old != e && old.used || old == e && old.prev != &l.root {
			old.used = false
			l.unlink(old)
			l.pushFront(old)
			continue
		}
		l.remove(old)
	}
}

// remove takes e, in the list, out of it.
func (l *lruList[K, V]) remove(e *lruEntry[K, V]) {
	l.unlink(e)
	e.prev, e.next = nil, nil
	l.bytes -= e.size
	if l.removed != nil {
		l.removed(e)
	}
}

func (l *lruList[K, V]) unlink(e *lruEntry[K, V]) {
	e.prev.next, e.next.prev = e.next, e.prev
}

func (l *lruList[K, V]) pushFront(e *lruEntry[K, V]) {
	e.prev, e.next = &l.root, l.root.next
	l.root.next.prev = e
	l.root.next = e
}

// byteLRU is a map whose entries hold a known number of bytes, evicting past its budget as an
// lruList does.
type byteLRU[K comparable, V any] struct {
	lruList[K, V]
	m map[K]*lruEntry[K, V]
}

func newByteLRU[K comparable, V any](maxBytes int64) byteLRU[K, V] {
	m := map[K]*lruEntry[K, V]{}
	return byteLRU[K, V]{lruList: lruList[K, V]{maxBytes: maxBytes, removed: func(e *lruEntry[K, V]) { delete(m, e.key) }}, m: m}
}

// get returns key's value, when kept, and marks it used if use.
func (c *byteLRU[K, V]) get(key K, use bool) (V, bool) {
	e := c.m[key]
	if e == nil {
		var zero V
		return zero, false
	}
	if use {
		c.use(e)
	}
	return e.val, true
}

// put keeps val under key (replacing what was), holding size bytes, and evicts past the budget.
func (c *byteLRU[K, V]) put(key K, val V, size int64) {
	if old := c.m[key]; old != nil {
		c.remove(old)
	}
	e := &lruEntry[K, V]{key: key, val: val, size: size}
	c.m[key] = e
	c.add(e)
}

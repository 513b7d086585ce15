package simworker

import (
	"container/list"
	"sync"
)

// lru is a fixed-capacity, concurrency-safe least-recently-used map.
type lru[K comparable, V any] struct {
	mu    sync.Mutex
	cap   int
	order *list.List // front = most recently used; values are *lruEntry
	items map[K]*list.Element
}

// lruEntry is one key/value pair of an lru.
type lruEntry[K comparable, V any] struct {
	key K
	val V
}

// newLRU returns an empty lru holding at most capacity entries (at least 1).
func newLRU[K comparable, V any](capacity int) *lru[K, V] {
	return &lru[K, V]{cap: max(capacity, 1), order: list.New(), items: map[K]*list.Element{}}
}

// put inserts or refreshes key, evicting the least recently used entry when full.
func (c *lru[K, V]) put(key K, val V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[key]; ok {
		el.Value.(*lruEntry[K, V]).val = val
		c.order.MoveToFront(el)
		return
	}
	c.items[key] = c.order.PushFront(&lruEntry[K, V]{key: key, val: val})
	for c.order.Len() > c.cap {
		oldest := c.order.Back()
		c.order.Remove(oldest)
		delete(c.items, oldest.Value.(*lruEntry[K, V]).key)
	}
}

// get returns the value of key and marks it recently used.
func (c *lru[K, V]) get(key K) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[key]
	if !ok {
		var zero V
		return zero, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*lruEntry[K, V]).val, true
}

// take removes key and returns its value.
func (c *lru[K, V]) take(key K) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[key]
	if !ok {
		var zero V
		return zero, false
	}
	c.order.Remove(el)
	delete(c.items, key)
	return el.Value.(*lruEntry[K, V]).val, true
}

// contains reports whether key is present, marking it recently used.
func (c *lru[K, V]) contains(key K) bool {
	_, ok := c.get(key)
	return ok
}

// len returns the number of entries.
func (c *lru[K, V]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

// clear removes every entry.
func (c *lru[K, V]) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.order.Init()
	clear(c.items)
}

package chattemplate

import (
	"sync"
	"sync/atomic"

	"github.com/epd-dev/coordinator/dataplane/render/jinja"
)

// IterationCache is a bounded, concurrency-safe jinja.Memo, for Options.Iterations: what each
// iteration of a template's loop over a conversation's messages read, wrote and output, so that
// the conversation's next turn replays the iterations whose reads are unchanged (every earlier
// message, as a rule) instead of running them. It is used with a MessageCache, whose shared
// message values make an iteration's item the same value turn after turn.
//
// An iteration is found from its dict (dictLinks), not in a table: a look-up reads what the dict
// the loop holds already links, and keeping an iteration writes no table entry (a table that
// many conversations share is rarely in the processor's caches, and a conversation's first turn
// keeps an iteration for each of its messages and loops, evicting as many).
type IterationCache struct {
	mu      sync.Mutex
	entries lruList[jinja.IterationKey, *jinja.Iteration]

	replayed, ran atomic.Uint64
}

// iterationOverhead approximates an entry's bookkeeping besides its Size (its list entry, its
// share of its dict's links).
const iterationOverhead = 128

// NewIterationCache returns a cache that holds at most about maxBytes (the iterations' output,
// their reads and writes, bookkeeping).
func NewIterationCache(maxBytes int64) *IterationCache {
	c := &IterationCache{entries: lruList[jinja.IterationKey, *jinja.Iteration]{maxBytes: maxBytes}}
	c.entries.removed = c.unlink
	return c
}

// iterationEntry is a kept iteration in the cache's list.
type iterationEntry = lruEntry[jinja.IterationKey, *jinja.Iteration]

// dictLinks are the iterations over a dict the cache keeps, one a loop (jinja.Dict.MemoLink):
// the cache's only way to them besides its list. A dict links one cache's iterations: another
// cache that keeps one of it links the dict anew, and what the first kept of it is no longer
// found (it waits in the first's list to be evicted). A Model's caches share no dict: each has
// its own message cache. Read and written under the cache's lock; cache is set once.
type dictLinks struct {
	cache   *IterationCache
	entries [2]*iterationEntry // Mistral-Nemo's template memoizes two loops over the messages
	more    []*iterationEntry  // a third loop's and on
}

// Iterations implements jinja.Memo, under one lock.
func (c *IterationCache) Iterations(loop *jinja.Loop, items []jinja.Value, found []*jinja.Iteration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, item := range items {
		found[i] = nil
		if !item.IsDict() {
			continue
		}
		if l, _ := item.AsDict().MemoLink().(*dictLinks); l != nil && l.cache == c {
			if slot := l.slot(loop); slot != nil {
				c.entries.use(*slot)
				found[i] = (*slot).val
			}
		}
	}
}

// slot is the slot that links loop's entry, or nil.
func (l *dictLinks) slot(loop *jinja.Loop) **iterationEntry {
	for s, e := range l.entries {
		if e != nil && e.key.Loop == loop {
			return &l.entries[s]
		}
	}
	for s, e := range l.more {
		if e != nil && e.key.Loop == loop {
			return &l.more[s]
		}
	}
	return nil
}

// link links e from its dict, in a free slot (the dict links no entry of its loop). A dict
// another cache linked is linked to this one instead.
func (c *IterationCache) link(e *iterationEntry) {
	d := e.key.Item
	l, _ := d.MemoLink().(*dictLinks)
	if l == nil || l.cache != c {
		l = &dictLinks{cache: c}
		d.SetMemoLink(l)
	}
	for s, old := range l.entries {
		if old == nil {
			l.entries[s] = e
			return
		}
	}
	for s, old := range l.more {
		if old == nil {
			l.more[s] = e
			return
		}
	}
	l.more = append(l.more, e)
}

// unlink takes e, taken out of the list, off its dict's links.
func (c *IterationCache) unlink(e *iterationEntry) {
	if l, _ := e.key.Item.MemoLink().(*dictLinks); l != nil && l.cache == c {
		if slot := l.slot(e.key.Loop); slot != nil && *slot == e {
			*slot = nil
		}
	}
}

// Keep implements jinja.Memo, under one lock: an iteration over an eighth of the cache is not
// kept.
func (c *IterationCache) Keep(loop *jinja.Loop, its []*jinja.Iteration) {
	sizes := make([]int64, len(its))
	for i, it := range its {
		sizes[i] = it.Size(c.entries.maxBytes/maxEntryShare) + iterationOverhead
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, it := range its {
		if !c.entries.fits(sizes[i]) {
			continue
		}
		d := it.Item()
		if l, _ := d.MemoLink().(*dictLinks); l != nil && l.cache == c {
			if slot := l.slot(loop); slot != nil {
				c.entries.remove(*slot) // and unlinked
			}
		}
		e := &iterationEntry{key: jinja.IterationKey{Loop: loop, Item: d}, val: it, size: sizes[i]}
		c.link(e)
		c.entries.add(e) // unlinked again when evicted at once
	}
}

// count adds a render's iterations to the cache's counts.
func (c *IterationCache) count(s *jinja.MemoStats) {
	c.replayed.Add(uint64(s.Replayed))
	c.ran.Add(uint64(s.Kept + s.NotKept))
}

// Stats returns the iterations replayed and those run, and the bytes held.
func (c *IterationCache) Stats() (replayed, ran uint64, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.replayed.Load(), c.ran.Load(), c.entries.bytes
}

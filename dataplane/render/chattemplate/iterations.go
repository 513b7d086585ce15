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
type IterationCache struct {
	mu      sync.Mutex
	entries byteLRU[jinja.IterationKey, *jinja.Iteration]

	replayed, ran atomic.Uint64
}

// iterationOverhead approximates an entry's bookkeeping besides its Size (its list entry, its
// table slot, its share of its dict's links).
const iterationOverhead = 160

// NewIterationCache returns a cache that holds at most about maxBytes (the iterations' output,
// their reads and writes, bookkeeping).
func NewIterationCache(maxBytes int64) *IterationCache {
	c := &IterationCache{entries: newByteLRU[jinja.IterationKey, *jinja.Iteration](maxBytes)}
	c.entries.removed = c.unlink
	return c
}

// iterationEntry is a kept iteration in the cache's list.
type iterationEntry = lruEntry[jinja.IterationKey, *jinja.Iteration]

// linkedLoops is the number of loops whose iterations over a dict the dict links (Qwen3's and
// Mistral-Nemo's templates loop over the messages twice); a dict's iterations of more loops are
// found in the cache's table alone.
const linkedLoops = 2

// dictLinks are the iterations over a dict the cache keeps, linked from the dict
// (jinja.Dict.MemoLink): a look-up reads them from the dict the loop holds already, where a
// look-up in the cache's table hashes the key and reads a part of a table that many
// conversations share, rarely in the processor's caches (a turn of a conversation of many short
// messages looks an iteration up for each message and loop). The table stays the truth: an
// entry taken out of it is unlinked (unlink), and a look-up the links miss asks the table. A
// dict is linked when an iteration of it is first kept and never unlinked whole, so a dict
// that links nothing (one new to the message cache, as a conversation's first turn has them
// all) has no iteration in any cache's table: its look-up is not made.
// Read and written under the cache's lock; cache is set once.
type dictLinks struct {
	cache   *IterationCache
	entries [linkedLoops]*iterationEntry
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
		d := item.AsDict()
		l, _ := d.MemoLink().(*dictLinks)
		if l == nil {
			continue // a dict no cache has kept an iteration of (a message new to the message cache)
		}
		if l.cache == c {
			if e := l.find(loop); e != nil {
				e.used = true
				found[i] = e.val
				continue
			}
		}
		found[i], _ = c.entries.get(jinja.IterationKey{Loop: loop, Item: d}, true)
	}
}

// find is the entry linked for loop, or nil.
func (l *dictLinks) find(loop *jinja.Loop) *iterationEntry {
	for _, e := range l.entries {
		if e != nil && e.key.Loop == loop {
			return e
		}
	}
	return nil
}

// link links e from its dict, in the slot of its loop or a free one (none free: not linked).
// A dict another cache linked is linked to this one instead.
func (c *IterationCache) link(e *iterationEntry) {
	d := e.key.Item
	l, _ := d.MemoLink().(*dictLinks)
	if l == nil || l.cache != c {
		l = &dictLinks{cache: c}
		d.SetMemoLink(l)
	}
	free := -1
	for s, old := range l.entries {
		if old != nil && old.key.Loop == e.key.Loop {
			l.entries[s] = e
			return
		}
		if old == nil && free < 0 {
			free = s
		}
	}
	if free >= 0 {
		l.entries[free] = e
	}
}

// unlink takes e, taken out of the table, off its dict's links.
func (c *IterationCache) unlink(e *iterationEntry) {
	if l, _ := e.key.Item.MemoLink().(*dictLinks); l != nil && l.cache == c {
		for s, linked := range l.entries {
			if linked == e {
				l.entries[s] = nil
			}
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
		if e := c.entries.put(jinja.IterationKey{Loop: loop, Item: it.Item()}, it, sizes[i]); e != nil {
			c.link(e)
		}
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

package chattemplate

import (
	"encoding/json"
	"hash/maphash"

	"github.com/epd-dev/coordinator/dataplane/render/jinja"
)

// MessageCache is a bounded, concurrency-safe cache of decoded chat messages, for
// Options.Messages. A multi-turn client sends every earlier message again with each turn; with
// the cache, each message (its JSON text as the renderer is given it) is decoded into the
// template's values once, and a later turn uses the same values. A conversation of many short
// messages spends about a fifth of its render decoding them.
//
// Values are shared only between renders of templates that change nothing they are given
// (readsInputsOnly), and own all their memory: a message kept is copied once, and its strings
// share that copy (the cache's key text), never the request that first sent it. A message found
// is compared byte for byte first (textCache).
type MessageCache struct {
	textCache[decodedMessage]
	touched int // guarded by mu: FindAll's sum of what it touches, so that its loads are not dropped
}

// decodedMessage is a message's value, the number of JSON values it holds (what it counts
// against Limits.MaxValues) and the depth of its deepest container (against Limits.MaxDepth).
type decodedMessage struct {
	val             jinja.Value
	values, deepest int
}

// messageOverhead approximates what a message's values hold besides their strings: the dict
// (its keys, its map's header and first group: about 430 bytes), and the entry's bookkeeping
// (its LRU entry and map slot); valueOverhead each value's header. render's TestHistoryHeld
// measures the whole on the heap.
const (
	valueOverhead   = 64
	messageOverhead = 512
)

// FoundMessage is a message looked up in a MessageCache before a render (Find), for
// Options.MessageFound: the render uses it instead of looking the message up again, and counts
// it then.
type FoundMessage struct {
	raw []byte
	d   decodedMessage
	key uint64
	ok  bool
}

// Find looks the message raw (its JSON text) up. Found reports whether it is kept decoded: only
// messages as a template is given them are kept, converted ones (render's conversion of OpenAI
// messages maps a converted message to itself).
func (c *MessageCache) Find(raw []byte) FoundMessage {
	d, key, ok := c.find(raw)
	return FoundMessage{raw, d, key, ok}
}

// FindAll is Find of each of raws, appended to dst: the texts hashed first, then the entries
// looked up together under one lock, in passes. The entries of a long conversation are rarely in
// the processor's caches, and each look-up is a chain of loads that wait on each other (the
// map's group, the entry, its text); one pass of each link over all the messages lets the
// processor have many of them in flight at once, where one message at a time waited for each.
func (c *MessageCache) FindAll(dst []FoundMessage, raws []json.RawMessage) []FoundMessage {
	start := len(dst)
	for _, raw := range raws {
		dst = append(dst, FoundMessage{raw: raw, key: maphash.Bytes(c.seed, raw)})
	}
	found := dst[start:]
	ents := make([]*lruEntry[uint64, textEntry[decodedMessage]], len(found))
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range found {
		ents[i] = c.entries.m[found[i].key]
	}
	touched := 0
	for i, e := range ents {
		if e != nil && len(e.val.raw) == len(found[i].raw) && len(e.val.raw) > 0 {
			touched += int(e.val.raw[0]) // the text's first bytes, brought in for the comparison
		}
	}
	c.touched += touched
	for i, e := range ents {
		if f := &found[i]; e != nil && e.val.raw == string(f.raw) {
			c.entries.use(e)
			f.d, f.ok = e.val.val, true
		}
	}
	return dst
}

// Hash is the message's hash (of its JSON text, with a seed made for the process): the
// cache's key, for a caller that keys the message elsewhere too.
func (f FoundMessage) Hash() uint64 { return f.key }

// Found reports whether the message was found decoded.
func (f FoundMessage) Found() bool { return f.ok }

// of reports whether f is the look-up of the message raw.
func (f *FoundMessage) of(raw []byte) bool {
	return len(f.raw) == len(raw) && (len(raw) == 0 || &f.raw[0] == &raw[0] || string(f.raw) == string(raw))
}

// NewMessageCache returns a cache that holds at most about maxBytes (the messages' JSON texts,
// their values and bookkeeping).
func NewMessageCache(maxBytes int64) *MessageCache {
	return &MessageCache{textCache: newTextCache[decodedMessage](maxBytes)}
}

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
type MessageCache struct{ textCache[decodedMessage] }

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
// looked up together under one lock.
func (c *MessageCache) FindAll(dst []FoundMessage, raws []json.RawMessage) []FoundMessage {
	start := len(dst)
	for _, raw := range raws {
		dst = append(dst, FoundMessage{raw: raw, key: maphash.Bytes(c.seed, raw)})
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := start; i < len(dst); i++ {
		f := &dst[i]
		if e, ok := c.entries.get(f.key, true); ok && e.raw == string(f.raw) {
			f.d, f.ok = e.val, true
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
	return &MessageCache{newTextCache[decodedMessage](maxBytes)}
}

package chattemplate

// StringCache is a bounded, concurrency-safe cache of decoded JSON strings, for Options.Strings.
// A multi-turn client sends every earlier message again with each turn, and decoding a long
// message (unescaping it into a string of its own) costs about as much as the rest of its
// render's passes over it; with the cache, each long string is decoded once.
//
// Only strings that need decoding are kept (those with escapes, or with bytes that are not
// UTF-8: a plain string shares the request's memory and costs nothing), and only long ones
// (minCachedString), of messages a MessageCache does not keep (one it keeps is found whole: its
// strings are its own). A string found is compared byte for byte first (textCache). What is
// shared is a Go string, which nothing can change.
type StringCache struct{ textCache[string] }

const (
	// minCachedString is the shortest JSON string (quotes included) worth keeping: a shorter
	// one decodes in about as long as its look-up takes.
	minCachedString = 256
	// stringOverhead approximates an entry's bookkeeping (the entry, its list element and its map
	// slot).
	stringOverhead = 144
)

// NewStringCache returns a cache that holds at most maxBytes (texts and bookkeeping).
func NewStringCache(maxBytes int64) *StringCache {
	return &StringCache{newTextCache[string](maxBytes)}
}

// put keeps text, what the JSON string raw (its key: get's) stands for; raw is copied.
func (c *StringCache) put(key uint64, raw []byte, text string) {
	c.textCache.put(key, string(raw), text, int64(len(text))+stringOverhead)
}

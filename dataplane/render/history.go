package render

import (
	"encoding/binary"
	"hash/maphash"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/epd-dev/coordinator/dataplane/render/jinja"
	"github.com/epd-dev/coordinator/dataplane/state/body"
)

// The rendered-history cache. A multi-turn client sends the whole conversation with every turn;
// its template renders the history as it did the turn before, and the tokenizer would encode it
// again. The cache keeps the conversations rendered lately: each one's rendered text, its ids
// (and their JSON list, as the legs send them), and the id count at each of its cuts
// (tokenizer.Cuts: the offsets c where Encode(text) == Encode(text[:c]) ++ Encode(text[c:])). A
// new rendering takes the ids of the longest stretch, up to a cut of both, that it shares byte
// for byte with the conversation it continues, and their JSON, and encodes and lists only the
// rest.
//
// Why it is exact: if c is a cut of the new text t and of a cached text p, and t[:c] == p[:c],
// then the ids p had before c are Encode(p[:c]) == Encode(t[:c]), and the ids of t are those
// followed by Encode(t[c:]). Nothing is assumed of the template: one that renders the earlier
// turns differently once a new turn follows (Qwen3 drops the reasoning of answers before the
// last user message) shares a shorter stretch, or none. Nothing is assumed of the key either: a
// key finds a candidate, and its bytes are compared before any id is taken.
//
// The key is a hash (seeded per process) of the request's messages, their bytes as the client
// sent them, with what else the rendering and the ids depend on (tools, kwargs, the switches,
// the encoding's word limit): never a name or field the client chooses. An entry is kept under
// the key of its request's whole message list (and of the turns it continues), and a request
// looks up the keys of its messages[0..j), longest first: it is answered from a conversation
// only if it sends all of that conversation's messages, byte for byte, itself. A shared system
// prompt or first message alone does not find another conversation.

// minHistoryEntry is the shortest rendering worth keeping: a shorter one encodes in about as
// long as its lookup takes.
const minHistoryEntry = 256

// historyOverhead approximates an entry's bookkeeping besides what is counted per piece, chunk,
// cut and key: the entry (160 bytes) and its small arrays' rounding to Go's size classes
// (TestHistoryHeld measures the whole on the heap).
const historyOverhead = 256

// historyKeyCost is what a key costs (its map slot).
const historyKeyCost = 32

// historyCache is a bounded, concurrency-safe cache of rendered conversations. It evicts the
// least recently used entries past its byte budget.
type historyCache struct {
	maxBytes int64
	seed     maphash.Seed

	mu    sync.Mutex
	keys  map[uint64]*historyEntry
	lru   historyEntry // sentinel: lru.next is the most recently used
	bytes int64

	hits, misses, tokens atomic.Uint64
}

// historyEntry is one rendered conversation. text, ids and cuts are never modified once stored
// (they are read without the lock); keys, size and the links are guarded by the cache's mu.
type historyEntry struct {
	text   pieces       // the rendering up to its last cut: the earlier turns' pieces are shared with the entries they came from
	chunks [][]int32    // the ids of text, in order: the earlier turns' chunks are shared with the entries they came from
	lists  [][]byte     // each chunk's ids as JSON, joined by commas (no brackets; a chunk without ids has none)
	cuts   []historyCut // the cuts of text, increasing; the last is len(text)
	held   int64        // bytes of the arrays it keeps past their contents' lengths (text, ids at 4 a token, lists): Go rounds an allocation up, a list is written with room to spare

	keys       []uint64
	size       int64
	prev, next *historyEntry
}

// maxChunks bounds an entry's chunks, and so the pieces a leg sends its ids in: a conversation of
// many turns has its chunks joined into one when it passes maxChunks, a copy of its ids paid once
// in maxChunks turns that copied none.
const maxChunks = 32

// compact joins e's chunks into one, and its lists into one, when it has more than maxChunks
// (the cuts stay true: the lists joined by commas are the same bytes), and each run of its
// text's pieces shorter than minSharedSpan into one when they are more than maxChunks (the
// longer ones, iterations' outputs shared with the iteration cache, stay: they are at most one
// in minSharedSpan bytes). The slack of the arrays it drops stays counted in held (at most an
// eighth of what they held): held never shrinks below what e keeps.
func (e *historyEntry) compact() {
	if len(e.text) > maxChunks {
		var text pieces
		for i := 0; i < len(e.text); {
			j := i + 1
			for len(e.text[i]) < minSharedSpan && j < len(e.text) && len(e.text[j]) < minSharedSpan {
				j++
			}
			if j == i+1 {
				text = append(text, e.text[i])
			} else {
				joined, size := e.text[i:j].own()
				text, e.held = append(text, joined), e.held+int64(size-len(joined))
			}
			i = j
		}
		e.text = text
	}
	if len(e.chunks) <= maxChunks {
		return
	}
	n, m := 0, 0
	for _, ch := range e.chunks {
		n += len(ch)
	}
	for _, l := range e.lists {
		m += len(l) + 1
	}
	ids, list := slices.Grow([]int32(nil), n), slices.Grow([]byte(nil), m)
	for _, ch := range e.chunks {
		ids = append(ids, ch...)
	}
	for _, l := range e.lists {
		if len(l) > 0 && len(list) > 0 {
			list = append(list, ',')
		}
		list = append(list, l...)
	}
	e.chunks, e.lists = [][]int32{ids}, [][]byte{list}
	e.held += 4*int64(cap(ids)-len(ids)) + int64(cap(list)-len(list))
}

// firstChunks are the chunks of e's first n ids (shared, the last one sliced: nothing copied).
func (e *historyEntry) firstChunks(n int) [][]int32 {
	var out [][]int32
	for _, ch := range e.chunks {
		if n <= 0 {
			break
		}
		out = append(out, ch[:min(n, len(ch)):min(n, len(ch))])
		n -= len(ch)
	}
	return out
}

// firstLists are the lists of e's first n bytes of ids as JSON, the empty ones left out (shared,
// the last one sliced).
func (e *historyEntry) firstLists(n int) [][]byte {
	var out [][]byte
	m := 0
	for _, l := range e.lists {
		if m >= n {
			break
		}
		if len(l) == 0 {
			continue
		}
		if m > 0 {
			m++ // the comma
		}
		take := min(len(l), n-m)
		out = append(out, l[:take:take])
		m += take
	}
	return out
}

// historyCut is a cut of an entry's text: its byte offset, the number of ids before it, and the
// length of their JSON list (ids joined by commas).
type historyCut struct{ at, ids, json int32 }

func newHistoryCache(maxBytes int64) *historyCache {
	c := &historyCache{maxBytes: maxBytes, seed: maphash.MakeSeed(), keys: map[uint64]*historyEntry{}}
	c.lru.next, c.lru.prev = &c.lru, &c.lru
	return c
}

// stats returns the lookups that found a usable stretch and that did not, the tokens reused, and
// the bytes held.
func (c *historyCache) stats() (hits, misses, tokens uint64, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits.Load(), c.misses.Load(), c.tokens.Load(), c.bytes
}

// historyKeys are the keys of a request's message prefixes, hashed as the messages are read:
// each key is the hash of the key before it and of the message's own hash.
type historyKeys struct {
	seed maphash.Seed
	last uint64
	keys []uint64
}

// newKeys starts the keys of r's message prefixes: the hash covers what else the rendering and
// the ids depend on.
func (c *historyCache) newKeys(r *ChatRequest) *historyKeys {
	var h maphash.Hash
	h.SetSeed(c.seed)
	var flags [16]byte
	flags[0] = boolByte(r.AddGenerationPrompt) | boolByte(r.ContinueFinalMessage)<<1 | boolByte(r.AddSpecialTokens)<<2
	binary.LittleEndian.PutUint64(flags[8:], uint64(r.Limits.Encode.MaxWordBytes))
	h.Write(flags[:])
	writeLenBytes(&h, r.Tools)
	names := make([]string, 0, len(r.Kwargs))
	for name := range r.Kwargs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		writeLenBytes(&h, []byte(name))
		writeLenBytes(&h, r.Kwargs[name])
	}
	return &historyKeys{seed: c.seed, last: h.Sum64(), keys: make([]uint64, 0, len(r.Split))} // a key a message, when split already
}

// add keeps the key of the messages so far, given the next message's length and hash (its bytes
// as the client sent them, hashed with a seed of the process: the message cache's look-up hash,
// chattemplate.FoundMessage.Hash, so that a message is hashed once).
func (k *historyKeys) add(n int, hash uint64) {
	var b [24]byte
	binary.LittleEndian.PutUint64(b[:], k.last)
	binary.LittleEndian.PutUint64(b[8:], uint64(n))
	binary.LittleEndian.PutUint64(b[16:], hash)
	k.last = maphash.Bytes(k.seed, b[:])
	k.keys = append(k.keys, k.last)
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// writeLenBytes writes b's length and b (so that no two sequences of values write the same
// bytes).
func writeLenBytes(h *maphash.Hash, b []byte) {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
	h.Write(n[:])
	h.Write(b)
}

// find returns the entry of the longest message prefix kept (keys are the request's, one per
// message prefix: keys[j] of messages[0..j+1)), or nil.
func (c *historyCache) find(keys []uint64) (e *historyEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for j := len(keys) - 1; j >= 0 && e == nil; j-- {
		e = c.keys[keys[j]]
	}
	if e != nil {
		c.unlink(e)
		c.pushFront(e)
	}
	return e
}

// match returns the stretch of a text that e (found, or nil) answers: the index in e's cuts and
// in cuts (the text's cuts) of the longest cut of both within the shared bytes e's text and the
// text begin with (nil, -1, -1: none); it counts the hit or miss.
func (c *historyCache) match(e *historyEntry, shared int, cuts []int) (_ *historyEntry, k, j int) {
	if e != nil {
		j = sort.SearchInts(cuts, shared+1) - 1 // the last cut of text within the shared bytes
		for k = len(e.cuts) - 1; j >= 0 && k >= 0; {
			switch at := int(e.cuts[k].at); {
			case at > cuts[j]:
				k--
			case at < cuts[j]:
				j--
			default:
				c.hits.Add(1)
				c.tokens.Add(uint64(e.cuts[k].ids))
				return e, k, j
			}
		}
	}
	c.misses.Add(1)
	return nil, -1, -1
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	const chunk = 4096
	i := 0
	for i+chunk <= n && a[i:i+chunk] == b[i:i+chunk] {
		i += chunk
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// store keeps e under key (its request's message list). When e continues old (its request's
// messages start with all of old's), e takes old's keys too and old is dropped: a conversation
// holds one entry, whatever its number of turns, and each of its turns' message lists finds it.
func (c *historyCache) store(key uint64, e, old *historyEntry) {
	e.keys = []uint64{key}
	c.mu.Lock()
	defer c.mu.Unlock()
	extends := old != nil && old.next != nil // old is still kept
	if extends {
		for _, k := range old.keys {
			if k != key {
				e.keys = append(e.keys, k)
			}
		}
	}
	last := e.cuts[len(e.cuts)-1]
	e.size = int64(e.text.len()) + e.held + 4*int64(last.ids) + int64(last.json) + 16*int64(len(e.text)) + 48*int64(len(e.chunks)) + 12*int64(len(e.cuts)) + historyKeyCost*int64(len(e.keys)) + historyOverhead
	if e.size > c.maxBytes/maxHistoryShare {
		return // one conversation would evict all the others
	}
	if extends {
		c.remove(old)
	}
	for _, k := range e.keys {
		if prev := c.keys[k]; prev != nil {
			c.dropKey(prev, k)
		}
		c.keys[k] = e
	}
	c.pushFront(e)
	c.bytes += e.size
	for c.bytes > c.maxBytes {
		c.remove(c.lru.prev)
	}
}

// fits reports whether an entry of size bytes (text and ids) may be kept.
func (c *historyCache) fits(size int64) bool {
	return size+historyOverhead <= c.maxBytes/maxHistoryShare
}

// maxHistoryShare is the least number of entries the cache has room for: a conversation over
// maxBytes/maxHistoryShare is not kept.
const maxHistoryShare = 8

// dropKey takes key off e (another entry takes it), and e out when it has no key left.
func (c *historyCache) dropKey(e *historyEntry, key uint64) {
	i := slices.Index(e.keys, key)
	if i < 0 {
		return
	}
	e.keys = slices.Delete(e.keys, i, i+1)
	c.bytes -= historyKeyCost
	e.size -= historyKeyCost
	delete(c.keys, key)
	if len(e.keys) == 0 {
		c.remove(e)
	}
}

// remove takes e and its keys out.
func (c *historyCache) remove(e *historyEntry) {
	for _, k := range e.keys {
		if c.keys[k] == e {
			delete(c.keys, k)
		}
	}
	c.unlink(e)
	e.prev, e.next = nil, nil
	c.bytes -= e.size
}

func (c *historyCache) unlink(e *historyEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
}

func (c *historyCache) pushFront(e *historyEntry) {
	e.prev, e.next = &c.lru, c.lru.next
	c.lru.next.prev = e
	c.lru.next = e
}

// chatHistory encodes a chat rendering whose request's message prefixes have keys
// (historyKeys), with the history cache: the rendering is found's text's first matched bytes
// (the template compared them with found's, chattemplate.Template.RenderAfter) followed by rest
// (found nil: rest alone). The ids of the longest stretch it shares with found, and their JSON
// lists, are shared with found (nothing copied); the rest is encoded (in one pass that notes the
// ids at each cut, tokenizer.EncodeCuts) and listed, and the rendering is kept for the next
// turn, its shared bytes as found's pieces and rest's as the template's spans of it (the
// iterations' outputs, ownAround) and copies of the bytes between them. Its JSON is nil with an
// error, or when the text is past its limits. Errors are encode's.
func (m *Model) chatHistory(found *historyEntry, matched int, rest string, spans []jinja.Span, keys []uint64, l Limits) (Tokens, error) {
	var text pieces // the rendering
	if found != nil {
		text = found.text.first(matched)
	}
	text = append(text, rest)
	size := matched + len(rest)
	if l.MaxInputBytes > 0 && size > l.MaxInputBytes {
		return Tokens{}, inputLimitErr(size, l.MaxInputBytes)
	}
	if size > math.MaxInt32 {
		ids, err := m.encode(nil, text.slice(0, size), false, l)
		return Tokens{Own: ids}, err
	}
	h := m.history
	shared := matched // the bytes found's text and the rendering begin with
	if found != nil && matched == 0 {
		shared = found.text.commonPrefix(rest) // rendered whole (continue_final_message)
	}
	cuts, from, tail := m.textCuts(found, text, shared)
	old, k, j := h.match(found, shared, cuts)
	// The ids and JSON lists of the shared stretch (before, fromJSON bytes of list), then
	// own, the ids encoded here, and js, their list.
	var t Tokens
	at, before, fromJSON := 0, 0, 0
	var lists [][]byte
	var ecuts []historyCut
	if old != nil {
		cut := old.cuts[k]
		at, before, fromJSON = int(cut.at), int(cut.ids), int(cut.json)
		t.Shared, lists = old.firstChunks(before), old.firstLists(fromJSON)
		ecuts = append(make([]historyCut, 0, k+1+len(cuts)-j), old.cuts[:k+1]...)
	} else {
		ecuts = make([]historyCut, 0, len(cuts))
	}
	// at >= from: from is a cut of found's within the shared bytes, so a cut of both, and at is
	// the last such cut.
	// The rest, encoded in one pass that passes its cuts (those after j, as Cuts of the text
	// after a cut are its cuts, shifted).
	firstNew := len(ecuts) // the cuts after the shared stretch, their JSON offsets unset
	el := l.Encode
	el.Before = before
	own, newCuts, err := m.tok.EncodeCuts(growFor(nil, tail[at-from:], l.Encode.MaxTokens), tail[at-from:], m.cache, el, nil)
	if err != nil {
		t.Own = own
		return t, encodeErr(err)
	}
	for _, c := range newCuts {
		ecuts = append(ecuts, historyCut{at: int32(at + c.At), ids: int32(before + c.IDs)})
	}
	// The new ids' JSON, written in one pass into room for the longest it can be: after the
	// array's opening bracket, or after a comma when the shared stretch has ids, then the closing
	// bracket (the tail of the legs' array). A cut's offset is the length of the conversation's
	// list of ids before it, noted as the list passes it.
	js := make([]byte, 0, 1+body.IntListRoom(len(own))+1) // a bracket or comma, the list and its slack, the closing bracket
	switch {
	case before == 0:
		js = append(js, '[')
	case len(own) > 0:
		js = append(js, ',')
	}
	head := len(js)
	counted := 0 // the new ids before the last cut seen
	for i := firstNew; i < len(ecuts); i++ {
		if n := int(ecuts[i].ids) - before; n > counted {
			js = body.AppendIntList(js, own[counted:n], counted > 0)
			counted = n
		}
		ecuts[i].json = int32(fromJSON + len(js) - head + min(before, 1)*min(counted, 1))
	}
	js = append(body.AppendIntList(js, own[counted:], counted > 0), ']')
	t.Own, t.JSON = own, jsonSegments(lists, js)
	if len(ecuts) == 0 || int(ecuts[len(ecuts)-1].at) < minHistoryEntry {
		return t, nil
	}
	last := ecuts[len(ecuts)-1]
	held := int64(0) // the slack of the arrays the entry keeps: found's, then its own
	if found != nil && matched > 0 {
		held = found.held
	}
	newLen := 0 // the new ids' list the entry keeps, js[1:1+newLen], and with it the rest of js's array
	if last.ids > int32(before) {
		newLen = int(last.json) - fromJSON - min(before, 1)
		held += int64(cap(js) - newLen)
	}
	if !h.fits(int64(size) + held + 4*int64(last.ids) + int64(last.json)) {
		return t, nil // not even copied: a conversation too large to keep costs nothing more
	}
	e := &historyEntry{text: text.first(int(last.at)), cuts: ecuts, chunks: t.Shared, lists: lists}
	if n := int(last.at) - matched; n > 0 { // rest's bytes, in arrays of their own (the template's has room to spare)
		own, slack := ownAround(rest[:n], spans) // rest[:n] is e.text's last piece, replaced
		e.text = append(e.text[:len(e.text)-1:len(e.text)-1], own...)
		held += int64(slack)
	}
	if n := int(last.ids) - before; n > 0 {
		chunk := slices.Grow([]int32(nil), n)[:n] // an array of the allocation's size: its slack counted
		for i, id := range own[:n] {
			chunk[i] = int32(id)
		}
		held += 4 * int64(cap(chunk)-n)
		e.chunks = append(e.chunks[:len(e.chunks):len(e.chunks)], chunk)
		e.lists = append(e.lists[:len(e.lists):len(e.lists)], js[1:1+newLen:1+newLen])
	}
	e.held = held
	e.compact()
	if len(keys) > 0 {
		h.store(keys[len(keys)-1], e, old)
	}
	return t, nil
}

// jsonSegments is a JSON array of ids as pieces: lists (each ids joined by commas) joined by
// commas, then tail (the rest of the array: its ids after a comma, and the closing bracket; the
// whole array when lists is empty).
func jsonSegments(lists [][]byte, tail []byte) [][]byte {
	if len(lists) == 0 {
		return [][]byte{tail}
	}
	segs := make([][]byte, 0, 2*len(lists)+1)
	segs = append(segs, openBracket)
	for i, l := range lists {
		if i > 0 {
			segs = append(segs, comma)
		}
		segs = append(segs, l)
	}
	return append(segs, tail)
}

// The glue of jsonSegments' pieces (never modified).
var openBracket, comma = []byte("["), []byte(",")

// textCuts are the cuts of text (tokenizer.Cuts) a match with e needs, and the text after the
// last of them that e decides: from byte from on (tail). Without e, none (the encoding finds
// them) and the whole text. With e, a conversation text continues and begins with shared bytes
// of, they are e's as far as those bytes decide them (CutReach) and the text after is scanned
// alone: a later turn scans its new turns, not its history.
func (m *Model) textCuts(e *historyEntry, text pieces, shared int) (cuts []int, from int, tail string) {
	reach := m.tok.CutReach()
	if e == nil {
		return nil, 0, text.slice(0, text.len())
	}
	if reach < 0 {
		tail = text.slice(0, text.len())
		return m.tok.Cuts(nil, tail), 0, tail
	}
	safe := shared - reach
	n := sort.Search(len(e.cuts), func(i int) bool { return int(e.cuts[i].at) > safe })
	cuts = make([]int, n, len(e.cuts)+8)
	for i, c := range e.cuts[:n] {
		cuts[i] = int(c.at)
	}
	if n > 0 {
		from = cuts[n-1]
	}
	tail = text.slice(from, text.len())
	for _, c := range m.tok.Cuts(nil, tail) {
		cuts = append(cuts, from+c)
	}
	return cuts, from, tail
}

package tokenizer

import (
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// state is the scratch space of one Encode call, pooled so that encoding allocates nothing in
// steady state.
type state struct {
	norm   [2][]byte // normalizer ping-pong buffers
	iter   norm.Iter
	prefix []byte  // ByteLevel's prefix space
	secs   []span  // sections between added tokens (raw text)
	secIDs []int32 // the token each section is, -1: text
	subs   []span  // sections between added tokens (normalized text)
	subIDs []int32
	runes  []rune // the general pre-tokenizer path's text
	meta   []byte // Metaspace's rewritten text
	first  bool   // the text being encoded is the first section (Metaspace's prepend_scheme "first")
	ids    []int32
	ranks  []uint32
	mer    []int32
	sym    []int32
	next   []int32
	prev   []int32
	heap   []uint64
	// lim are the encoding's limits, err why it stopped (nil: it did not), words the pre-tokens
	// encoded since the limits were last checked.
	lim   Limits
	err   error
	words int
}

// Encode appends the ids of text to dst: added tokens (special or not) are matched first, as HF does,
// honouring lstrip/rstrip/normalized; the rest is normalized, pre-tokenized and BPE-merged.
// addSpecial applies the post-processor's template (e.g. Llama's BOS); false is what chat rendering uses.
// Invalid UTF-8 bytes are encoded as U+FFFD each, as decoding a JSON string would have made them.
func (t *Tokenizer) Encode(dst []int, text string, addSpecial bool) []int {
	return t.EncodeCached(dst, text, addSpecial, nil)
}

// EncodeCached is Encode with a segment cache: text between added tokens ("segments") whose length is at least
// the cache's minimum is looked up by content and stored after encoding. Exact by construction (segments are
// encoded independently). A nil cache is allowed.
func (t *Tokenizer) EncodeCached(dst []int, text string, addSpecial bool, c *SegmentCache) []int {
	dst, _ = t.EncodeLimited(dst, text, addSpecial, c, Limits{})
	return dst
}

// EncodeLimited is EncodeCached under l: it stops, returning the ids so far and the reason (a
// *LimitError, or the context's error), within 64 KiB of text of the bound being passed or the
// context being done.
func (t *Tokenizer) EncodeLimited(dst []int, text string, addSpecial bool, c *SegmentCache, l Limits) ([]int, error) {
	dst, _, err := t.encodeLimited(dst, text, addSpecial, c, l, nil)
	return dst, err
}

// Cut is a cut of a text (Cuts) and the number of ids its encoding has before it.
type Cut struct{ At, IDs int }

// EncodeCuts is EncodeLimited (addSpecial false) that also appends to cuts each cut of text
// (Cuts), with len(dst) there. It scans text once, where Cuts then an EncodeLimited of each
// piece between two cuts scanned it twice and set up an encoding a piece (a chat rendering has
// a cut or two a message). Stopped by a limit, it returns the cuts it passed.
func (t *Tokenizer) EncodeCuts(dst []int, text string, c *SegmentCache, l Limits, cuts []Cut) ([]int, []Cut, error) {
	if cuts == nil {
		cuts = []Cut{} // not nil: encodeLimited records cuts
	}
	return t.encodeLimited(dst, text, false, c, l, cuts)
}

// encodeLimited is EncodeLimited, appending the cuts it passes to cuts when cuts is not nil.
func (t *Tokenizer) encodeLimited(dst []int, text string, addSpecial bool, c *SegmentCache, l Limits, cuts []Cut) ([]int, []Cut, error) {
	// Without a cache every section is encoded: the text is checked once, whole. When the
	// normalizer is one Unicode form, the quick check that text is in it is also the check that
	// it is valid UTF-8; every section of such a text is normalized too. With a cache, sections
	// are checked one by one, when they are encoded: a section the cache holds (a conversation's
	// history) is not read again; so are they when cutting (cuts are offsets in text as it is,
	// not as sanitized). Splitting before sanitizing splits the same way: an added token is
	// never made of the bytes sanitize replaces.
	normal := false
	if c == nil && cuts == nil {
		text, normal = t.check(text)
	}
	st := t.scratch.Get().(*state)
	st.lim, st.err, st.words = l, nil, 0
	defer t.release(st)
	if addSpecial {
		dst = append(dst, t.prefix...)
	}
	secs, ids := t.added.sections(st.secs[:0], st.secIDs[:0], text, &t.added.raw)
	st.secs, st.secIDs = secs, ids
	cutting := cuts != nil && !t.firstDiffers
	last := -1 // the last cut passed
	for i, sec := range secs {
		s := text[sec.start:sec.end]
		if s == "" {
			continue
		}
		st.first = i == 0
		if st.check(len(dst)) {
			return dst, cuts, st.err
		}
		if ids[i] >= 0 {
			dst = append(dst, int(ids[i]))
			if cutting && t.cutsAfter(s) {
				cuts, last = append(cuts, Cut{sec.end, len(dst)}), sec.end
			}
			continue
		}
		if info, ok := t.added.key(s); ok {
			dst = append(dst, info.id)
			continue
		}
		if c != nil && len(s) >= c.minSegment && !(st.first && t.firstDiffers) {
			if ids, ok := c.get(t.serial, s); ok {
				for _, id := range ids {
					dst = append(dst, int(id))
				}
				continue
			}
			n := len(dst)
			dst = t.encodeChecked(dst, s, st)
			if st.err == nil {
				c.put(t.serial, s, dst[n:])
			}
			continue
		}
		if c != nil || cuts != nil {
			dst = t.encodeChecked(dst, s, st)
			continue
		}
		dst = t.encodeSegment(dst, s, normal, st)
	}
	if st.check(len(dst)) {
		return dst, cuts, st.err
	}
	if cuts != nil && len(text) > 0 && last != len(text) {
		cuts = append(cuts, Cut{len(text), len(dst)})
	}
	if addSpecial {
		dst = append(dst, t.suffix...)
	}
	return dst, cuts, nil
}

// maxPooledScratch bounds the scratch a pooled state keeps: a long text's buffers are let go
// with it rather than held by the pool.
const maxPooledScratch = 1 << 20

// release returns st to the pool, without buffers over maxPooledScratch.
func (t *Tokenizer) release(st *state) {
	st.lim = Limits{}
	if cap(st.norm[0]) > maxPooledScratch || cap(st.norm[1]) > maxPooledScratch || cap(st.sym) > maxPooledScratch/4 || cap(st.heap) > maxPooledScratch/8 ||
		cap(st.ids) > maxPooledScratch/4 || cap(st.prefix) > maxPooledScratch || cap(st.runes) > maxPooledScratch/4 {
		return
	}
	t.scratch.Put(st)
}

// encodeChecked encodes a section not checked yet: sanitized and quick-checked first.
func (t *Tokenizer) encodeChecked(dst []int, s string, st *state) []int {
	s, normal := t.check(s)
	return t.encodeSegment(dst, s, normal, st)
}

// check reports whether s is known to be in the normalizer's form already (the quick check, which
// is also the check that s is valid UTF-8), and sanitizes s when it is not valid UTF-8.
func (t *Tokenizer) check(s string) (string, bool) {
	normal := t.form != nil && isNormal(t.form.form, t.form.safe, s)
	if !normal && !utf8.ValidString(s) {
		s = sanitize(s)
	}
	return s, normal
}

// encodeSegment encodes the text between two raw-matched added tokens: normalization (unless
// normal: known to be normalized already), then the added tokens matched on normalized text, then
// pre-tokenization and BPE.
func (t *Tokenizer) encodeSegment(dst []int, s string, normal bool, st *state) []int {
	if t.sp != nil && t.sp.raw && !strings.Contains(s, "▁") {
		return t.sp.encodeRaw(t, dst, s, st)
	}
	if !normal {
		s = t.normalize(st, s)
	}
	if s == "" {
		return dst
	}
	if len(t.added.norm.nodes) <= 1 {
		return t.preLevel(dst, s, 0, st)
	}
	subs, ids := t.added.sections(st.subs[:0], st.subIDs[:0], s, &t.added.norm)
	st.subs, st.subIDs = subs, ids
	for i, sub := range subs {
		x := s[sub.start:sub.end]
		if x == "" {
			continue
		}
		if ids[i] >= 0 {
			dst = append(dst, int(ids[i]))
			continue
		}
		if info, ok := t.added.key(x); ok {
			dst = append(dst, info.id)
			continue
		}
		dst = t.preLevel(dst, x, 0, st)
	}
	return dst
}

// preLevel runs pre-tokenizer step level over s and encodes each piece.
func (t *Tokenizer) preLevel(dst []int, s string, level int, st *state) []int {
	if level == len(t.pre) {
		if t.sp != nil {
			return t.sp.encode(t, dst, s, st)
		}
		return t.byteLevelEncode(dst, s, st)
	}
	p := &t.pre[level]
	if p.meta != nil {
		return t.preLevel(dst, p.meta.apply(&st.meta, s, st.first), level+1, st)
	}
	if level == 0 && t.deepSeek {
		return t.encodeDeepSeek(dst, s, p.ext, st)
	}
	if p.fast != 0 && p.behavior == isolated && !p.invert {
		if level+1 == len(t.pre) && t.byteLvl != nil && !t.byteLvl.addPrefixSpace && !t.byteLvl.useRegex {
			// The common configurations (Qwen, Llama 3, gpt-oss): each match is a word.
			if p.fast == fastQwen || p.fast == fastLlama || p.fast == fastO200K {
				return t.encodeFast(dst, s, p.fast, p.ext, st)
			}
			for i := 0; i < len(s) && st.err == nil; {
				end := p.fast.next(s, i, p.ext)
				dst = t.word(dst, s, i, end, st)
				i = end
			}
			return dst
		}
		for i := 0; i < len(s) && st.err == nil; {
			end := p.fast.next(s, i, p.ext)
			dst = t.preLevel(dst, s[i:end], level+1, st)
			i = end
		}
		return dst
	}
	p.each(s, st, func(x span) bool {
		dst = t.preLevel(dst, s[x.start:x.end], level+1, st)
		return !st.tick(len(dst))
	})
	return dst
}

// byteLevelEncode is the ByteLevel step (prefix space, GPT-2's split) and the BPE model.
func (t *Tokenizer) byteLevelEncode(dst []int, s string, st *state) []int {
	if t.byteLvl.addPrefixSpace && !strings.HasPrefix(s, " ") {
		st.prefix = append(append(st.prefix[:0], ' '), s...)
		s = bufString(st.prefix)
	}
	if !t.byteLvl.useRegex {
		return t.word(dst, s, 0, len(s), st)
	}
	for i := 0; i < len(s) && st.err == nil; {
		end := fastGPT2JS.next(s, i, nil)
		dst = t.word(dst, s, i, end, st) // the whole text, so that a word's key is read in place
		i = end
	}
	return dst
}

package tokenizer

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// alphabet is how tokenizer.json spells a token's bytes: GPT-2's byte-level alphabet, or the
// text itself (SentencePiece-style vocabularies, whose spaces are "▁").
type alphabet bool

const (
	byteLevelAlphabet alphabet = false
	literalAlphabet   alphabet = true
)

// decode returns the bytes a token spelled in a stands for.
func (a alphabet) decode(tok string) (string, bool) {
	if a == literalAlphabet {
		return tok, true
	}
	return fromByteLevel(tok)
}

// encode spells raw bytes in a (for messages).
func (a alphabet) encode(raw string) string {
	if a == literalAlphabet {
		return raw
	}
	return toByteLevel(raw)
}

// maxSymbols bounds the characters of one word a SentencePiece merge takes: a symbol that is no
// vocabulary entry is numbered maxID+k, k indexing the word's unknown characters.
const maxSymbols = 1<<31 - 1 - maxID

// sentencePiece is the model of a vocabulary spelled in text rather than bytes (Llama 2, Mistral,
// Gemma): BPE merges characters, and a character no entry spells becomes the entries of its
// UTF-8 bytes ("<0xE4>", byte_fallback), else the unknown token.
type sentencePiece struct {
	ascii    [128]int32     // the id of each ASCII character, -1 when no entry spells it
	bmp      []int32        // the id of each other character of the BMP, -1 when no entry spells it
	chars    map[rune]int32 // the id of each character that is a vocabulary entry
	fallback [256]int32     // the id of "<0xXX>" for each byte; -1 without byte_fallback or entry
	unk      int32          // the unknown token's id, -1 without one
	fuseUnk  bool           // consecutive unknown characters make one unknown token
	// meta is the space symbol ("▁"); glued are the characters some entry holds right before
	// meta. A word is cut before a meta that follows any other character: no merge can join
	// across such a cut, since its result would be an entry holding that pair.
	meta       rune
	glued      map[rune]bool
	gluedASCII [128]bool
	// raw: a section without "▁" is encoded where it lies, its spaces read as "▁"
	// (encodeRaw); prepend: the normalizer puts "▁" first.
	raw, prepend bool
	// digitsAlone: every ASCII digit is an entry and no merge makes an entry holding one (as
	// Llama 2's, Mistral's and Gemma 3's vocabularies, trained with split digits): a digit is
	// its own id wherever it is, and no merge joins across it (wordDigits).
	digitsAlone bool
}

// newSentencePiece indexes the characters of a literal vocabulary.
func newSentencePiece(vocab map[string]int, m *rawModel, added map[string]int) (*sentencePiece, error) {
	sp := &sentencePiece{chars: map[rune]int32{}, unk: -1, fuseUnk: m.FuseUnk, meta: '▁', glued: map[rune]bool{}}
	id := func(tok string) (int, bool) {
		if id, ok := added[tok]; ok {
			return id, true
		}
		id, ok := vocab[tok]
		return id, ok
	}
	for i := range sp.fallback {
		sp.fallback[i] = -1
		if m.ByteFallback {
			if id, ok := id(fmt.Sprintf("<0x%02X>", i)); ok {
				sp.fallback[i] = int32(id)
			}
		}
	}
	if m.UnkToken != nil && *m.UnkToken != "" {
		u, ok := id(*m.UnkToken)
		if !ok {
			return nil, errAt("model.unk_token", "%q is not in the vocabulary", *m.UnkToken)
		}
		sp.unk = int32(u)
	}
	for tok, id := range vocab {
		if r, n := utf8.DecodeRuneInString(tok); n == len(tok) && r != utf8.RuneError {
			sp.chars[r] = int32(id)
		}
		prev := rune(-1)
		for _, r := range tok {
			if r == sp.meta && prev >= 0 && prev != sp.meta {
				sp.glued[prev] = true
			}
			prev = r
		}
	}
	for tok, id := range added { // added tokens override entries, as in the reference
		if r, n := utf8.DecodeRuneInString(tok); n == len(tok) && r != utf8.RuneError {
			sp.chars[r] = int32(id)
		}
	}
	for r := range sp.ascii {
		sp.ascii[r] = -1
		if id, ok := sp.chars[rune(r)]; ok {
			sp.ascii[r] = id
		}
		sp.gluedASCII[r] = sp.glued[rune(r)]
	}
	sp.bmp = make([]int32, 1<<16) // 256 KiB: a look-up per character of a merged word
	for r := range sp.bmp {
		sp.bmp[r] = -1
	}
	for r, id := range sp.chars {
		if r < 1<<16 {
			sp.bmp[r] = id
		}
	}
	return sp, nil
}

// readRaw decides whether t's sections without "▁" can be encoded raw (encodeRaw): when
// normalizing such a section only reads its spaces as "▁" (the normalizer is Replace(" ", "▁"),
// alone as Gemma 3 ships it or after Prepend("▁") as Llama 2 and Mistral do), nothing reads
// the normalized text but the model (no added token matched on it; no pre-tokenizer, or a
// Split on " ", which finds none once spaces are "▁"; no ignore_merges) and "▁" is an entry.
// Then ' ' is made a symbol for "▁": a normalized word never holds a space.
func (sp *sentencePiece) readRaw(t *Tokenizer) {
	norm, prepended := t.norm, false
	if len(norm) == 2 && norm[0] == normStep(prepend{"▁"}) {
		norm, prepended = norm[1:], true
	}
	if len(norm) != 1 || norm[0] != normStep(replace{" ", "▁"}) || len(t.added.norm.nodes) > 1 || t.ignoreMrg || sp.meta != '▁' {
		return
	}
	for _, p := range t.pre {
		if p.lit != " " || p.invert || p.meta != nil || p.fast != 0 || p.re != nil || p.digits {
			return
		}
	}
	id, ok := sp.chars[sp.meta]
	if !ok || sp.ascii[' '] >= 0 {
		return
	}
	sp.raw, sp.prepend, sp.ascii[' '] = true, prepended, id
}

// readDigits decides digitsAlone, once the merges are read.
func (sp *sentencePiece) readDigits(m *mergeTable) {
	sp.digitsAlone = !m.digitMerged
	for c := '0'; c <= '9'; c++ {
		sp.digitsAlone = sp.digitsAlone && sp.ascii[c] >= 0
	}
}

// symbol is the merge symbol of the character r at byte k of its word: its id, or maxID+k when no
// entry spells it (expand turns it into byte or unknown ids).
func (sp *sentencePiece) symbol(r rune, k int) int32 {
	switch {
	case r < utf8.RuneSelf:
		if id := sp.ascii[r]; id >= 0 {
			return id
		}
	case r < 1<<16:
		if id := sp.bmp[r]; id >= 0 {
			return id
		}
	default:
		if id, ok := sp.chars[r]; ok {
			return id
		}
	}
	return int32(maxID + k)
}

// cut returns the end of the piece of s starting at i: the next meta that follows a character
// no entry glues to it, or the end of s.
func (sp *sentencePiece) cut(s string, i int) int {
	prev := rune(-1)
	for j := i; j < len(s); {
		r, n := rune(s[j]), 1
		if r >= utf8.RuneSelf {
			r, n = utf8.DecodeRuneInString(s[j:])
		}
		if r == sp.meta && j > i && prev != sp.meta && !sp.glued[prev] {
			return j
		}
		prev = r
		j += n
	}
	return len(s)
}

// encode appends the ids of s (one pre-token: a whole section when the tokenizer has no
// pre-tokenizer) piece by piece, each through the word cache.
func (sp *sentencePiece) encode(t *Tokenizer, dst []int, s string, st *state) []int {
	if t.ignoreMrg {
		if id, ok := t.vocab.lookup(s); ok {
			return append(dst, id)
		}
	}
	return sp.pieces(t, dst, s, 0, false, st)
}

// pieces appends the ids of s from i on, piece by piece (cut at "▁", or with raw at spaces:
// cutRaw), each through the word cache.
func (sp *sentencePiece) pieces(t *Tokenizer, dst []int, s string, i int, raw bool, st *state) []int {
	for i < len(s) && st.err == nil {
		var end int
		if raw {
			end = sp.cutRaw(s, i)
		} else {
			end = sp.cut(s, i)
		}
		switch {
		case end-i > 1:
			dst = t.word(dst, s, i, end, st)
		case sp.ascii[s[i]] >= 0: // one character: s is valid UTF-8
			dst = append(dst, int(sp.ascii[s[i]]))
		default:
			k0, k1 := wordKeyTail(s, i, end)
			dst = t.wordMiss(dst, s[i:end], k0, k1, st)
		}
		i = end
	}
	return dst
}

// encodeRaw is normalize then encode for a section s without "▁" when sp.raw: the pieces of
// s are cut at its spaces as encode cuts at "▁", and looked up by their raw bytes. A cached
// key's spaces thus stand for "▁": the two spellings never meet, a normalized text having no
// space and s no "▁". The first piece after the prepended "▁" is spelled "▁" then raw.
func (sp *sentencePiece) encodeRaw(t *Tokenizer, dst []int, s string, st *state) []int {
	i := 0
	if sp.prepend {
		i = sp.cutRaw(s, 0)
		st.meta = append(append(st.meta[:0], "▁"...), s[:i]...)
		w := bufString(st.meta)
		dst = t.word(dst, w, 0, len(w), st) // "▁" and at least one character: a word
	}
	return sp.pieces(t, dst, s, i, true, st)
}

// cutRaw is cut for raw text: the end of the piece of s starting at i, at the first space
// after i that follows a character no entry glues to "▁" (a space at i follows "▁" or starts
// the piece).
func (sp *sentencePiece) cutRaw(s string, i int) int {
	for j := i + 1; j < len(s); j++ {
		k := strings.IndexByte(s[j:], ' ')
		if k < 0 {
			break
		}
		j += k
		if c := s[j-1]; c < utf8.RuneSelf {
			if c != ' ' && !sp.gluedASCII[c] {
				return j
			}
		} else if r, _ := utf8.DecodeLastRuneInString(s[i:j]); !sp.glued[r] {
			return j
		}
	}
	return len(s)
}

// merge returns the ids of the word w: its characters merged, then unknown ones expanded.
func (sp *sentencePiece) merge(t *Tokenizer, w string, st *state) []int32 {
	if len(w) > maxSymbols {
		panic("tokenizer: word too long") // unreachable: request bodies are far smaller
	}
	sym := st.sym[:0]
	unknown := false
	for k, r := range w {
		s := sp.symbol(r, k)
		unknown = unknown || s >= maxID
		sym = append(sym, s)
	}
	var ids []int32
	switch {
	case len(sym) == 1:
		st.ids = append(st.ids[:0], sym[0])
		ids = st.ids
	case len(w) <= smallWord:
		st.ids = append(st.ids[:0], sym...)
		ids = t.mergeSmallIDs(st.ids, st)
	default:
		ids = t.mergeHeapIDs(sym, st)
	}
	st.sym = sym[:0]
	if !unknown {
		return ids
	}
	return sp.expand(w, ids, st)
}

// expand replaces the unknown symbols of ids (merged from w) with the ids of their bytes, or the
// unknown token (once for a run when fuse_unk), or nothing when the vocabulary has neither, as
// the reference does.
func (sp *sentencePiece) expand(w string, ids []int32, st *state) []int32 {
	out := st.mer[:0]
	for _, id := range ids {
		if id < maxID {
			out = append(out, id)
			continue
		}
		k := int(id - maxID)
		_, n := utf8.DecodeRuneInString(w[k:])
		ok := true
		for b := 0; b < n; b++ {
			ok = ok && sp.fallback[w[k+b]] >= 0
		}
		switch {
		case ok:
			for b := 0; b < n; b++ {
				out = append(out, sp.fallback[w[k+b]])
			}
		case sp.unk < 0:
		case sp.fuseUnk && len(out) > 0 && out[len(out)-1] == sp.unk:
		default:
			out = append(out, sp.unk)
		}
	}
	st.mer = out
	return out
}

// metaspace is the Metaspace pre-tokenizer as the reference runs it: spaces become the
// replacement, which is also put first when the text does not start with it (prepend_scheme
// "always", or "first" in a text's first section); the text stays one pre-token.
type metaspace struct {
	replacement string
	first       bool // prepend_scheme "first"
	never       bool // prepend_scheme "never"
}

// apply returns s with the replacement, in buf.
func (m *metaspace) apply(buf *[]byte, s string, firstSection bool) string {
	b := (*buf)[:0]
	if !m.never && (!m.first || firstSection) && !strings.HasPrefix(s, m.replacement) && !(strings.HasPrefix(s, " ")) {
		b = append(b, m.replacement...)
	}
	for {
		i := strings.IndexByte(s, ' ')
		if i < 0 {
			break
		}
		b = append(append(b, s[:i]...), m.replacement...)
		s = s[i+1:]
	}
	b = append(b, s...)
	*buf = b
	return bufString(b)
}

package tokenizer

import "unicode/utf8"

// A cut of a text is a byte offset c at which its encoding splits exactly:
//
//	Encode(text) == Encode(text[:c]) ++ Encode(text[c:])   (addSpecial false)
//
// Encoding first splits the text on the added tokens it matches in the raw text (the longest
// match at each position, from the left; added.go) and encodes each piece on its own:
// normalization, the added tokens of normalized text, pre-tokenization and BPE never look past
// a piece. The only pieces that see their neighbours are the added tokens that strip them
// (lstrip trims the piece before, rstrip the piece after). So the end of a raw match is a cut
// when the token does not rstrip (which would trim the text after it differently once that text
// is encoded alone) and its content does not end in whitespace (which a following lstrip token
// would trim off it, leaving text): on both sides of it, encoding the parts alone makes the
// pieces encoding the whole makes.
//
// This holds as long as no step of the encoding depends on where a piece stands in the whole
// text. One does: a SentencePiece Metaspace with prepend_scheme "first" prefixes only the
// text's first piece, so such a tokenizer has no cut but the end (TestCutsFirstScheme).
// test/suites/renderref TestHistoryTurnByTurn and the render package's history tests compare
// the cut encoding with the whole one on every family they load.

// Cuts appends to dst the cuts of text (at most one per added token matched, and len(text)
// when text is not empty), in increasing order. It scans text for added tokens, as Encode
// does first: far cheaper than encoding it. A tokenizer whose first piece encodes apart
// (Metaspace's prepend_scheme "first") has no cut but the end.
func (t *Tokenizer) Cuts(dst []int, text string) []int {
	if t.firstDiffers {
		if len(text) > 0 {
			dst = append(dst, len(text))
		}
		return dst
	}
	st := t.scratch.Get().(*state)
	defer t.release(st)
	secs, ids := t.added.sections(st.secs[:0], st.secIDs[:0], text, &t.added.raw)
	st.secs, st.secIDs = secs, ids
	last := -1
	for i, sec := range secs {
		if ids[i] < 0 || sec.start >= sec.end {
			continue // text, or a token trimmed by a neighbour's strip
		}
		if t.cutsAfter(text[sec.start:sec.end]) {
			dst = append(dst, sec.end)
			last = sec.end
		}
	}
	if len(text) > 0 && last != len(text) {
		dst = append(dst, len(text))
	}
	return dst
}

// cutsAfter reports whether the end of s, an added token matched in the raw text, is a cut.
func (t *Tokenizer) cutsAfter(s string) bool {
	info, ok := t.added.key(s)
	return ok && !info.rstrip && !endsInSpace(s)
}

// CutReach bounds how far past a position the cuts before it depend on: when two texts share
// their first n bytes, their cuts up to n-CutReach() are the same, and Cuts of the text after one
// of them (a cut: the scan starts there afresh) are the rest of its cuts, shifted. The scan
// decides at each position on the longest added token there, which reads no further than the
// longest token's bytes; a cut needs nothing of what follows it (no rstrip, no trailing space
// for an lstrip to trim). It is -1 for a tokenizer with no cut but the end.
func (t *Tokenizer) CutReach() int {
	if t.firstDiffers {
		return -1
	}
	return t.added.maxKey
}

// endsInSpace reports whether s ends in the whitespace an lstrip token trims (isJSSpace).
func endsInSpace(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isJSSpace(r)
}

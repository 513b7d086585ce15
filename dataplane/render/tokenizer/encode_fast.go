package tokenizer

import (
	"math/bits"
	"unicode/utf8"
)

// encodeFast appends the ids of s split by one of the patterns of the common configurations
// (kind: Qwen's or Llama 3's cl100k-family pattern; gpt-oss's o200k one or DeepSeek-V3's third
// step, on a run of its first two, which need ext), each match through the word cache: the hot
// loop of those configurations. It is `for each match of kind.next: t.word(...)` with the
// commonest pre-tokens split inline (ASCII digits; for cl100k an ASCII word, alone or after
// one ASCII character that [^\r\n\p{L}\p{N}]? takes; o200kASCII, deepSeekASCII) and
// wordCache.getShort inlined: Go keeps no register across a call, so two or three calls per
// pre-token cost about as much as the rest of the work. TestEncodeFastMatchesWordLoop holds
// the two to each other.
func (t *Tokenizer) encodeFast(dst []int, s string, kind fastKind, ext *[classLimit]uint8, st *state) []int {
	cache := &t.words
	o200k, deepSeek := kind == fastO200K, kind == fastDeepSeek
	three := o200k || kind == fastLlama // \p{N}{1,3}, else \p{N}
	// The text is walked in stretches of checkEvery bytes, the limits checked between them: the
	// hot loop's bound is the stretch's end instead of the text's, so the checks cost it nothing.
	// A pre-token that crosses a stretch's end is split as in the whole text (j is found in s).
	for i := 0; i < len(s); {
		if i > 0 && st.check(len(dst)) {
			return dst
		}
		for end := min(len(s), i+checkEvery); i < end; {
			// The end j of the pre-token at i; l is where its letters start when it is a word.
			c0 := s[i]
			l := i
			switch {
			case byteClass[c0]&clsL != 0:
				l = i + 1
			case wordPrefix[c0] && i+1 < len(s) && byteClass[s[i+1]]&clsL != 0:
				l = i + 2
			}
			var j int
			switch {
			case deepSeek:
				if j = deepSeekASCII(s, i); j == 0 {
					j = deepSeekNext(s, i, ext)
				}
			case c0-'0' < 10:
				// \p{N}, or \p{N}{1,3} with three.
				j = i + 1
				if three {
					for j < len(s) && j < i+3 && s[j]-'0' < 10 {
						j++
					}
					if j < len(s) && j < i+3 && s[j] >= utf8.RuneSelf { // maybe a number that is not ASCII
						if o200k {
							j = o200kNext(s, i, ext)
						} else {
							j = cl100kNext(s, i, three)
						}
					}
				}
			case o200k:
				if j = o200kASCII(s, i); j == 0 {
					j = o200kNext(s, i, ext)
				}
			case l == i:
				// ` ?[^\s\p{L}\p{N}]+[\r\n]*` on ASCII punctuation, inline; cl100kNext for the rest
				// and where it must look further (an apostrophe may start a contraction, a character
				// that is not ASCII may go on with the punctuation).
				p := i
				if c0 == ' ' && i+1 < len(s) {
					p = i + 1
				}
				if byteClass[s[p]] != 0 || c0 == '\'' {
					j = cl100kNext(s, i, three)
					break
				}
				for p++; p < len(s) && byteClass[s[p]] == 0; p++ {
				}
				if p < len(s) && s[p] >= utf8.RuneSelf {
					j = cl100kNext(s, i, three)
					break
				}
				for p < len(s) && (s[p] == '\r' || s[p] == '\n') {
					p++
				}
				j = p
			case l+8 <= len(s):
				if x := asciiLetters(le64s(s[l:])); x != 0x8080808080808080 {
					j = l + bits.TrailingZeros64(^x&0x8080808080808080)>>3
					if s[j] >= utf8.RuneSelf {
						j = runEnd(s, j, clsL)
					}
				} else {
					j = letterRunEnd(s, l+8)
				}
			default:
				j = runEnd(s, l, clsL)
			}

			n := j - i
			if n == 1 {
				dst = append(dst, int(t.merges.byteID[c0]))
				i = j
				continue
			}
			if n <= maxShortWord && i+16 <= len(s) {
				// wordCache.getShort, inlined.
				x := s[i : i+16]
				k0, k1 := le64s(x[:8])&keyMask[n][0], le64s(x[8:])&keyMask[n][1]
				set := cache.set(k0, k1, n)
				a, b := &set[0], &set[1]
				ma, mb := a.meta.Load(), b.meta.Load()
				want := uint64(n) << 24
				da := (ma&(busy|31<<24) ^ want) | (a.k0.Load() ^ k0) | (a.k1.Load() ^ k1)
				db := (mb&(busy|31<<24) ^ want) | (b.k0.Load() ^ k0) | (b.k1.Load() ^ k1)
				w := 0
				if db == 0 {
					w = 1
				}
				if min(da, db) == 0 {
					sel := -uint64(w)
					m := ma&^sel | mb&sel
					ids := set[w].ids.Load()
					if set[w].meta.Load() == m {
						dst = appendShort(dst, m, ids)
						i = j
						continue
					}
				}
			}
			dst = t.word(dst, s, i, j, st)
			if st.err != nil {
				return dst
			}
			i = j
		}
	}
	return dst
}

// wordPrefix marks the ASCII characters that [^\r\n\p{L}\p{N}]? takes before a word, but for
// the apostrophe, which may start a contraction.
var wordPrefix = func() (t [256]bool) {
	for c := range utf8.RuneSelf {
		t[c] = charClass[c]&(clsL|clsN) == 0 && c != '\r' && c != '\n' && c != '\''
	}
	return t
}()

package tokenizer

import (
	"math/bits"
	"unicode"
	"unicode/utf8"
)

// fastKind names a known pre-tokenizer pattern that is split by hand instead of by regexp2.
// Each splitter returns, for a position, the end of the match the backtracking engine would
// find there (leftmost alternative first); FuzzSplit and TestSplitFastMatchesRegexp2 hold them
// to regexp2 on the same pattern. The three patterns cover every character, so matches are
// contiguous and there are no gaps (split_more.go's DeepSeek patterns excepted).
type fastKind uint8

const (
	_            fastKind = iota
	fastQwen              // patternQwen: \p{N} one at a time
	fastLlama             // patternLlama: \p{N}{1,3}
	fastGPT2              // patternGPT2 as a Split regex: \s is White_Space
	fastGPT2JS            // GPT-2's pattern inside ByteLevel(use_regex): the reference runs it as a JS RegExp, so \s is ECMAScript's
	fastDigits3           // patternDigits3 (DeepSeek-V3's first step)
	fastCJK               // patternCJK (DeepSeek-V3's second step)
	fastDeepSeek          // patternDeepSeek (DeepSeek-V3's third step)
	fastO200K             // patternO200K (gpt-oss)
)

// Character classes, one bit each; a character with none of them is "other".
const (
	clsL    uint8 = 1 << iota // \p{L}
	clsN                      // \p{N}
	clsWS                     // Unicode White_Space (Oniguruma's \s)
	clsJSWS                   // ECMAScript \s
	clsMB                     // byteClass only: a byte of a multi-byte character
)

// charClass holds the classes of the characters below classLimit (the Basic Multilingual Plane
// and the Supplementary Multilingual Plane, where emoji are), built from Go's Unicode tables
// (15.0.0) by walking their ranges.
var charClass = func() *[classLimit]uint8 {
	var t [classLimit]uint8
	mark := func(tab *unicode.RangeTable, bit uint8) {
		for _, r := range tab.R16 {
			for c := uint32(r.Lo); c <= uint32(r.Hi); c += uint32(r.Stride) {
				t[c] |= bit
			}
		}
		for _, r := range tab.R32 {
			for c := r.Lo; c <= r.Hi && c < classLimit; c += r.Stride {
				t[c] |= bit
			}
		}
	}
	mark(unicode.L, clsL)
	mark(unicode.N, clsN)
	mark(unicode.White_Space, clsWS)
	for c := rune(0); c < 0x10000; c++ {
		if isJSSpace(c) {
			t[c] |= clsJSWS
		}
	}
	return &t
}()

const classLimit = 0x20000

// byteClass is charClass for ASCII bytes; every byte from 0x80 has only clsMB (part of a
// multi-byte character, which classAt decodes). It keeps the ASCII paths to one table look-up.
var byteClass = func() (t [256]uint8) {
	for c := range t {
		if c < utf8.RuneSelf {
			t[c] = charClass[c]
		} else {
			t[c] = clsMB
		}
	}
	return t
}()

// classAt returns the classes and width of the character at s[i]; an invalid byte is one "other"
// character (U+FFFD), as regexp2 decodes it.
func classAt(s string, i int) (uint8, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return byteClass[c], 1
	}
	return classMB(s, i)
}

// classMB is classAt for a character that is not ASCII.
func classMB(s string, i int) (uint8, int) {
	c := s[i]
	switch {
	case i+2 < len(s):
		if r, ok := decode3(c, s[i+1], s[i+2]); ok {
			return charClass[r], 3
		}
	case c >= 0xC2 && c < 0xE0 && i+1 < len(s) && s[i+1]&0xC0 == 0x80:
		return charClass[rune(c&0x1F)<<6|rune(s[i+1]&0x3F)], 2
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	if r < classLimit {
		return charClass[r], n
	}
	var k uint8
	if unicode.IsLetter(r) {
		k |= clsL
	}
	if unicode.IsNumber(r) {
		k |= clsN
	}
	return k, n
}

// decode3 decodes a valid 3-byte UTF-8 sequence (ok false: anything else), the commonest case of
// utf8.DecodeRuneInString (CJK and most other scripts) without its call.
func decode3(c, c1, c2 byte) (r rune, ok bool) {
	r = rune(c&0x0F)<<12 | rune(c1&0x3F)<<6 | rune(c2&0x3F)
	return r, c&0xF0 == 0xE0 && c1&0xC0 == 0x80 && c2&0xC0 == 0x80 && r >= 0x800 && (r < 0xD800 || r >= 0xE000)
}

// runEnd returns the end of the run of characters from i whose classes intersect want.
func runEnd(s string, i int, want uint8) int {
	for i < len(s) {
		k := byteClass[s[i]]
		if k&want != 0 {
			i++
			continue
		}
		if k != clsMB {
			return i
		}
		n := 0
		if i+2 < len(s) {
			if r, ok := decode3(s[i], s[i+1], s[i+2]); ok {
				k, n = charClass[r], 3
			}
		}
		if n == 0 {
			k, n = classMB(s, i)
		}
		if k&want == 0 {
			return i
		}
		i += n
	}
	return i
}

// asciiLetters has 0x80 in each byte of x that is an ASCII letter (x|0x20 in 'a'..'z').
func asciiLetters(x uint64) uint64 {
	y := (x | 0x2020202020202020) & 0x7F7F7F7F7F7F7F7F
	return (y + 0x1F1F1F1F1F1F1F1F) &^ (y + 0x0505050505050505) &^ x & 0x8080808080808080
}

// letterRunEnd is runEnd(s, i, clsL): ASCII letters eight at a time (SWAR), then
// one character at a time from the first byte that is not one.
func letterRunEnd(s string, i int) int {
	for i+8 <= len(s) {
		if letters := asciiLetters(le64s(s[i:])); letters != 0x8080808080808080 {
			i += bits.TrailingZeros64(^letters&0x8080808080808080) >> 3
			if s[i] < utf8.RuneSelf {
				return i
			}
			break
		}
		i += 8
	}
	return runEnd(s, i, clsL)
}

// otherRunEnd returns the end of the run of characters from i that are not whitespace (ws),
// letters or numbers: [^\s\p{L}\p{N}]+.
func otherRunEnd(s string, i int, ws uint8) int {
	stop := ws | clsL | clsN
	for i < len(s) {
		k := byteClass[s[i]]
		n := 1
		if k == clsMB {
			k, n = classMB(s, i)
		}
		if k&stop != 0 {
			return i
		}
		i += n
	}
	return i
}

// contraction returns the length of 's|'t|'re|'ve|'m|'ll|'d at s[i] (s[i] == '\”), or 0;
// fold makes it ASCII case-insensitive, as the reference rewrites (?i:...).
func contraction(s string, i int, fold bool) int {
	if i+1 >= len(s) {
		return 0
	}
	low := func(c byte) byte {
		if fold && 'A' <= c && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	switch low(s[i+1]) {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v':
		if i+2 < len(s) && low(s[i+2]) == 'e' {
			return 3
		}
	case 'l':
		if i+2 < len(s) && low(s[i+2]) == 'l' {
			return 3
		}
	}
	return 0
}

// next returns the end of the match at s[i] (i < len(s)), or of the gap before the next match
// for a kind with gaps; ext is extClass(), needed from fastDigits3 on.
func (k fastKind) next(s string, i int, ext *[classLimit]uint8) int {
	switch k {
	case fastQwen, fastLlama:
		return cl100kNext(s, i, k == fastLlama)
	case fastGPT2, fastGPT2JS:
		return gpt2Next(s, i, k == fastGPT2JS)
	case fastDigits3:
		return digits3Next(s, i)
	case fastCJK:
		return cjkNext(s, i, ext)
	case fastDeepSeek:
		return deepSeekNext(s, i, ext)
	default:
		return o200kNext(s, i, ext)
	}
}

// cl100kNext splits the GPT-4 (cl100k) family's pattern, Qwen's and Llama 3's:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func cl100kNext(s string, i int, three bool) int {
	c0 := s[i]
	k, w := byteClass[c0], 1
	if k == clsMB {
		k, w = classMB(s, i)
	} else if c0 == '\'' {
		if n := contraction(s, i, true); n > 0 {
			return i + n
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if k&clsL != 0 {
		return letterRunEnd(s, i+w)
	}
	if k&clsN == 0 && c0 != '\r' && c0 != '\n' && i+w < len(s) {
		k1, w1 := byteClass[s[i+w]], 1
		if k1 == clsMB {
			k1, w1 = classMB(s, i+w)
		}
		if k1&clsL != 0 {
			return letterRunEnd(s, i+w+w1)
		}
	}
	// \p{N} or \p{N}{1,3}
	if k&clsN != 0 {
		if three {
			return digits3Next(s, i)
		}
		return i + w
	}
	if end := punctRun(s, i, k, false); end >= 0 {
		return end
	}
	return wsMatch(s, i)
}

// punctRun is ' ?[^\s\p{L}\p{N}]+[\r\n]*' (with slash, '[\r\n/]*') at s[i], whose character is
// of class k and neither a letter nor a number: its end, or -1 when it does not match.
func punctRun(s string, i int, k uint8, slash bool) int {
	j := -1
	if k&clsWS == 0 {
		j = i
	} else if s[i] == ' ' && i+1 < len(s) {
		if k1, _ := classAt(s, i+1); k1&(clsWS|clsL|clsN) == 0 {
			j = i + 1
		}
	}
	if j < 0 {
		return -1
	}
	j = otherRunEnd(s, j, clsWS)
	for j < len(s) && (s[j] == '\r' || s[j] == '\n' || slash && s[j] == '/') {
		j++
	}
	return j
}

// wsTail is \s+(?!\S)|\s+ for the whitespace run s[i:end]: all of it at the end of the text,
// else all but its last character, else (a single character) that one.
func wsTail(s string, i, end int) int {
	if end == len(s) {
		return end
	}
	_, n := utf8.DecodeLastRuneInString(s[:end])
	if end-n > i {
		return end - n
	}
	return end
}

// gpt2Next splits GPT-2's pattern:
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func gpt2Next(s string, i int, js bool) int {
	ws := clsWS
	if js {
		ws = clsJSWS
	}
	c0 := s[i]
	if c0 == '\'' {
		if n := contraction(s, i, false); n > 0 {
			return i + n
		}
	}
	k, w := classAt(s, i)
	j := i
	if c0 == ' ' && i+1 < len(s) {
		k1, w1 := classAt(s, i+1)
		if k1&(clsL|clsN) != 0 || k1&ws == 0 {
			k, w, j = k1, w1, i+1
		}
	}
	switch {
	case k&clsL != 0:
		return runEnd(s, j+w, clsL)
	case k&clsN != 0:
		return runEnd(s, j+w, clsN)
	case k&ws == 0:
		return otherRunEnd(s, j, ws)
	}
	return wsTail(s, i, runEnd(s, i, ws))
}

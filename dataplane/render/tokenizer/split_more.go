package tokenizer

import (
	"sync"
	"unicode"
	"unicode/utf8"
)

// The splitters of DeepSeek-V3's three Split steps and of o200k's pattern (gpt-oss, GPT-4o),
// by hand, as split_fast.go does the cl100k family's. DeepSeek's patterns do not cover every
// character: for them next returns the end of a match, or of the gap before the next match, the
// pieces an Isolated split makes (parseSplit uses them only there).
const (
	patternDigits3 = `\p{N}{1,3}`
	patternCJK     = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
	// DeepSeek's tokenizer.json spells CR and LF as the characters themselves, not escapes.
	patternDeepSeek = `[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_` + "`" + `{|}~][A-Za-z]+|[^` + "\r\n" + `\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[` + "\r\n" + `]*|\s*[` + "\r\n" + `]+|\s+(?!\S)|\s+`
	patternO200K    = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// gaps reports whether the kind's pattern leaves characters unmatched: its splitter returns
// pieces (matches and the gaps between them), valid for an Isolated split only.
func (k fastKind) gaps() bool { return k == fastDigits3 || k == fastCJK || k == fastDeepSeek }

// More character classes, one bit each (extClass).
const (
	xM   uint8 = 1 << iota // \p{M}
	xP                     // \p{P}
	xS                     // \p{S}
	xU                     // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
	xW                     // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
	xCJK                   // DeepSeek's [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]
)

// extClasses computes the more classes of r from Go's Unicode tables.
func extClasses(r rune) uint8 {
	var x uint8
	if unicode.Is(unicode.M, r) {
		x |= xM | xU | xW
	}
	if unicode.Is(unicode.P, r) {
		x |= xP
	}
	if unicode.Is(unicode.S, r) {
		x |= xS
	}
	if unicode.In(r, unicode.Lu, unicode.Lt, unicode.Lm, unicode.Lo) {
		x |= xU
	}
	if unicode.In(r, unicode.Ll, unicode.Lm, unicode.Lo) {
		x |= xW
	}
	if r >= 0x4e00 && r <= 0x9fa5 || r >= 0x3040 && r <= 0x309f || r >= 0x30a0 && r <= 0x30ff {
		x |= xCJK
	}
	return x
}

// extClass is extClasses below classLimit, built the first time a tokenizer needs it.
var extClass = sync.OnceValue(func() *[classLimit]uint8 {
	var t [classLimit]uint8
	for r := range t {
		t[r] = extClasses(rune(r))
	}
	return &t
})

// classes returns the classes (charClass's and extClass's) and the width of the character at s[i].
func classes(s string, i int, ext *[classLimit]uint8) (k, x uint8, w int) {
	c := s[i]
	if c < utf8.RuneSelf {
		return byteClass[c], ext[c], 1
	}
	r, w := rune(0), 0
	if i+2 < len(s) {
		if d, ok := decode3(c, s[i+1], s[i+2]); ok {
			r, w = d, 3
		}
	}
	if w == 0 {
		r, w = utf8.DecodeRuneInString(s[i:])
	}
	if r < classLimit {
		return charClass[r], ext[r], w
	}
	k, _ = classMB(s, i)
	return k, extClasses(r), w
}

// runEndX returns the end of the run of characters from i whose classes intersect want (base
// classes) or wantX (more classes).
func runEndX(s string, i int, want, wantX uint8, ext *[classLimit]uint8) int {
	for i < len(s) {
		if c := s[i]; c < utf8.RuneSelf {
			if byteClass[c]&want == 0 && ext[c]&wantX == 0 {
				return i
			}
			i++
			continue
		}
		k, x, w := classes(s, i, ext)
		if k&want == 0 && x&wantX == 0 {
			return i
		}
		i += w
	}
	return i
}

// digits3Next splits \p{N}{1,3}: up to three numbers, or the gap before the next number.
func digits3Next(s string, i int) int {
	k, w := classAt(s, i)
	if k&clsN == 0 {
		for i += w; i < len(s); i += w {
			if k, w = classAt(s, i); k&clsN != 0 {
				return i
			}
		}
		return i
	}
	end := i + w
	for n := 1; n < 3 && end < len(s); n++ {
		k1, w1 := classAt(s, end)
		if k1&clsN == 0 {
			break
		}
		end += w1
	}
	return end
}

// cjkNext splits DeepSeek's CJK run: a run of its ranges, or the gap before the next one.
func cjkNext(s string, i int, ext *[classLimit]uint8) int {
	_, x, w := classes(s, i, ext)
	in := x&xCJK != 0
	for i += w; i < len(s); i += w {
		if s[i] < utf8.RuneSelf { // ASCII: never in the ranges
			if w = 1; in {
				return i
			}
			continue
		}
		if _, x, w = classes(s, i, ext); (x&xCJK != 0) != in {
			return i
		}
	}
	return i
}

// asciiPunct is DeepSeek's [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~].
func asciiPunct(c byte) bool {
	return c >= '!' && c <= '/' || c >= ':' && c <= '@' || c >= '[' && c <= '`' || c >= '{' && c <= '~'
}

func asciiLetter(c byte) bool { return c|0x20 >= 'a' && c|0x20 <= 'z' }

// deepSeekNext splits DeepSeek-V3's third pattern:
//
//	[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// a match, or the gap before the next one.
func deepSeekNext(s string, i int, ext *[classLimit]uint8) int {
	if end := deepSeekMatch(s, i, ext); end > i {
		return end
	}
	for _, _, w := classes(s, i, ext); ; {
		if i += w; i >= len(s) || deepSeekMatch(s, i, ext) > i {
			return i
		}
		_, _, w = classes(s, i, ext)
	}
}

// deepSeekMatch returns the end of the match at s[i], or i when there is none.
func deepSeekMatch(s string, i int, ext *[classLimit]uint8) int {
	c0 := s[i]
	if asciiPunct(c0) && i+1 < len(s) && asciiLetter(s[i+1]) {
		j := i + 2
		for j < len(s) && asciiLetter(s[j]) {
			j++
		}
		return j
	}
	k, x, w := classes(s, i, ext)
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ (a mark is taken either way: the same run)
	if k&clsL != 0 || x&xM != 0 {
		return runEndX(s, i+w, clsL, xM, ext)
	}
	if c0 != '\r' && c0 != '\n' && x&(xP|xS) == 0 && i+w < len(s) {
		if k1, x1, w1 := classes(s, i+w, ext); k1&clsL != 0 || x1&xM != 0 {
			return runEndX(s, i+w+w1, clsL, xM, ext)
		}
	}
	// ' ?[\p{P}\p{S}]+[\r\n]*'
	j := -1
	if x&(xP|xS) != 0 {
		j = i
	} else if c0 == ' ' && i+1 < len(s) {
		if _, x1, _ := classes(s, i+1, ext); x1&(xP|xS) != 0 {
			j = i + 1
		}
	}
	if j >= 0 {
		j = runEndX(s, j, 0, xP|xS, ext)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	if k&clsWS == 0 {
		return i
	}
	return wsMatch(s, i)
}

// wsMatch is \s*[\r\n]+|\s+(?!\S)|\s+ at the whitespace character s[i].
func wsMatch(s string, i int) int {
	end := runEnd(s, i, clsWS)
	for p := end - 1; p >= i; p-- {
		if s[p] == '\r' || s[p] == '\n' {
			return p + 1
		}
	}
	return wsTail(s, i, end)
}

// o200kNext splits o200k's pattern (it covers every character):
//
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//	|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//	|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
func o200kNext(s string, i int, ext *[classLimit]uint8) int {
	if end := o200kASCII(s, i); end > 0 {
		return end
	}
	return o200kMatch(s, i, ext)
}

// o200kMatch is o200kNext without its ASCII shortcut: the pattern's alternatives in order.
func o200kMatch(s string, i int, ext *[classLimit]uint8) int {
	c0 := s[i]
	k, _, w := classes(s, i, ext)
	prefix := c0 != '\r' && c0 != '\n' && k&(clsL|clsN) == 0 && i+w < len(s)
	// The first alternative, with the prefix character, then without it; then the second.
	if prefix {
		if end := upperLower(s, i+w, ext); end > 0 {
			return withContraction(s, end)
		}
	}
	if end := upperLower(s, i, ext); end > 0 {
		return withContraction(s, end)
	}
	if prefix {
		if end := upperThenLower(s, i+w, ext); end > 0 {
			return withContraction(s, end)
		}
	}
	if end := upperThenLower(s, i, ext); end > 0 {
		return withContraction(s, end)
	}
	if k&clsN != 0 {
		return digits3Next(s, i)
	}
	if end := punctRun(s, i, k, true); end >= 0 {
		return end
	}
	return wsMatch(s, i)
}

// upperLower matches U*W+ at s[j] (U: [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], W:
// [\p{Ll}\p{Lm}\p{Lo}\p{M}]) as a backtracking engine does, returning its end or 0: the longest
// run of U, then the run of W after it; else, the run of U given back up to its last W.
func upperLower(s string, j int, ext *[classLimit]uint8) int {
	last := -1 // the end of the last W of the U run
	u := j
	for u < len(s) {
		_, x, w := classes(s, u, ext)
		if x&xU == 0 {
			break
		}
		if x&xW != 0 {
			last = u + w
		}
		u += w
	}
	if u < len(s) {
		if _, x, w := classes(s, u, ext); x&xW != 0 {
			return runEndX(s, u+w, 0, xW, ext)
		}
	}
	return max(last, 0)
}

// upperThenLower matches U+W* at s[j], returning its end or 0.
func upperThenLower(s string, j int, ext *[classLimit]uint8) int {
	u := runEndX(s, j, 0, xU, ext)
	if u == j {
		return 0
	}
	return runEndX(s, u, 0, xW, ext)
}

// withContraction extends a match ending at end with (?i:'s|'t|'re|'ve|'m|'ll|'d)?.
func withContraction(s string, end int) int {
	if end < len(s) && s[end] == '\'' {
		return end + contraction(s, end, true)
	}
	return end
}

// Kinds of deepSeekRun's runs.
const (
	runOther  = iota // neither numbers nor DeepSeek's CJK ranges
	runDigits        // up to three numbers
	runCJK           // DeepSeek's CJK ranges
)

// deepSeekRun returns the end and kind of the piece at s[i] after DeepSeek-V3's first two
// steps, \p{N}{1,3} then its CJK ranges, both Isolated: in one scan, the pieces the two make.
func deepSeekRun(s string, i int, ext *[classLimit]uint8) (int, int) {
	k, x, w := classes(s, i, ext)
	switch {
	case k&clsN != 0:
		return digits3Next(s, i), runDigits
	case x&xCJK != 0:
		return cjkNext(s, i, ext), runCJK
	}
	for i += w; i < len(s); i += w {
		if c := s[i]; c < utf8.RuneSelf {
			if w = 1; byteClass[c]&clsN != 0 {
				return i, runOther
			}
			continue
		}
		if k, x, w = classes(s, i, ext); k&clsN != 0 || x&xCJK != 0 {
			return i, runOther
		}
	}
	return i, runOther
}

// encodeDeepSeek is DeepSeek-V3's pre-tokenizer (its three Split steps, then a plain ByteLevel)
// and the BPE model in one loop: each run of the first two steps is split by the third.
func (t *Tokenizer) encodeDeepSeek(dst []int, s string, ext *[classLimit]uint8, st *state) []int {
	for i := 0; i < len(s) && st.err == nil; {
		end, kind := deepSeekRun(s, i, ext)
		if kind == runDigits { // a number is never matched by the third step: one piece
			dst = t.word(dst, s, i, end, st)
			i = end
			continue
		}
		if st.tick(len(dst)) {
			return dst
		}
		dst = t.encodeFast(dst, s[i:end], fastDeepSeek, ext, st)
		i = end
	}
	return dst
}

// deepSeekASCII is deepSeekNext where ASCII decides the match: a word of ASCII letters after an
// ASCII punctuation or symbol ([!-/:-@[-`{-~][A-Za-z]+, which any other byte ends), else after an
// optional character that is neither a letter, punctuation, a symbol, \r nor \n
// ([^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+, which must end at an ASCII byte: letters and marks
// that are not ASCII go on with it); a run of ASCII punctuation and symbols, after an optional
// space, and the newlines after it ( ?[\p{P}\p{S}]+[\r\n]*, which must end at an ASCII byte);
// whitespace that no letter follows (wsMatch). It returns 0 when the general path must decide.
func deepSeekASCII(s string, i int) int {
	c := s[i]
	j := i + 1
	if !asciiLetter(c) {
		next := byte(0)
		if j < len(s) {
			next = s[j]
		}
		switch {
		case c >= utf8.RuneSelf:
			return 0
		case asciiLetter(next) && c != '\r' && c != '\n':
			if asciiPunct(c) {
				for j++; j < len(s) && asciiLetter(s[j]); j++ {
				}
				return j
			}
			j++ // the prefix character
		case asciiPunct(c) || c == ' ' && asciiPunct(next):
			if c == ' ' {
				j++
			}
			for j < len(s) && asciiPunct(s[j]) {
				j++
			}
			if j < len(s) && s[j] >= utf8.RuneSelf {
				return 0 // punctuation or a symbol that is not ASCII may go on with the run
			}
			for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
				j++
			}
			return j
		case byteClass[c]&clsWS != 0 && next < utf8.RuneSelf: // (a letter that is not ASCII may follow as the prefix's)
			return wsMatch(s, i)
		default:
			return 0
		}
	}
	for j < len(s) && asciiLetter(s[j]) {
		j++
	}
	if j < len(s) && s[j] >= utf8.RuneSelf {
		return 0
	}
	return j
}

// isDeepSeek reports whether steps are DeepSeek-V3's three Split steps, by hand and Isolated.
func isDeepSeek(steps []preStep) bool {
	return len(steps) == 3 && steps[0].fast == fastDigits3 && steps[1].fast == fastCJK && steps[2].fast == fastDeepSeek
}

// o200kASCII is o200kNext where ASCII decides the match: a word of ASCII letters (after an
// optional ASCII prefix character) that ends at an ASCII byte, uppercase then lowercase letters
// (U*W+) or uppercase only (U+); a run of ASCII characters that are neither whitespace, letters
// nor digits, after an optional space, and the newlines and slashes after it
// ( ?[^\s\p{L}\p{N}]+[\r\n/]*, which must end at an ASCII byte); whitespace that no letter
// follows (wsMatch). It returns 0 when the general path must decide (and at a digit).
func o200kASCII(s string, i int) int {
	j := i
	if c := s[i]; !asciiLetter(c) {
		next := byte(0)
		if i+1 < len(s) {
			next = s[i+1]
		}
		switch {
		case c >= utf8.RuneSelf || c-'0' < 10:
			return 0
		case asciiLetter(next) && c != '\r' && c != '\n':
			j++ // the prefix character
		default:
			return o200kOther(s, i, c, next)
		}
	}
	u := j
	for u < len(s) && s[u] >= 'A' && s[u] <= 'Z' {
		u++
	}
	w := u
	for w < len(s) && s[w] >= 'a' && s[w] <= 'z' {
		w++
	}
	if w < len(s) && s[w] >= utf8.RuneSelf {
		return 0 // the word may go on
	}
	return withContraction(s, w)
}

// o200kOther is o200kASCII at the ASCII character c, neither a letter nor a digit, that no
// letter follows as its prefix (next: the byte after it, 0 at the end).
func o200kOther(s string, i int, c, next byte) int {
	p := i
	if byteClass[c]&clsWS != 0 {
		if c != ' ' || next >= utf8.RuneSelf || byteClass[next]&(clsWS|clsL|clsN) != 0 || i+1 == len(s) {
			if next >= utf8.RuneSelf {
				return 0 // a letter that is not ASCII may follow, as the prefix's
			}
			return wsMatch(s, i)
		}
		p++ // ' ' before the run
	}
	for p < len(s) && s[p] < utf8.RuneSelf && byteClass[s[p]]&(clsWS|clsL|clsN) == 0 {
		p++
	}
	if p < len(s) && s[p] >= utf8.RuneSelf {
		return 0 // the run may go on
	}
	for p < len(s) && (s[p] == '\r' || s[p] == '\n' || s[p] == '/') {
		p++
	}
	return p
}

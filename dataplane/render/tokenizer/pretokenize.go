package tokenizer

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// span is a piece [start, end) of the text a pre-tokenizer step splits.
type span struct{ start, end int }

// behavior is a Split's SplitDelimiterBehavior.
type behavior uint8

const (
	isolated behavior = iota
	removed
	mergedWithPrevious
	mergedWithNext
	contiguous
)

var behaviors = map[string]behavior{
	"Isolated": isolated, "Removed": removed, "MergedWithPrevious": mergedWithPrevious,
	"MergedWithNext": mergedWithNext, "Contiguous": contiguous,
}

// preStep is one pre-tokenizer step before the final ByteLevel one: a Split, Digits or Metaspace.
type preStep struct {
	meta     *metaspace         // Metaspace: the text rewritten, one piece
	fast     fastKind           // a known pattern, split by hand (exactly as re would)
	ext      *[classLimit]uint8 // extClass(), for the kinds that need it
	re       *regexp2.Regexp    // the general path for Regex patterns
	lit      string             // a String pattern
	behavior behavior
	invert   bool
	digits   bool // Digits: ASCII digits (JS \d) apart from the rest
	single   bool // Digits.individual_digits
}

// byteLevel is the final ByteLevel step: an optional prefix space and GPT-2's split.
type byteLevel struct {
	addPrefixSpace bool
	useRegex       bool
}

// Known pattern strings, split by hand (split_fast.go).
const (
	patternQwen  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patternLlama = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patternGPT2  = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

var knownPatterns = map[string]fastKind{patternQwen: fastQwen, patternLlama: fastLlama, patternGPT2: fastGPT2,
	patternDigits3: fastDigits3, patternCJK: fastCJK, patternDeepSeek: fastDeepSeek, patternO200K: fastO200K}

// parsePreTokenizer returns the steps before the final ByteLevel step, and that step (nil when
// there is none: the vocabulary is then spelled in text, SentencePiece style).
func parsePreTokenizer(raw json.RawMessage) ([]preStep, *byteLevel, error) {
	var steps []preStep
	var bl *byteLevel
	var walk func(path string, raw json.RawMessage) error
	walk = func(path string, raw json.RawMessage) error {
		if isNull(raw) {
			return nil
		}
		typ, err := typeOf(path, raw)
		if err != nil {
			return err
		}
		if bl != nil {
			return errAt(path, "%s after ByteLevel is not supported (ByteLevel must be the last step)", typ)
		}
		switch typ {
		case "Sequence":
			var v struct {
				Pretokenizers []json.RawMessage `json:"pretokenizers"`
			}
			if err := json.Unmarshal(raw, &v); err != nil {
				return errAt(path, "%v", err)
			}
			for i, p := range v.Pretokenizers {
				if err := walk(fmt.Sprintf("%s.pretokenizers[%d]", path, i), p); err != nil {
					return err
				}
			}
			return nil
		case "ByteLevel":
			var v struct {
				AddPrefixSpace *bool `json:"add_prefix_space"`
				UseRegex       *bool `json:"use_regex"`
			}
			if err := json.Unmarshal(raw, &v); err != nil {
				return errAt(path, "%v", err)
			}
			if v.AddPrefixSpace == nil {
				// The Rust library defaults it to true, the reference to false.
				return errAt(path+".add_prefix_space", "missing")
			}
			bl = &byteLevel{addPrefixSpace: *v.AddPrefixSpace, useRegex: v.UseRegex == nil || *v.UseRegex}
			return nil
		case "Metaspace":
			var v struct {
				Replacement    *string `json:"replacement"`
				StrRep         string  `json:"str_rep"`
				PrependScheme  *string `json:"prepend_scheme"`
				AddPrefixSpace *bool   `json:"add_prefix_space"`
			}
			if err := json.Unmarshal(raw, &v); err != nil {
				return errAt(path, "%v", err)
			}
			m := &metaspace{replacement: "▁"}
			if v.Replacement != nil {
				m.replacement = *v.Replacement
			}
			if v.StrRep != "" && v.StrRep != m.replacement {
				return errAt(path+".str_rep", "%q differs from the replacement %q: not supported", v.StrRep, m.replacement)
			}
			scheme := "always"
			if v.PrependScheme != nil {
				scheme = *v.PrependScheme
			}
			switch scheme {
			case "always":
			case "first":
				m.first = true
			case "never":
				m.never = true
			default:
				return errAt(path+".prepend_scheme", "%q is not one of always, first, never", scheme)
			}
			steps = append(steps, preStep{meta: m})
			return nil
		case "Digits":
			var v struct {
				Individual bool `json:"individual_digits"`
			}
			if err := json.Unmarshal(raw, &v); err != nil {
				return errAt(path, "%v", err)
			}
			steps = append(steps, preStep{digits: true, single: v.Individual})
			return nil
		case "Split":
			s, err := parseSplit(path, raw)
			if err != nil {
				return err
			}
			steps = append(steps, s)
			return nil
		default:
			return errAt(path+".type", "%q is not supported (Split, ByteLevel, Digits, Metaspace, Sequence only)", typ)
		}
	}
	if err := walk("pre_tokenizer", raw); err != nil {
		return nil, nil, err
	}
	return steps, bl, nil
}

func parseSplit(path string, raw json.RawMessage) (preStep, error) {
	var v struct {
		Pattern struct {
			String *string `json:"String"`
			Regex  *string `json:"Regex"`
		} `json:"pattern"`
		Behavior string `json:"behavior"`
		Invert   bool   `json:"invert"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return preStep{}, errAt(path, "%v", err)
	}
	b, ok := behaviors[v.Behavior]
	if !ok {
		return preStep{}, errAt(path+".behavior", "%q is not one of Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous", v.Behavior)
	}
	s := preStep{behavior: b, invert: v.Invert}
	switch {
	case v.Pattern.String != nil:
		if *v.Pattern.String == "" {
			return preStep{}, errAt(path+".pattern.String", "empty pattern is not supported")
		}
		s.lit = *v.Pattern.String
	case v.Pattern.Regex != nil:
		p := *v.Pattern.Regex
		s.fast = knownPatterns[p]
		if s.fast.gaps() && (b != isolated || v.Invert) {
			s.fast = 0 // its splitter makes Isolated pieces, not matches
		}
		if s.fast >= fastDigits3 {
			s.ext = extClass()
		}
		re, err := compileRegex(p)
		if err != nil {
			return preStep{}, errAt(path+".pattern.Regex", "%v", err)
		}
		s.re = re
	default:
		return preStep{}, errAt(path+".pattern", "neither String nor Regex")
	}
	return s, nil
}

// compileRegex translates an Oniguruma pattern (tokenizer.json's dialect) into regexp2's .NET
// dialect with the reference's semantics, then compiles it without a backtracking limit.
func compileRegex(p string) (*regexp2.Regexp, error) {
	tr, err := translateRegex(p)
	if err != nil {
		return nil, err
	}
	return regexp2.Compile(tr, regexp2.None, regexp2.OptionMaxBacktrackingStackSize(-1))
}

// whiteSpace is Unicode's White_Space, which the reference puts in place of \s (it rewrites
// \s to \p{White_Space}, as Oniguruma means it).
const whiteSpace = `\u0009-\u000D\u0020\u0085\u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000`

var quantBrace = regexp.MustCompile(`^\{(\d+(?:,\d*)?|,\d+)\}`)

// translateRegex rewrites the constructs whose meaning differs between Oniguruma, the
// reference's rewrite to a JS RegExp, and regexp2: \s becomes White_Space, (?i:...) folds
// ASCII letters only, possessive '+' is dropped, groups do not capture. Constructs it cannot
// map exactly (\w, \b, anchors, back-references, classes under (?i:...), ...) are errors.
func translateRegex(p string) (string, error) {
	var b strings.Builder
	var folds []bool
	fold := false
	afterQuant := false
	for i := 0; i < len(p); {
		r, n := utf8.DecodeRuneInString(p[i:])
		wasQuant := afterQuant
		afterQuant = false
		switch r {
		case '\\':
			frag, m, err := translateEscape(p, i, false, fold)
			if err != nil {
				return "", err
			}
			b.WriteString(frag)
			i += m
		case '[':
			if fold {
				return "", fmt.Errorf("character class inside (?i:...) at index %d is not supported", i)
			}
			frag, m, err := translateClass(p, i)
			if err != nil {
				return "", err
			}
			b.WriteString(frag)
			i += m
		case '(':
			folds = append(folds, fold)
			rest := p[i:]
			switch {
			case strings.HasPrefix(rest, "(?i:"):
				fold = true
				b.WriteString("(?:")
				i += 4
			case strings.HasPrefix(rest, "(?:"), strings.HasPrefix(rest, "(?="), strings.HasPrefix(rest, "(?!"):
				b.WriteString(rest[:3])
				i += 3
			case strings.HasPrefix(rest, "(?<="), strings.HasPrefix(rest, "(?<!"):
				b.WriteString(rest[:4])
				i += 4
			case strings.HasPrefix(rest, "(?"):
				return "", fmt.Errorf("group %q at index %d is not supported", rest[:min(len(rest), 4)], i)
			default:
				b.WriteString("(?:")
				i++
			}
		case ')':
			if len(folds) == 0 {
				return "", fmt.Errorf("unbalanced ')' at index %d", i)
			}
			fold = folds[len(folds)-1]
			folds = folds[:len(folds)-1]
			b.WriteByte(')')
			i++
		case '|':
			b.WriteByte('|')
			i++
		case '*', '+', '?':
			if wasQuant {
				switch r {
				case '+': // possessive: the reference drops it
					i++
					continue
				case '?': // lazy
					b.WriteByte('?')
					i++
					continue
				}
				return "", fmt.Errorf("nested quantifier at index %d is not supported", i)
			}
			b.WriteRune(r)
			i++
			afterQuant = true
		case '{':
			m := quantBrace.FindStringSubmatch(p[i:])
			if m == nil {
				b.WriteString(`\{`)
				i++
				continue
			}
			body := m[1]
			if body[0] == ',' {
				body = "0" + body
			}
			i += len(m[0])
			if i < len(p) && (p[i] == '+' || p[i] == '*') {
				return "", fmt.Errorf("quantifier %s%c at index %d is not supported", m[0], p[i], i-len(m[0]))
			}
			b.WriteString("{" + body + "}")
			afterQuant = true
		case '}', ']':
			b.WriteString(`\` + string(r))
			i++
		case '.':
			b.WriteString(`[^\n]`)
			i++
		case '^', '$':
			return "", fmt.Errorf("anchor %q at index %d is not supported", r, i)
		default:
			b.WriteString(literal(r, fold))
			i += n
		}
	}
	if len(folds) != 0 {
		return "", fmt.Errorf("unbalanced '('")
	}
	return b.String(), nil
}

// literal spells one character for regexp2, ASCII-folded under (?i:...) as the reference does.
func literal(r rune, fold bool) string {
	switch {
	case fold && r < 0x80 && unicode.IsLetter(r):
		return "[" + string(unicode.ToLower(r)) + string(unicode.ToUpper(r)) + "]"
	case strings.ContainsRune(`\*+?|{}[]()^$.#-`, r):
		return `\` + string(r) // regexp2 refuses escapes of other word characters, such as \_
	case r == utf8.RuneError || r < 0x20 || r == 0x7F || (r >= 0x80 && r < 0xA0):
		return fmt.Sprintf(`\u%04X`, r)
	default:
		return string(r)
	}
}

// translateEscape translates the escape at p[i], inside a character class or not.
func translateEscape(p string, i int, inClass, fold bool) (string, int, error) {
	if i+1 >= len(p) {
		return "", 0, fmt.Errorf("trailing backslash")
	}
	r, n := utf8.DecodeRuneInString(p[i+1:])
	switch r {
	case 'p', 'P':
		end := strings.IndexByte(p[i:], '}')
		if i+2 >= len(p) || p[i+2] != '{' || end < 0 {
			return "", 0, fmt.Errorf(`\%c at index %d: want \%c{Name}`, r, i, r)
		}
		name := p[i+3 : i+end]
		if _, ok := unicode.Categories[name]; !ok {
			if _, ok := unicode.Scripts[name]; !ok {
				return "", 0, fmt.Errorf(`\%c{%s} at index %d: only general categories and scripts are supported`, r, name, i)
			}
		}
		return p[i : i+end+1], end + 1, nil
	case 'x':
		if i+2 < len(p) && p[i+2] == '{' {
			end := strings.IndexByte(p[i:], '}')
			if end < 0 {
				return "", 0, fmt.Errorf(`unterminated \x{ at index %d`, i)
			}
			return hexLiteral(p[i+3:i+end], i, end+1, fold)
		}
		if i+4 <= len(p) {
			return hexLiteral(p[i+2:i+4], i, 4, fold)
		}
	case 'u':
		if i+6 <= len(p) {
			return hexLiteral(p[i+2:i+6], i, 6, fold)
		}
	case 'r', 'n', 't', 'f', 'v':
		return p[i : i+2], 2, nil
	case 'a':
		return `\u0007`, 2, nil
	case 'e':
		return `\u001B`, 2, nil
	case 'd':
		return `\p{Nd}`, 2, nil
	case 'D':
		return `\P{Nd}`, 2, nil
	case 's':
		if inClass {
			return whiteSpace, 2, nil
		}
		return "[" + whiteSpace + "]", 2, nil
	case 'S':
		if inClass {
			return "", 0, fmt.Errorf(`\S inside a character class at index %d is not supported`, i)
		}
		return "[^" + whiteSpace + "]", 2, nil
	}
	if r < 0x80 && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
		return "", 0, fmt.Errorf(`escape \%c at index %d is not supported`, r, i)
	}
	return literal(r, false), 1 + n, nil
}

func hexLiteral(hex string, i, n int, fold bool) (string, int, error) {
	var v rune
	if len(hex) == 0 || len(hex) > 8 {
		return "", 0, fmt.Errorf("bad hex escape at index %d", i)
	}
	for _, c := range hex {
		d := strings.IndexRune("0123456789abcdef", unicode.ToLower(c))
		if d < 0 {
			return "", 0, fmt.Errorf("bad hex escape at index %d", i)
		}
		v = v<<4 | rune(d)
	}
	if !utf8.ValidRune(v) {
		return "", 0, fmt.Errorf("bad code point in escape at index %d", i)
	}
	return literal(v, fold), n, nil
}

// translateClass translates the character class starting at p[i].
func translateClass(p string, i int) (string, int, error) {
	var b strings.Builder
	b.WriteByte('[')
	j := i + 1
	if j < len(p) && p[j] == '^' {
		b.WriteByte('^')
		j++
	}
	first := j
	prevSet := false // the last item was a set (\s, \p{..}): a '-' may not follow
	for j < len(p) {
		r, n := utf8.DecodeRuneInString(p[j:])
		switch {
		case r == ']' && j > first:
			b.WriteByte(']')
			return b.String(), j + 1 - i, nil
		case r == '\\':
			frag, m, err := translateEscape(p, j, true, false)
			if err != nil {
				return "", 0, err
			}
			b.WriteString(frag)
			c := p[j+1]
			prevSet = c == 's' || c == 'p' || c == 'P' || c == 'd' || c == 'D'
			j += m
			continue
		case r == '[':
			return "", 0, fmt.Errorf("nested or POSIX class at index %d is not supported", j)
		case r == '&' && strings.HasPrefix(p[j:], "&&"):
			return "", 0, fmt.Errorf("class intersection at index %d is not supported", j)
		case r == '-':
			last := j+1 < len(p) && p[j+1] == ']'
			if prevSet && !last {
				return "", 0, fmt.Errorf("range from a set at index %d is not supported", j)
			}
			if j == first || last {
				b.WriteString(`\-`)
			} else {
				b.WriteByte('-')
			}
		default:
			b.WriteString(literal(r, false))
		}
		prevSet = false
		j += n
	}
	return "", 0, fmt.Errorf("unterminated character class at index %d", i)
}

// each calls emit with the pieces of s after this step, in order, following the Rust library's
// Split semantics: matches and the gaps between them, the matches flipped by invert, then merged
// or removed by the behaviour; empty pieces are dropped. It holds at most one piece back (a
// merge joins a piece with its neighbour only), so that its memory does not grow with s, and it
// stops when emit returns false.
func (p *preStep) each(s string, st *state, emit func(span) bool) {
	if p.digits {
		eachDigits(s, p.single, emit)
		return
	}
	var (
		pend      span
		has       bool // pend holds a piece not emitted yet
		prevMatch bool
	)
	out := func(x span) bool { return x.end <= x.start || emit(x) }
	piece := func(x span, match bool) bool {
		match = match != p.invert
		ok := true
		switch p.behavior {
		case isolated:
			ok = out(x)
		case removed:
			if !match {
				ok = out(x)
			}
		case mergedWithPrevious, contiguous:
			// A match joins the piece before it when that one is not a match (contiguous: a piece
			// joins the one before it when both match or both do not).
			join := match && !prevMatch
			if p.behavior == contiguous {
				join = match == prevMatch
			}
			if has && join {
				pend.end = x.end
			} else {
				if has {
					ok = out(pend)
				}
				pend, has = x, true
			}
		case mergedWithNext:
			// A match joins the piece after it when that one is not a match: pend is a match
			// waiting for its next piece.
			switch {
			case has && !match:
				ok, has = out(span{pend.start, x.end}), false
			case match:
				if has {
					ok = out(pend)
				}
				pend, has = x, true
			default:
				ok = out(x)
			}
		}
		prevMatch = match
		return ok
	}
	prev := 0
	stopped := false
	p.eachMatch(s, st, func(m span) bool {
		if m.start > prev && !piece(span{prev, m.start}, false) || !piece(m, true) {
			stopped = true
			return false
		}
		prev = m.end
		return true
	})
	if stopped {
		return
	}
	if (prev < len(s) || len(s) == 0) && !piece(span{prev, len(s)}, false) {
		return
	}
	if has {
		out(pend)
	}
}

// eachMatch calls yield with the non-overlapping matches of the step's pattern in s, in order,
// until it returns false. The general path matches over s decoded to runes once (st.runes, 4
// bytes a character), without a value per match.
func (p *preStep) eachMatch(s string, st *state, yield func(span) bool) {
	switch {
	case p.fast != 0:
		for i := 0; i < len(s); {
			end := p.fast.next(s, i, p.ext)
			if !yield(span{i, end}) {
				return
			}
			i = end
		}
	case p.re != nil:
		runes := st.runes[:0]
		if n := utf8.RuneCountInString(s); cap(runes) < n {
			runes = make([]rune, 0, n)
		}
		for _, r := range s {
			runes = append(runes, r)
		}
		st.runes = runes
		// byteAt maps a rune index to its byte offset, walking forward: matches come in order.
		bi, ri := 0, 0
		byteAt := func(r int) int {
			if len(runes) == len(s) {
				return r
			}
			for ; ri < r; ri++ {
				_, n := utf8.DecodeRuneInString(s[bi:])
				bi += n
			}
			return bi
		}
		err := p.re.FindRunesMatches(runes, 0, func(m regexp2.MatchView) bool {
			at, n, _ := m.GroupRange(0)
			start := byteAt(at)
			return yield(span{start, byteAt(at + n)})
		})
		if err != nil {
			// Unreachable: no timeout and no backtracking limit are set.
			panic("tokenizer: regexp2: " + err.Error())
		}
	default:
		for i := 0; ; {
			j := strings.Index(s[i:], p.lit)
			if j < 0 {
				return
			}
			if !yield(span{i + j, i + j + len(p.lit)}) {
				return
			}
			i += j + len(p.lit)
		}
	}
}

// eachDigits is the reference's Digits: runs of ASCII digits (JS \d), or single digits, and
// runs of everything else.
func eachDigits(s string, single bool, emit func(span) bool) {
	isDigit := func(c byte) bool { return c >= '0' && c <= '9' }
	for i := 0; i < len(s); {
		j := i + 1
		if isDigit(s[i]) {
			if !single {
				for j < len(s) && isDigit(s[j]) {
					j++
				}
			}
		} else {
			for j < len(s) && !isDigit(s[j]) {
				j++
			}
		}
		if !emit(span{i, j}) {
			return
		}
		i = j
	}
}

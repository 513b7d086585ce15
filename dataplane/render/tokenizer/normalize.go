package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
	"unsafe"

	"golang.org/x/text/unicode/norm"
)

// normStep is one normalizer. apply returns s itself, a substring of it, or (used == true) a
// string written into *buf, which the caller guarantees does not hold s.
type normStep interface {
	apply(buf *[]byte, s string, st *state) (out string, used bool)
}

// normalize runs the normalizer chain over s, ping-ponging between the state's two buffers.
func (t *Tokenizer) normalize(st *state, s string) string {
	return runNorm(t.norm, st, s)
}

func runNorm(steps []normStep, st *state, s string) string {
	cur := -1 // which buffer holds s; -1: the caller's string
	for _, step := range steps {
		k := 0
		if cur == 0 {
			k = 1
		}
		out, used := step.apply(&st.norm[k], s, st)
		if used {
			cur = k
		}
		s = out
	}
	return s
}

// bufString views b as a string; b must not change while the string is in use.
func bufString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

func parseNormalizer(path string, raw json.RawMessage) ([]normStep, error) {
	if isNull(raw) {
		return nil, nil
	}
	typ, err := typeOf(path, raw)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "NFC":
		return []normStep{newUnicodeNorm(norm.NFC)}, nil
	case "NFD":
		return []normStep{newUnicodeNorm(norm.NFD)}, nil
	case "NFKC":
		return []normStep{newUnicodeNorm(norm.NFKC)}, nil
	case "NFKD":
		return []normStep{newUnicodeNorm(norm.NFKD)}, nil
	case "Lowercase":
		return []normStep{lowercase{}}, nil
	case "Sequence":
		var v struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, errAt(path, "%v", err)
		}
		var steps []normStep
		for i, n := range v.Normalizers {
			sub, err := parseNormalizer(fmt.Sprintf("%s.normalizers[%d]", path, i), n)
			if err != nil {
				return nil, err
			}
			steps = append(steps, sub...)
		}
		return steps, nil
	case "Prepend":
		var v struct {
			Prepend *string `json:"prepend"`
		}
		if err := json.Unmarshal(raw, &v); err != nil || v.Prepend == nil {
			return nil, errAt(path+".prepend", "missing or not a string")
		}
		return []normStep{prepend{*v.Prepend}}, nil
	case "Strip":
		var v struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, errAt(path, "%v", err)
		}
		return []normStep{strip{v.Left, v.Right}}, nil
	case "Replace":
		var v struct {
			Pattern struct {
				String *string `json:"String"`
				Regex  *string `json:"Regex"`
			} `json:"pattern"`
			Content *string `json:"content"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, errAt(path, "%v", err)
		}
		switch {
		case v.Pattern.String == nil:
			return nil, errAt(path+".pattern", "only String patterns are supported in Replace")
		case *v.Pattern.String == "":
			return nil, errAt(path+".pattern.String", "empty pattern is not supported")
		case v.Content == nil:
			return nil, errAt(path+".content", "missing")
		case strings.Contains(*v.Content, "$"):
			// The reference runs String.replaceAll, where "$&", "$1"... are substitutions.
			return nil, errAt(path+".content", "%q: '$' is not supported", *v.Content)
		}
		return []normStep{replace{*v.Pattern.String, *v.Content}}, nil
	default:
		return nil, errAt(path+".type", "%q is not supported (NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip, Sequence only)", typ)
	}
}

// unicodeNorm is NFC/NFD/NFKC/NFKD (Unicode 15.0 tables of golang.org/x/text).
type unicodeNorm struct {
	form norm.Form
	safe *quickSafe // normquick.go
}

func newUnicodeNorm(f norm.Form) unicodeNorm { return unicodeNorm{f, quickTables[f]()} }

// apply normalizes with the state's norm.Iter: unlike Form.IsNormalString and
// Form.AppendString, it does not allocate.
func (n unicodeNorm) apply(buf *[]byte, s string, st *state) (string, bool) {
	if isNormal(n.form, n.safe, s) || n.form.QuickSpanString(s) == len(s) {
		return s, false
	}
	b := (*buf)[:0]
	st.iter.InitString(n.form, s)
	for !st.iter.Done() {
		b = append(b, st.iter.Next()...)
	}
	*buf = b
	return bufString(b), true
}

// prepend puts a string before the text (always: sections are never empty when normalized).
type prepend struct{ s string }

func (p prepend) apply(buf *[]byte, s string, _ *state) (string, bool) {
	*buf = append(append((*buf)[:0], p.s...), s...)
	return bufString(*buf), true
}

// replace substitutes every non-overlapping occurrence of a literal, leftmost first.
type replace struct{ old, new string }

func (r replace) apply(buf *[]byte, s string, _ *state) (string, bool) {
	i := strings.Index(s, r.old)
	if i < 0 {
		return s, false
	}
	b := (*buf)[:0]
	for i >= 0 {
		b = append(append(b, s[:i]...), r.new...)
		s = s[i+len(r.old):]
		i = strings.Index(s, r.old)
	}
	b = append(b, s...)
	*buf = b
	return bufString(b), true
}

// strip trims ECMAScript whitespace (String.prototype.trim), as the reference does.
type strip struct{ left, right bool }

func (p strip) apply(_ *[]byte, s string, _ *state) (string, bool) {
	if p.left {
		s = strings.TrimLeftFunc(s, isJSSpace)
	}
	if p.right {
		s = strings.TrimRightFunc(s, isJSSpace)
	}
	return s, false
}

// isJSSpace is ECMAScript's WhiteSpace or LineTerminator (JS \s and trim): unlike Unicode
// White_Space it has U+FEFF and lacks U+0085.
func isJSSpace(r rune) bool {
	switch {
	case r < 0x80:
		return r == ' ' || (r >= '\t' && r <= '\r')
	case r == 0xA0 || r == 0x1680 || r == 0x2028 || r == 0x2029 || r == 0x202F || r == 0x205F || r == 0x3000 || r == 0xFEFF:
		return true
	default:
		return r >= 0x2000 && r <= 0x200A
	}
}

// lowercase is String.prototype.toLowerCase: the simple lowercase mapping, plus U+0130 to
// "i̇" and the Final_Sigma rule for U+03A3.
type lowercase struct{}

func (lowercase) apply(buf *[]byte, s string, _ *state) (string, bool) {
	i := 0
	for i < len(s) {
		c := s[i]
		if c < utf8.RuneSelf {
			if 'A' <= c && c <= 'Z' {
				break
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if unicode.ToLower(r) != r || r == 0x130 {
			break
		}
		i += n
	}
	if i == len(s) {
		return s, false
	}
	b := (*buf)[:0]
	b = append(b, s[:i]...)
	for j := i; j < len(s); {
		r, n := utf8.DecodeRuneInString(s[j:])
		switch r {
		case 0x130:
			b = append(b, "i\u0307"...)
		case 0x3A3:
			if finalSigma(s, j, j+n) {
				b = utf8.AppendRune(b, 0x3C2)
			} else {
				b = utf8.AppendRune(b, 0x3C3)
			}
		default:
			b = utf8.AppendRune(b, unicode.ToLower(r))
		}
		j += n
	}
	*buf = b
	return bufString(b), true
}

// finalSigma is Unicode's Final_Sigma condition for the sigma at s[start:end].
func finalSigma(s string, start, end int) bool {
	before := false
	for i := start; i > 0; {
		r, n := utf8.DecodeLastRuneInString(s[:i])
		i -= n
		if caseIgnorable(r) {
			continue
		}
		before = cased(r)
		break
	}
	if !before {
		return false
	}
	for i := end; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		i += n
		if caseIgnorable(r) {
			continue
		}
		return !cased(r)
	}
	return true
}

func cased(r rune) bool {
	return unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r) ||
		unicode.Is(unicode.Other_Lowercase, r) || unicode.Is(unicode.Other_Uppercase, r)
}

func caseIgnorable(r rune) bool {
	switch r {
	case '\'', '.', ':', 0xB7, 0x387, 0x55F, 0x5F4, 0x2018, 0x2019, 0x2024, 0x2027, 0xFE13, 0xFE52, 0xFE55, 0xFF07, 0xFF0E, 0xFF1A:
		return true // Word_Break MidLetter, MidNumLet, Single_Quote
	}
	return unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf, unicode.Lm, unicode.Sk)
}

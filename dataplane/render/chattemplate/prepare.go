package chattemplate

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// prepare turns a chat template into the source the engine compiles, doing in Go what the engine
// gets wrong or cannot be configured for:
//
//   - Whitespace control. Jinja2's lexer (HF uses trim_blocks and lstrip_blocks) decides what text
//     survives next to each tag; the engine reimplements it with heuristics that skip over {{ }}
//     tags ("{{ x }}\n{% endfor %}" loses its newline) and ignore '+' markers. prepare applies
//     Jinja2's rules itself and hands the engine every text run as a {{ "literal" }}, leaving it
//     nothing to trim.
//   - Source normalization: line breaks become "\n" and one trailing newline is dropped
//     (keep_trailing_newline=False).
//   - Concatenations printed in parts: {{ "<|im_start|>" + role + "\n" + content }} becomes one
//     {{ }} per operand (splitConcat), so that a long message is written out once instead of being
//     copied by every '+' after it.
//   - Filter overrides: the engine resolves filters among its built-ins first and has no API to
//     replace one, so "| tojson" and "| trim" are renamed to variables holding HF's versions.
//   - Python's strictness where templates rely on it: operand types of '+' and "in", and no
//     attribute or item of an undefined value (strict.go; not checked on a name loopScope
//     proves defined, scope.go).
//
// Tags are delimited as the engine does (quotes hide a closer; braces are not balanced), so what
// it parses is what was whitespace-processed here.
func prepare(src string) string {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n")
	segs := lex(src)
	trimText(segs)
	scope := newLoopScope(segs)
	var out strings.Builder
	out.Grow(len(src) + len(src)/4)
	for _, s := range segs {
		var emit string
		switch s.kind {
		case segText:
			if s.text != "" {
				emit = `{{ "` + quoteEscaper.Replace(s.text) + `" }}`
			}
		case segVar:
			expr := strictIn(strictAccessIn(rewriteTag(s.text), scope.defined()), false)
			if parts := splitConcat(expr); parts != nil {
				for i, p := range parts[1:] {
					if p[0] != '"' || literalEnd(p, 0) != len(p)-1 {
						parts[i+1] = "__hf_cat(" + p + ")" // strict.go
					}
				}
				emit = "{{ " + strings.Join(parts, " }}{{ ") + " }}"
			} else {
				emit = "{{ " + strictAdd(expr) + " }}"
			}
		case segBlock:
			fields := strings.Fields(s.text)
			tag := rewriteTag(s.text)
			switch {
			case len(fields) > 0 && fields[0] == "set": // the target is not an access: only the value
				if i := assignAt(tag); i > 0 {
					tag = tag[:i+1] + " " + strictAdd(strictIn(strictAccessIn(strings.TrimSpace(tag[i+1:]), scope.defined()), false))
				}
			default:
				tag = strictIn(strictAccessIn(tag, scope.defined()), len(fields) > 0 && fields[0] == "for")
			}
			scope.enter(s.text)
			emit = "{% " + tag + " %}"
		}
		out.WriteString(emit)
		// Keep the engine's line numbers (in its errors) those of the original source.
		if lost := strings.Count(s.src, "\n") - strings.Count(emit, "\n"); lost > 0 {
			out.WriteString("{#" + strings.Repeat("\n", lost) + "#}")
		}
	}
	return out.String()
}

type segKind int

const (
	segText     segKind = iota
	segVar              // {{ }}
	segBlock            // {% %}
	segComment          // {# #}
	segRawOpen          // {% raw %}; its content follows as one text segment, then segRawClose
	segRawClose         // {% endraw %}
)

// segment is a run of text or a tag; for a tag, text is its content without delimiters and
// markers, and lmark/rmark are its whitespace-control markers ('-', '+' or 0). src is the
// segment's original source.
type segment struct {
	kind         segKind
	text, src    string
	lmark, rmark byte
}

var endRaw = regexp.MustCompile(`\{%([-+]?)\s*endraw\s*([-+]?)%\}`)

// lex splits src into text and tags; an unclosed tag is left as text for the engine to report.
func lex(src string) []segment {
	var segs []segment
	text := func(s string) {
		if s != "" {
			segs = append(segs, segment{kind: segText, text: s, src: s})
		}
	}
	from := 0 // where to look for the next '{' in src
	for {
		i := strings.IndexByte(src[from:], '{')
		if i < 0 || from+i+1 >= len(src) {
			text(src)
			return segs
		}
		i += from
		kind, closer := segVar, "}}"
		switch src[i+1] {
		case '{':
		case '%':
			kind, closer = segBlock, "%}"
		case '#':
			kind, closer = segComment, "#}"
		default:
			from = i + 1
			continue
		}
		end := tagEnd(src, i+2, closer, kind != segComment)
		if end < 0 {
			text(src)
			return segs
		}
		text(src[:i])
		tag := segment{kind: kind, text: src[i+2 : end-2], src: src[i:end]}
		if t := tag.text; t != "" && (t[0] == '-' || t[0] == '+') {
			tag.lmark, tag.text = t[0], t[1:]
		}
		if t := tag.text; t != "" && (t[len(t)-1] == '-' || t[len(t)-1] == '+' && kind != segVar) {
			tag.rmark, tag.text = t[len(t)-1], t[:len(t)-1]
		}
		src, from = src[end:], 0
		if kind == segBlock && strings.TrimSpace(tag.text) == "raw" {
			if m := endRaw.FindStringSubmatchIndex(src); m != nil {
				tag.kind = segRawOpen
				segs = append(segs, tag, segment{kind: segText, text: src[:m[0]], src: src[:m[0]]},
					segment{kind: segRawClose, src: src[m[0]:m[1]], lmark: markAt(src, m[2], m[3]), rmark: markAt(src, m[4], m[5])})
				src = src[m[1]:]
				continue
			}
		}
		segs = append(segs, tag)
	}
}

func markAt(s string, i, j int) byte {
	if i < j {
		return s[i]
	}
	return 0
}

// tagEnd returns the index just past closer for a tag whose content starts at i, or -1. In
// {{ }} and {% %} a quoted string (with backslash escapes) hides the closer.
func tagEnd(src string, i int, closer string, quotes bool) int {
	for i < len(src) {
		c := src[i]
		if quotes && (c == '\'' || c == '"') {
			for i++; i < len(src) && src[i] != c; i++ {
				if src[i] == '\\' {
					i++
				}
			}
			i++
			continue
		}
		if strings.HasPrefix(src[i:], closer) {
			return i + 2
		}
		i++
	}
	return -1
}

// trimText applies Jinja2's whitespace control (trim_blocks and lstrip_blocks on, as in HF) to
// the text segments, as its lexer does: first the previous tag's right side ("-" strips all
// whitespace, else a block or comment drops one newline), then the next tag's left side ("-"
// strips all whitespace, else before a block or comment the indentation of the tag's line goes if
// only whitespace precedes the tag on that line).
func trimText(segs []segment) {
	for i := range segs {
		s := &segs[i]
		if s.kind != segText {
			continue
		}
		lineStart := i == 0
		if i > 0 {
			prev := segs[i-1]
			switch {
			case prev.rmark == '-':
				rest := strings.TrimLeftFunc(s.text, pyIsSpace)
				lineStart = strings.HasSuffix(s.text[:len(s.text)-len(rest)], "\n")
				s.text = rest
			case prev.rmark != '+' && (prev.kind == segBlock || prev.kind == segComment || prev.kind == segRawClose) && strings.HasPrefix(s.text, "\n"):
				s.text, lineStart = s.text[1:], true
			}
		}
		if i+1 < len(segs) {
			next := segs[i+1]
			switch {
			case next.lmark == '-':
				s.text = strings.TrimRightFunc(s.text, pyIsSpace)
			case next.lmark != '+' && next.kind != segVar:
				lpos := strings.LastIndexByte(s.text, '\n') + 1
				if (lpos > 0 || lineStart) && lpos < len(s.text) && allSpace(s.text[lpos:]) {
					s.text = s.text[:lpos]
				}
			}
		}
	}
}

func allSpace(s string) bool {
	for _, r := range s {
		if !pyIsSpace(r) {
			return false
		}
	}
	return true
}

// rewriteTag rewrites a tag's content: "| name" applications of filterOverrides' filters are
// renamed, and string literals are decoded as Python does (\r, \xhh, \uXXXX, octal, ...: the
// engine knows only \n, \t, \\ and the quotes) and written back with only \\ and \" escaped.
func rewriteTag(tag string) string {
	var out strings.Builder
	for i := 0; i < len(tag); i++ {
		switch c := tag[i]; c {
		case '\'', '"':
			j := i + 1
			for j < len(tag) && tag[j] != c {
				if tag[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(tag) { // unterminated: leave it to the engine
				out.WriteString(tag[i:])
				return out.String()
			}
			out.WriteByte('"')
			out.WriteString(quoteEscaper.Replace(pyUnescape(tag[i+1 : j])))
			out.WriteByte('"')
			i = j
		case '|':
			j := i + 1
			for j < len(tag) && strings.IndexByte(" \t\n", tag[j]) >= 0 {
				j++
			}
			k := j
			for k < len(tag) && isIdent(tag[k]) {
				k++
			}
			out.WriteString(tag[i:j])
			if repl, ok := filterOverrides[tag[j:k]]; ok {
				out.WriteString(repl)
			} else {
				out.WriteString(tag[j:k])
			}
			i = k - 1
		default:
			out.WriteByte(c)
		}
	}
	return out.String()
}

// splitConcat returns the operands of an output expression that the engine prints as the
// concatenation of their printed values, or nil: a chain of '+' whose first operand is a string
// literal (the engine's '+' with a string on either side joins both sides printed, so every
// step of the chain is a string) and with no other operator at its top level (all others bind
// less tightly than '+', or as tightly, as '-' does). Operands are evaluated left to right in
// both forms, and a failing one fails the render in both. expr is rewriteTag's output: its string
// literals are double-quoted, with only \\ and \" escaped.
func splitConcat(expr string) []string {
	parts := addChain(expr)
	if parts == nil {
		return nil
	}
	if first := parts[0]; first[0] != '"' || literalEnd(first, 0) != len(first)-1 {
		return nil
	}
	return parts
}

// addChain returns the operands of expr when it is a chain of '+' with no other operator at its
// top level (so the chain is the whole expression: every other binary operator binds less
// tightly than '+', or as tightly, as '-' and '~' do), or nil.
func addChain(expr string) []string {
	var parts []string
	depth, start := 0, 0
	for i := 0; i < len(expr); i++ {
		c := expr[i]
		switch {
		case c == '"':
			i = literalEnd(expr, i)
			if i < 0 {
				return nil
			}
		case c == '(' || c == '[' || c == '{':
			depth++
		case c == ')' || c == ']' || c == '}':
			depth--
		case depth > 0:
		case c == '+':
			parts = append(parts, strings.TrimSpace(expr[start:i]))
			start = i + 1
		case strings.IndexByte("-~<>=!", c) >= 0:
			return nil
		case isIdent(c):
			j := i
			for j < len(expr) && isIdent(expr[j]) {
				j++
			}
			word := expr[i:j]
			if c >= '0' && c <= '9' && strings.ContainsAny(word, "eE") {
				return nil // an exponent's sign is not an operator
			}
			if slices.Contains([]string{"if", "else", "and", "or", "not", "in", "is"}, word) {
				return nil
			}
			i = j - 1
		}
	}
	if len(parts) == 0 || depth != 0 {
		return nil
	}
	parts = append(parts, strings.TrimSpace(expr[start:]))
	if slices.Contains(parts, "") {
		return nil // a unary '+'
	}
	return parts
}

// literalEnd is the index of the quote closing the double-quoted literal that opens at s[i], or
// -1.
func literalEnd(s string, i int) int {
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case '"':
			return j
		}
	}
	return -1
}

var quoteEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`)

// pyUnescape decodes a string literal's body as Jinja2 does (Python's unicode-escape): an
// unknown escape keeps its backslash.
func pyUnescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		i++
		switch c := s[i]; c {
		case '\n':
			// line continuation: dropped
		case '\\', '\'', '"':
			b.WriteByte(c)
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'v':
			b.WriteByte('\v')
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[c]
			r, err := strconv.ParseUint(s[i+1:min(len(s), i+1+n)], 16, 32)
			if err != nil || i+1+n > len(s) || r > unicode.MaxRune {
				b.WriteByte('\\')
				b.WriteByte(c)
				continue
			}
			b.WriteRune(rune(r))
			i += n
		case '0', '1', '2', '3', '4', '5', '6', '7':
			j := i
			for j < len(s) && j < i+3 && s[j] >= '0' && s[j] <= '7' {
				j++
			}
			r, _ := strconv.ParseUint(s[i:j], 8, 32)
			b.WriteRune(rune(r))
			i = j - 1
		default:
			b.WriteByte('\\')
			b.WriteByte(c)
		}
	}
	return b.String()
}

func isIdent(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

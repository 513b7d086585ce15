package jinja

import "strings"

// output is a render's text. Given the text the render is expected to begin with (in pieces:
// RenderAfter), it compares what is written with that text instead of copying it: the bytes
// that match are counted, and the text is kept from the first one that differs. A multi-turn
// conversation renders its earlier turns as it did the turn before; the bytes already held
// elsewhere are then read once and never copied.
type output struct {
	b        strings.Builder
	expect   []string // the expected pieces not yet matched: expect[0][off:] comes next
	all      []string // the expected pieces, whole
	off      int
	matched  int  // the bytes matched
	diverged bool // a byte differed, or the expected text ran out: b holds the rest
	spans    []Span
}

// Span is a memoized iteration's output within a render's rest (RenderOptions.Spans): At is its
// offset in rest, Text the Iteration's own string (its bytes are rest's from At on), Size the
// bytes of Text's array (Go rounds an allocation up to a size class).
type Span struct {
	At, Size int
	Text     string
}

// span notes that the text from byte start on is s (its array of size bytes), a memoized
// iteration's output, when all of it is after the matched bytes.
func (o *output) span(start int, s string, size int) {
	if start >= o.matched && len(s) > 0 {
		o.spans = append(o.spans, Span{At: start - o.matched, Size: size, Text: s})
	}
}

// WriteString appends s.
func (o *output) WriteString(s string) {
	if !o.diverged {
		n := o.match(s)
		if n == len(s) {
			return
		}
		o.diverged, s = true, s[n:]
	}
	o.b.WriteString(s)
}

// match consumes the expected bytes s begins with, and returns how many.
func (o *output) match(s string) int {
	n := 0
	for n < len(s) && len(o.expect) > 0 {
		p := o.expect[0][o.off:]
		k := min(len(p), len(s)-n)
		if s[n:n+k] != p[:k] {
			i := 0
			for s[n+i] == p[i] {
				i++
			}
			n += i
			break
		}
		n, o.off = n+k, o.off+k
		if o.off == len(o.expect[0]) {
			o.expect, o.off = o.expect[1:], 0
		}
	}
	o.matched += n
	return n
}

// Len is the text's length so far, matched bytes included.
func (o *output) Len() int { return o.matched + o.b.Len() }

// since is the text from byte start on, its own copy, and the size of the copy's array (Go
// rounds an allocation up to a size class).
func (o *output) since(start int) (string, int) {
	var s strings.Builder
	s.Grow(o.Len() - start)
	if start < o.matched {
		at := 0
		for _, p := range o.all {
			if at >= o.matched {
				break
			}
			lo, hi := max(start-at, 0), min(len(p), o.matched-at)
			if lo < hi {
				s.WriteString(p[lo:hi])
			}
			at += len(p)
		}
	}
	s.WriteString(o.b.String()[max(start-o.matched, 0):])
	return s.String(), s.Cap()
}

// String is the text after the matched bytes (all of it without an expected text).
func (o *output) String() string { return o.b.String() }

// Grow makes room for n more bytes after the matched ones.
func (o *output) Grow(n int) { o.b.Grow(n) }

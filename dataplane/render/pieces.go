package render

import (
	"strings"

	"github.com/epd-dev/coordinator/dataplane/render/jinja"
)

// pieces is a text held in pieces, read as one: a conversation's rendering, whose earlier
// turns' bytes are shared with the entries they came from (historyEntry).
type pieces []string

// len is the text's length.
func (p pieces) len() int {
	n := 0
	for _, s := range p {
		n += len(s)
	}
	return n
}

// own is the text in an array of its own (the pieces' arrays, which may be larger, are not
// kept), and that array's size: Go rounds an allocation up to a size class.
func (p pieces) own() (string, int) {
	var b strings.Builder
	b.Grow(p.len())
	for _, s := range p {
		b.WriteString(s)
	}
	return b.String(), b.Cap()
}

// ownAround is text in pieces that keep no array they do not need: the spans of it no shorter
// than minSharedSpan (strings whose bytes are text's at their offsets, in order, not
// overlapping: the template's iterations' outputs, jinja.Span) as they are, and the bytes
// between them copied into one array of their own. It returns the pieces and the bytes their
// arrays take past the pieces' lengths (Go rounds an allocation up to a size class; a span cut
// where text ends keeps its whole array). A later render that replays those iterations writes
// the very strings the pieces are, which compare equal by their address.
func ownAround(text string, spans []jinja.Span) (pieces, int) {
	kept := func(s jinja.Span) bool { return s.At < len(text) && len(s.Text) >= minSharedSpan }
	own, n := len(text), 0 // the bytes to copy, the spans kept
	for _, s := range spans {
		if kept(s) {
			own -= min(len(s.Text), len(text)-s.At)
			n++
		}
	}
	var b strings.Builder // the copied bytes' array, never grown past own: each piece of it stays where it is
	b.Grow(own)
	out := make(pieces, 0, 2*n+1)
	copied := func(from, to int) {
		if from < to {
			k := b.Len()
			b.WriteString(text[from:to])
			out = append(out, b.String()[k:])
		}
	}
	at, slack := 0, 0
	for _, s := range spans {
		if kept(s) {
			copied(at, s.At)
			piece := s.Text[:min(len(s.Text), len(text)-s.At)]
			out, slack = append(out, piece), slack+max(s.Size, len(s.Text))-len(piece)
			at = s.At + len(piece)
		}
	}
	copied(at, len(text))
	return out, slack + b.Cap() - b.Len()
}

// minSharedSpan is the shortest iteration's output a history entry keeps as a piece of its
// own, shared with the iteration cache: a shorter one costs its piece more than comparing its
// bytes does, and a conversation of many short messages would have as many pieces.
const minSharedSpan = 1024

// first are the pieces of the text's first n bytes (shared, the last one sliced: nothing copied).
func (p pieces) first(n int) pieces {
	var out pieces
	for _, s := range p {
		if n <= 0 {
			break
		}
		out = append(out, s[:min(n, len(s))])
		n -= len(s)
	}
	return out
}

// slice is the text's bytes [lo, hi): a piece's own when they lie in one, else a copy.
func (p pieces) slice(lo, hi int) string {
	at := 0
	for _, s := range p {
		if lo >= at && hi <= at+len(s) {
			return s[lo-at : hi-at]
		}
		at += len(s)
	}
	var b strings.Builder
	b.Grow(hi - lo)
	at = 0
	for _, s := range p {
		if a, z := max(lo-at, 0), min(hi-at, len(s)); a < z {
			b.WriteString(s[a:z])
		}
		at += len(s)
	}
	return b.String()
}

// commonPrefix is the length of the longest common prefix of the text and s.
func (p pieces) commonPrefix(s string) int {
	n := 0
	for _, piece := range p {
		k := commonPrefix(piece, s[n:])
		n += k
		if k < len(piece) {
			break
		}
	}
	return n
}

package render

import (
	"slices"
	"strings"
	"unsafe"
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
	b := slices.Grow([]byte(nil), p.len())
	for _, s := range p {
		b = append(b, s...)
	}
	return unsafe.String(unsafe.SliceData(b), len(b)), cap(b)
}

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

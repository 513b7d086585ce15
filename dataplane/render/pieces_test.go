package render

import (
	"strings"
	"testing"
	"unsafe"
)

// TestPieces: every slice, first and common prefix of texts in pieces (empty ones too) is the
// joined text's, and a slice within one piece is that piece's own bytes.
func TestPieces(t *testing.T) {
	for _, p := range []pieces{
		nil,
		{""},
		{"abc"},
		{"ab", "", "cde", "f"},
		{"", "x", "", "yz", ""},
		{"hello ", "world", "!"},
	} {
		text := strings.Join(p, "")
		if p.len() != len(text) {
			t.Fatalf("%q: len %d, want %d", p, p.len(), len(text))
		}
		for lo := 0; lo <= len(text); lo++ {
			if got := strings.Join(p.first(lo), ""); got != text[:lo] {
				t.Fatalf("%q: first(%d) = %q, want %q", p, lo, got, text[:lo])
			}
			for hi := lo; hi <= len(text); hi++ {
				if got := p.slice(lo, hi); got != text[lo:hi] {
					t.Fatalf("%q: slice(%d, %d) = %q, want %q", p, lo, hi, got, text[lo:hi])
				}
			}
			for _, s := range []string{text[:lo], text[:lo] + "#", text[:lo] + "#" + text[lo:], "#"} {
				want := commonPrefix(text, s)
				if got := p.commonPrefix(s); got != want {
					t.Fatalf("%q: commonPrefix(%q) = %d, want %d", p, s, got, want)
				}
			}
		}
	}
	// A slice within a piece shares its bytes.
	p := pieces{"abcdef", "ghi"}
	if s := p.slice(1, 4); unsafe.StringData(s) != unsafe.StringData(p[0][1:]) {
		t.Fatalf("slice(1, 4) = %q is a copy", s)
	}
}

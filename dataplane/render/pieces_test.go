package render

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/epd-dev/coordinator/dataplane/render/jinja"
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

// TestOwnAround: a text with spans of it (iterations' outputs) is kept as the long spans
// themselves (by address) and the bytes between them in one array of its own, clipped where the
// text ends; the pieces join to the text.
func TestOwnAround(t *testing.T) {
	long := func(c byte) string { return strings.Repeat(string(c), minSharedSpan) }
	a, b := long('a'), long('b')
	for _, tc := range []struct {
		name  string
		text  string
		spans []jinja.Span
		kept  []string // the spans kept as they are, in order (a clipped one: its prefix)
		slack int      // the bytes the kept spans' arrays take past the pieces
	}{
		{"none", "abc" + a, nil, nil, 0},
		{"short ones are copied", "<" + a[:10] + ">", []jinja.Span{{At: 1, Text: a[:10], Size: 16}}, nil, 0},
		{"one, between", "<" + a + ">", []jinja.Span{{At: 1, Text: a, Size: minSharedSpan}}, []string{a}, 0},
		{"at both ends", a + "|" + b, []jinja.Span{{At: 0, Text: a, Size: minSharedSpan + 128}, {At: minSharedSpan + 1, Text: b, Size: minSharedSpan}}, []string{a, b}, 128},
		{"one long, one short", a + "|x", []jinja.Span{{At: 0, Text: a, Size: minSharedSpan}, {At: minSharedSpan + 1, Text: "x", Size: 8}}, []string{a}, 0},
		{"clipped at the end", "<" + a[:minSharedSpan-5], []jinja.Span{{At: 1, Text: a, Size: minSharedSpan}}, []string{a[:minSharedSpan-5]}, 5},
		{"past the end", "<>", []jinja.Span{{At: 2, Text: a, Size: minSharedSpan}}, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The spans' strings are their own, as an iteration's output is: not text's bytes.
			text := strings.Clone(tc.text)
			got, slack := ownAround(text, tc.spans)
			if strings.Join(got, "") != text {
				t.Fatalf("the pieces join to %q, want %q", strings.Join(got, ""), text)
			}
			var kept []string
			var glue []string
			for _, p := range got {
				switch {
				case slices.ContainsFunc(tc.spans, func(s jinja.Span) bool { return unsafe.StringData(s.Text) == unsafe.StringData(p) }):
					kept = append(kept, p)
				case within(p, text):
					t.Fatalf("piece %q is text's own bytes, not a copy", p)
				default:
					glue = append(glue, p)
				}
			}
			if !slices.Equal(kept, tc.kept) {
				t.Fatalf("kept %d spans as they are, want %d", len(kept), len(tc.kept))
			}
			for i := 1; i < len(glue); i++ { // one array: each copied piece after the one before
				end := unsafe.Add(unsafe.Pointer(unsafe.StringData(glue[i-1])), len(glue[i-1]))
				if unsafe.Pointer(unsafe.StringData(glue[i])) != end {
					t.Fatalf("the copied pieces %q and %q are not in one array", glue[i-1], glue[i])
				}
			}
			copied := 0
			for _, p := range glue {
				copied += len(p)
			}
			// The copied pieces' array is rounded up to a size class: an eighth at most, past 16.
			if slack < tc.slack || slack > tc.slack+max(16, copied/8) {
				t.Fatalf("slack %d, want %d and the copied %d bytes' rounding", slack, tc.slack, copied)
			}
		})
	}
}

// TestCompactKeepsLongPieces: an entry past maxChunks pieces of text joins each run of its short
// pieces into one and keeps its long ones (shared with the iteration cache) as they are.
func TestCompactKeepsLongPieces(t *testing.T) {
	long := strings.Repeat("x", minSharedSpan)
	var text pieces
	for i := range maxChunks {
		text = append(text, fmt.Sprintf("<%d>", i), fmt.Sprintf("[%d]", i))
		if i%4 == 0 {
			text = append(text, strings.Clone(long))
		}
	}
	e := &historyEntry{text: slices.Clone(text)}
	e.compact()
	if strings.Join(e.text, "") != strings.Join(text, "") {
		t.Fatal("the compacted text differs")
	}
	var longs []string
	for i, p := range e.text {
		if len(p) >= minSharedSpan {
			longs = append(longs, p)
		} else if i > 0 && len(e.text[i-1]) < minSharedSpan {
			t.Fatalf("pieces %d and %d, both short, are not joined", i-1, i)
		}
	}
	var want []string
	for _, p := range text {
		if len(p) >= minSharedSpan {
			want = append(want, p)
		}
	}
	if len(longs) != len(want) || len(e.text) != 2*len(want)+1 {
		t.Fatalf("%d pieces, %d long, want %d long between runs of short ones", len(e.text), len(longs), len(want))
	}
	for i := range want {
		if unsafe.StringData(longs[i]) != unsafe.StringData(want[i]) {
			t.Fatalf("long piece %d was copied", i)
		}
	}
	if e.held < 0 {
		t.Fatalf("held %d", e.held)
	}
}

// within reports whether p's bytes lie in s's array.
func within(p, s string) bool {
	at, lo := uintptr(unsafe.Pointer(unsafe.StringData(p))), uintptr(unsafe.Pointer(unsafe.StringData(s)))
	return len(p) > 0 && at >= lo && at < lo+uintptr(len(s))
}

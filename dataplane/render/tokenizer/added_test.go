package tokenizer

import (
	"slices"
	"testing"
)

// TestTrimmedTokenIsText: a token matched by the split and then trimmed by its neighbour's
// rstrip is no longer that token: the trimmed piece is looked up as it stands and, being no
// token, encoded as text, as the reference does ("<pad>" strips the space " <sp> " starts with).
func TestTrimmedTokenIsText(t *testing.T) {
	tok := stretchedTokenizer(t)
	pad, sp := tok.added.byContent["<pad>"], tok.added.byContent[" <sp> "]
	if got := tok.Encode(nil, "a <sp> b", false); !slices.Contains(got, sp) {
		t.Fatalf("Encode(%q) = %v: no %q (%d)", "a <sp> b", got, " <sp> ", sp)
	}
	var want []int
	want = tok.Encode(want, "a", false)
	want = append(want, pad)
	want = tok.Encode(want, "<sp> ", false)
	want = tok.Encode(want, "b", false)
	if got := tok.Encode(nil, "a<pad> <sp> b", false); !slices.Equal(got, want) {
		t.Fatalf("Encode(%q) = %v, want %v", "a<pad> <sp> b", got, want)
	}
	if slices.Contains(want, sp) {
		t.Fatalf("the trimmed piece encodes as %q (%d) on its own: the case proves nothing", " <sp> ", sp)
	}
}

package simworker

import (
	"slices"
	"strings"
	"testing"
)

// TestTokenizeTextSplitsLikeFields checks the one-pass tokenizer against its
// definition: strings.Fields, then WordTokenID of each word.
func TestTokenizeTextSplitsLikeFields(t *testing.T) {
	for _, text := range []string{
		"",
		"   ",
		"one",
		" leading and trailing ",
		"tabs\tnew\nlines\r\nvertical\vform\ffeed",
		"non-breaking\u00a0space next\u0085line ideographic\u3000space em\u2003space",
		"unicode wörds ünïcode 日本語 😀 emoji",
		"invalid \xff\xfe utf-8 \xe2\x80 truncated",
		"zero-width\u200bis not a space",
		strings.Repeat("lorem ipsum ", 1000),
	} {
		var want []int
		for _, w := range strings.Fields(text) {
			want = append(want, WordTokenID(w))
		}
		if got := TokenizeText(text); !slices.Equal(got, want) {
			t.Errorf("TokenizeText(%.40q) = %v, want %v", text, got, want)
		}
		if got := TokenizePrompt(text); !slices.Equal(got, append([]int{BOSTokenID}, want...)) {
			t.Errorf("TokenizePrompt(%.40q) = %v", text, got)
		}
	}
}

package tokenizer

import (
	"math/rand"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// TestIsNormal holds the quick check to x/text: whatever isNormal accepts, the form leaves as it
// is, for every character of its tables alone, after a letter and before a combining mark, and
// for random mixes of safe, unsafe and invalid characters.
func TestIsNormal(t *testing.T) {
	t.Parallel() // pure CPU, and a tokenizer is shared by concurrent requests
	forms := []norm.Form{norm.NFC, norm.NFD, norm.NFKC, norm.NFKD}
	names := []string{"NFC", "NFD", "NFKC", "NFKD"}
	var pool []string
	for r := rune(0); r < quickLimit; r += 1 + rune(rand.Intn(40)) {
		if utf8.ValidRune(r) {
			pool = append(pool, string(r))
		}
	}
	pool = append(pool, "a", "e", "\u0301", "\u0308", "\u1100", "\u1161", "\u11a8", "\uac00", "\U0001F600", "\U0001F3FD", "\ufe0f",
		"\U0002F800", "\U0001D15E", "\U000E0001", "\xff", "\xe2\x82", "\xed\xa0\x80", "\u212b", "\u0958", "\uff9e", "\u0344")
	for k, f := range forms {
		tab := quickTables[f]()
		for r := rune(0); r < quickLimit; r++ {
			if !utf8.ValidRune(r) {
				continue
			}
			for _, s := range []string{string(r), "a" + string(r), string(r) + "\u0301", "\u1100" + string(r) + "\u1161"} {
				if isNormal(f, tab, s) && f.String(s) != s {
					t.Fatalf("%s: %+q is not normal but isNormal says so", names[k], s)
				}
			}
		}
		rng := rand.New(rand.NewSource(int64(k)))
		for i := 0; i < 200000; i++ {
			var b strings.Builder
			for n := rng.Intn(8); n >= 0; n-- {
				b.WriteString(pool[rng.Intn(len(pool))])
			}
			s := b.String()
			if isNormal(f, tab, s) && (!utf8.ValidString(s) || f.String(s) != s) {
				t.Fatalf("%s: %+q is not normal but isNormal says so", names[k], s)
			}
		}
	}
	if !isNormal(norm.NFC, quickTables[norm.NFC](), "naïve café, 你好世界 😀 한국어 Zoë Ångström ❤️ 👍🏽") {
		t.Error("common text is not recognised as NFC")
	}
}

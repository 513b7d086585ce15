package tokenizer

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// generic is the qwen-like fixture with a pre-tokenizer pattern no hand-written splitter knows
// (o200k's), so that it runs on the general regexp path.
func generic(t *testing.T) *Tokenizer {
	t.Helper()
	doc := fixtureJSON(t, "qwen-like")
	split := doc["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)
	split["pattern"] = map[string]any{"Regex": `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`}
	tk, err := New(mustJSON(t, doc))
	if err != nil {
		t.Fatal(err)
	}
	if tk.pre[0].re == nil {
		t.Fatal("the pattern is split by hand; the test wants the general path")
	}
	return tk
}

// TestEncodeLimited: each limit stops the encoding within checkEvery bytes of text of being
// passed, on the hand-split and the general paths, and says which; under its limits an encoding
// is the unlimited one.
func TestEncodeLimited(t *testing.T) {
	qwen, _ := loadNamed(t, "qwen-like")
	gen := generic(t)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	words := strings.Repeat("the cat sat on a mat, then 42 ran away. ", 1<<15) // 1.25 MiB
	for _, tc := range []struct {
		name string
		text string
		lim  Limits
		want func(error) bool
		// most is how many ids may come out before the encoding stops.
		most int
	}{
		{"tokens", words, Limits{MaxTokens: 1000}, isLimit(true, 1000), 1000 + checkEvery},
		{"a long word of letters", "hi " + strings.Repeat("a", 100_000) + " there", Limits{MaxWordBytes: 65536}, isLimit(false, 65536), 10},
		{"a long run of spaces", "x" + strings.Repeat(" ", 100_000) + "y", Limits{MaxWordBytes: 65536}, isLimit(false, 65536), 10},
		{"a cancelled context", words, Limits{Context: cancelled}, func(err error) bool { return errors.Is(err, context.Canceled) }, 0},
		{"a word under the limit", "hi " + strings.Repeat("a", 1000) + " there", Limits{MaxWordBytes: 1001}, func(err error) bool { return err == nil }, 1 << 20}, // " aaa…": the space is the word's,
		{"tokens at the limit", "hello world", Limits{MaxTokens: 100}, func(err error) bool { return err == nil }, 100},
	} {
		for name, tk := range map[string]*Tokenizer{"hand-split": qwen, "general": gen} {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				ids, err := tk.EncodeLimited(nil, tc.text, false, nil, tc.lim)
				if !tc.want(err) {
					t.Fatalf("err %v", err)
				}
				if len(ids) > tc.most {
					t.Errorf("%d ids before it stopped, want at most %d", len(ids), tc.most)
				}
				if err == nil {
					if want := tk.Encode(nil, tc.text, false); !equalInts(ids, want) {
						t.Errorf("under its limits the encoding differs from the unlimited one")
					}
				}
			})
		}
	}
}

func isLimit(tokens bool, limit int) func(error) bool {
	return func(err error) bool {
		var le *LimitError
		return errors.As(err, &le) && le.Tokens == tokens && le.Limit == limit && le.Got > limit
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestGeneralPathMatchesHandSplit: the general path's streaming split encodes exactly as the
// hand-written splitter of the same pattern (Qwen's pattern compiled as a regexp).
func TestGeneralPathMatchesHandSplit(t *testing.T) {
	qwen, _ := loadNamed(t, "qwen-like")
	slow, err := New(mustJSON(t, fixtureJSON(t, "qwen-like")))
	if err != nil {
		t.Fatal(err)
	}
	re, err := compileRegex(patternQwen)
	if err != nil {
		t.Fatal(err)
	}
	slow.pre[0].fast, slow.pre[0].re = 0, re
	for _, s := range []string{"", "hello world", "Ünïcödé  text\n\n  with 123 numbers", strings.Repeat("ab 12 ?! \r\n", 5000), "日本語のテキスト and emoji 🎉🎉"} {
		if got, want := slow.Encode(nil, s, false), qwen.Encode(nil, s, false); !equalInts(got, want) {
			t.Errorf("%.40q: general path %v, hand-split %v", s, got[:min(len(got), 20)], want[:min(len(want), 20)])
		}
	}
}

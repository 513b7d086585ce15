package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestEncodeRawMatchesNormalized holds encodeRaw (a section encoded where it lies, its spaces
// read as "▁") to the normalized path it replaces, on the two normalizers it takes (Gemma's
// Replace, Llama 2's Prepend then Replace): edge cases, then random texts of spaces, glued
// characters, letters, CJK, emoji, added tokens and invalid bytes, each encoded by a
// tokenizer with the raw path and one without; each tokenizer's own word cache is warm from
// the texts before, so cached keys of both spellings are exercised too.
func TestEncodeRawMatchesNormalized(t *testing.T) {
	cases := []string{
		"", " ", "  ", "   x", "a", "a ", "a b", " leading", "trailing ", "a  b   c", "\ta \t b\n c",
		"x\u2581y z", "\u2581", "a\u2581 b", // a "▁" sends the section down the normalized path
		"日本 語 ", "> a >  b", "a> b", "🎉 🚀  x", "<s> a</s>b <s>", "a<|im_start|> b", "\xff a \xfe\xfd",
		strings.Repeat(" ", 10_000), strings.Repeat("ab ", 3_000), strings.Repeat("語 ", 2_000),
	}
	r := rand.New(rand.NewPCG(31, 7))
	atoms := []string{" ", " ", " ", "  ", "a", "b", "the", "The", ">", ".", ",", "é", "日", "本語", "🎉", "\t", "\n", "<s>", "</s>", "\xff", "0", "123", "'s", "x y"}
	for range 3_000 {
		var b strings.Builder
		for n := r.IntN(24); n >= 0; n-- {
			b.WriteString(atoms[r.IntN(len(atoms))])
		}
		cases = append(cases, b.String())
	}
	for _, name := range []string{"sp-gemma-like", "sp-llama-like"} {
		t.Run(name, func(t *testing.T) {
			// The test files' "<mask>" is matched on normalized text, which keeps the raw path
			// away (TestReadRaw): here it is matched on the raw text, as the real files' are.
			doc := fixtureJSON(t, name)
			for _, a := range doc["added_tokens"].([]any) {
				a.(map[string]any)["normalized"] = false
			}
			b := mustJSON(t, doc)
			withRaw, without := loadTwice(t, b)
			if !withRaw.sp.raw {
				t.Fatalf("%s does not take the raw path", name)
			}
			without.sp.raw = false
			for _, add := range []bool{false, true} {
				for _, c := range cases {
					got, want := withRaw.Encode(nil, c, add), without.Encode(nil, c, add)
					if !slices.Equal(got, want) {
						t.Fatalf("Encode(%q, %t):\n raw        %v\n normalized %v", c, add, got, want)
					}
				}
			}
		})
	}
}

// TestReadRaw: the raw path is taken only when normalizing reads spaces as "▁" and nothing
// else.
func TestReadRaw(t *testing.T) {
	for _, tc := range []struct {
		name      string
		normalize string
		pre       string
		raw       bool
	}{
		{"Gemma", `{"type":"Replace","pattern":{"String":" "},"content":"▁"}`, `{"type":"Split","pattern":{"String":" "},"behavior":"MergedWithPrevious","invert":false}`, true},
		{"Llama 2", `{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]}`, `null`, true},
		{"Replace then Prepend", `{"type":"Sequence","normalizers":[{"type":"Replace","pattern":{"String":" "},"content":"▁"},{"type":"Prepend","prepend":"▁"}]}`, `null`, false},
		{"another replacement", `{"type":"Replace","pattern":{"String":" "},"content":"_"}`, `null`, false},
		{"NFKC first", `{"type":"Sequence","normalizers":[{"type":"NFKC"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]}`, `null`, false},
		{"inverted Split", `{"type":"Replace","pattern":{"String":" "},"content":"▁"}`, `{"type":"Split","pattern":{"String":" "},"behavior":"Removed","invert":true}`, false},
		{"an added token matched on normalized text", `{"type":"Replace","pattern":{"String":" "},"content":"▁"}`, `null`, false},
		{"Metaspace", `null`, `{"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":false}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			added := `[]`
			if strings.HasPrefix(tc.name, "an added token") {
				added = `[{"id":3,"content":"<m>","normalized":true}]`
			}
			tok, err := New([]byte(`{"added_tokens":` + added + `,"normalizer":` + tc.normalize + `,"pre_tokenizer":` + tc.pre +
				`,"model":{"type":"BPE","byte_fallback":true,"vocab":{"▁":0,"a":1,"▁a":2},"merges":["▁ a"]}}`))
			if err != nil {
				t.Fatal(err)
			}
			if tok.sp.raw != tc.raw {
				t.Fatalf("raw = %t, want %t", tok.sp.raw, tc.raw)
			}
		})
	}
}

// TestWordDigits: where a vocabulary's digits stand alone, a word with digits is encoded run by
// run around them (wordDigits) with the ids of the whole word merged; where a merge makes an
// entry holding a digit, the path is not taken.
func TestWordDigits(t *testing.T) {
	cases := []string{
		"1", "12", "a1", "1a", "a1b", "handler_12345(request):", "第12345章讨论了分词", "https://example.com/issues?id=98765",
		"v1.2.3", "2024-01-01T00:00:00Z", "▁12▁ab3", "a 1 b 22 c", "0x1F 0xff", "\xff1\xfe2", "🎉1🚀22", "x1\u2581y2 z3",
		"Zoë9Ångström", "| 98765 | Zoë Ångström | 98.6 |", strings.Repeat("a1", 2_000), strings.Repeat("語9", 1_000),
	}
	r := rand.New(rand.NewPCG(37, 9))
	atoms := []string{" ", "a", "b", "the", "é", "日", "本語", "🎉", "\t", "\n", "\xff", "0", "1", "42", "987", "_", ".", "(", "▁", "<s>"}
	for range 3_000 {
		var b strings.Builder
		for n := r.IntN(16); n >= 0; n-- {
			b.WriteString(atoms[r.IntN(len(atoms))])
		}
		cases = append(cases, b.String())
	}
	for _, name := range []string{"sp-gemma-like", "sp-llama-like", "sp-mistral-like"} {
		t.Run(name, func(t *testing.T) {
			b := mustJSON(t, fixtureJSON(t, name))
			digits, whole := loadTwice(t, b)
			if !digits.sp.digitsAlone {
				t.Fatalf("%s: digitsAlone is false; its merges make no entry with a digit", name)
			}
			whole.sp.digitsAlone = false
			for _, add := range []bool{false, true} {
				for _, c := range cases {
					// Twice: the first meets the runs new to the cache, the second finds them.
					for range 2 {
						if got, want := digits.Encode(nil, c, add), whole.Encode(nil, c, add); !slices.Equal(got, want) {
							t.Fatalf("Encode(%q, %t):\n around digits %v\n whole         %v", c, add, got, want)
						}
					}
				}
			}
		})
	}
	t.Run("a merge makes a number", func(t *testing.T) {
		doc := fixtureJSON(t, "sp-gemma-like")
		model := doc["model"].(map[string]any)
		vocab := model["vocab"].(map[string]any)
		vocab["12"] = float64(len(vocab) + 10)
		model["merges"] = append(model["merges"].([]any), "1 2")
		tok, err := New(mustJSON(t, doc))
		if err != nil {
			t.Fatal(err)
		}
		if tok.sp.digitsAlone {
			t.Fatal("digitsAlone with a merge that makes \"12\"")
		}
		if got := tok.Encode(nil, "a12b", false); !slices.Contains(got, int(vocab["12"].(float64))) {
			t.Fatalf("Encode(\"a12b\") = %v: want the merged \"12\" (id %v) in it", got, vocab["12"])
		}
	})
}

// loadTwice loads the tokenizer.json b into two tokenizers, for a test that turns a fast path
// off in one and holds the other to it.
func loadTwice(t *testing.T, b []byte) (*Tokenizer, *Tokenizer) {
	t.Helper()
	one, err := New(b)
	if err != nil {
		t.Fatal(err)
	}
	two, err := New(b)
	if err != nil {
		t.Fatal(err)
	}
	return one, two
}

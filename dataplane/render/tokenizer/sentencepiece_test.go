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
			withRaw, err := New(b)
			if err != nil {
				t.Fatal(err)
			}
			without, err := New(b)
			if err != nil {
				t.Fatal(err)
			}
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

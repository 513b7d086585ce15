package tokenizer

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// stretchedTokenizer is the GPT-2-like fixture (lstrip <mask>, rstrip <pad>, a normalized
// "Hello World") plus the added tokens "<s>x" (which extends "<s>") and " <sp> " (which ends in
// a space): the cases Cuts exists for.
func stretchedTokenizer(t *testing.T) *Tokenizer {
	t.Helper()
	raw, err := os.ReadFile("testdata/gpt2-like/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	added := doc["added_tokens"].([]any)
	for i, content := range []string{"<s>x", " <sp> "} {
		added = append(added, map[string]any{"id": 961 + i, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
			"normalized": false, "special": true})
	}
	doc["added_tokens"] = added
	if raw, err = json.Marshal(doc); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestCuts: Cuts finds the ends of the added tokens that strip nothing after them, and encoding
// the text in parts at any of them gives the ids of encoding it whole.
func TestCuts(t *testing.T) {
	tok := stretchedTokenizer(t)
	for _, tc := range []struct {
		name, text string
		want       []int
	}{
		{"empty", "", nil},
		{"no token", "plain words here", []int{16}},
		{"tokens", "<s>Hi there</s>", []int{3, 15}},
		{"text after the last token", "<s>Hi</s> and more", []int{3, 9, 18}},
		{"lstrip token: its end is a cut", "a  <mask> b", []int{9, 11}},
		{"rstrip token: its end is not", "a<pad>  b", []int{9}},
		{"token ending in a space: not a cut", "a <sp> b<s>", []int{11}},
		{"the longest match", "<s>xy<s>", []int{4, 8}},
		{"normalized token: not matched in the raw text", "Hello World<s>", []int{14}},
		{"adjacent tokens", "<s></s><mask><s>", []int{3, 7, 13, 16}},
		{"invalid UTF-8 around a token", "\xff<s>\xfe", []int{4, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tok.Cuts(nil, tc.text)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Cuts(%q) = %v, want %v", tc.text, got, tc.want)
			}
			whole := tok.Encode(nil, tc.text, false)
			for _, c := range got {
				parts := tok.Encode(tok.Encode(nil, tc.text[:c], false), tc.text[c:], false)
				if !slices.Equal(parts, whole) {
					t.Errorf("cut %d: ids %v ++ %v, want %v", c, tok.Encode(nil, tc.text[:c], false), tok.Encode(nil, tc.text[c:], false), whole)
				}
			}
			checkEncodeCuts(t, tok, tc.text)
		})
	}
}

// checkEncodeCuts checks that EncodeCuts encodes text as Encode does, after ids already in
// dst, with and without a segment cache (twice: the second finds the segments), and passes
// Cuts' cuts, each with the number of ids before it.
func checkEncodeCuts(t *testing.T, tok *Tokenizer, text string) {
	t.Helper()
	whole := tok.Encode(nil, text, false)
	var want []Cut
	for _, c := range tok.Cuts(nil, text) {
		want = append(want, Cut{c, 2 + len(tok.Encode(nil, text[:c], false))})
	}
	cache := NewSegmentCache(1<<20, 1)
	for _, c := range []*SegmentCache{nil, cache, cache} {
		ids, cuts, err := tok.EncodeCuts([]int{7, 8}, text, c, Limits{}, nil)
		if err != nil || !slices.Equal(ids, append([]int{7, 8}, whole...)) || !slices.Equal(cuts, want) {
			t.Errorf("EncodeCuts(%q) = %v, %v, %v; want %v, %v", text, ids, cuts, err, append([]int{7, 8}, whole...), want)
		}
	}
	if len(whole) < 2 {
		return
	}
	// Stopped by a limit: the error, and the cuts passed before it.
	_, cuts, err := tok.EncodeCuts([]int{7, 8}, text, nil, Limits{MaxTokens: len(whole) - 1, Before: -2}, nil)
	var le *LimitError
	if !errors.As(err, &le) || !le.Tokens || len(cuts) > len(want) || !slices.Equal(cuts, want[:len(cuts)]) {
		t.Errorf("EncodeCuts(%q) under %d tokens: cuts %v, %v; want a *LimitError and a prefix of %v", text, len(whole)-1, cuts, err, want)
	}
}

// TestCutsExcludeStrips shows why the ends of an rstrip token and of a token ending in a space
// are not cuts: encoding at them differs from encoding whole.
func TestCutsExcludeStrips(t *testing.T) {
	tok := stretchedTokenizer(t)
	for _, tc := range []struct {
		name, text string
		at         int
	}{
		{"rstrip", "a<pad>  b", 6},
		{"trailing space before an lstrip token", "a <sp> <mask>b", 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			whole := tok.Encode(nil, tc.text, false)
			parts := tok.Encode(tok.Encode(nil, tc.text[:tc.at], false), tc.text[tc.at:], false)
			if slices.Equal(whole, parts) {
				t.Fatalf("%q at %d: parts encode as the whole (%v): the exclusion would not be needed", tc.text, tc.at, whole)
			}
			if slices.Contains(tok.Cuts(nil, tc.text), tc.at) {
				t.Fatalf("%q: %d is a cut", tc.text, tc.at)
			}
		})
	}
}

// TestCutsFirstScheme: where Metaspace prefixes only a text's first piece, the end of an added
// token is no cut (encoding the rest alone would prefix it), so there is none but the end.
func TestCutsFirstScheme(t *testing.T) {
	tok, _ := loadNamed(t, "sp-mistral-like")
	const text = "<s>hi there</s> and more"
	if got := tok.Cuts(nil, text); !slices.Equal(got, []int{len(text)}) {
		t.Fatalf("Cuts = %v, want only the end %d", got, len(text))
	}
	whole := tok.Encode(nil, text, false)
	if parts := tok.Encode(tok.Encode(nil, text[:3], false), text[3:], false); slices.Equal(parts, whole) {
		t.Fatalf("the end of <s> encodes apart the same (%v): the test shows nothing", whole)
	}
	checkEncodeCuts(t, tok, text)
}

// TestCutReach: two texts that share a prefix have the same cuts up to CutReach() before its
// end, and the cuts of a text after one of its cuts are Cuts of the rest, shifted (what lets the
// history cache scan only the text after the stretch it shares). The texts are random runs of
// the fixture's added tokens, their beginnings, and text.
func TestCutReach(t *testing.T) {
	tok := stretchedTokenizer(t)
	reach := tok.CutReach()
	if reach < len("<mask>") {
		t.Fatalf("CutReach %d is shorter than a token", reach)
	}
	frags := []string{"<s>", "<s", "<s>x", "</s>", "<mask>", "<pad>", " <sp> ", " <sp", "a", " ", "  ", "Hi", "\n", "<", "Hello World"}
	r := rand.New(rand.NewPCG(3, 4))
	text := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteString(frags[r.IntN(len(frags))])
		}
		return b.String()
	}
	for range 2000 {
		shared := text(r.IntN(12))
		a, b := shared+text(r.IntN(6)), shared+text(r.IntN(6))
		n := len(shared)
		for i := 0; i < min(len(a), len(b)) && a[i] == b[i]; i++ {
			n = i + 1
		}
		ca, cb := tok.Cuts(nil, a), tok.Cuts(nil, b)
		upTo := func(cs []int) []int {
			return slices.DeleteFunc(slices.Clone(cs), func(c int) bool { return c > n-reach })
		}
		if !slices.Equal(upTo(ca), upTo(cb)) {
			t.Fatalf("%q and %q share %d bytes: cuts %v and %v differ before %d", a, b, n, ca, cb, n-reach)
		}
		for _, c := range ca {
			var rest []int
			for _, d := range tok.Cuts(nil, a[c:]) {
				rest = append(rest, c+d)
			}
			want := slices.DeleteFunc(slices.Clone(ca), func(d int) bool { return d <= c })
			if !slices.Equal(rest, want) {
				t.Fatalf("%q: the cuts after %d are %v, Cuts of the rest %v", a, c, want, rest)
			}
		}
	}
	if first, _ := loadNamed(t, "sp-mistral-like"); first.CutReach() != -1 {
		t.Fatal("a tokenizer with no cut but the end has a reach")
	}
}

package tokenizer

import (
	"math/rand"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// jsWhiteSpace is ECMAScript's \s, which GPT-2's pattern has inside ByteLevel(use_regex).
const jsWhiteSpace = `\u0009-\u000D\u0020\u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000\uFEFF`

// slowSplitters are the regexp2 programs each hand-written splitter must equal.
func slowSplitters(t testing.TB) map[fastKind]*regexp2.Regexp {
	t.Helper()
	out := map[fastKind]*regexp2.Regexp{}
	for p, k := range knownPatterns {
		re, err := compileRegex(p)
		if err != nil {
			t.Fatal(err)
		}
		out[k] = re
	}
	js := jsWhiteSpace
	gpt2JS := `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^` + js + `\p{L}\p{N}]+|[` + js + `]+(?![^` + js + `])|[` + js + `]+`
	out[fastGPT2JS] = regexp2.MustCompile(gpt2JS, regexp2.None, regexp2.OptionMaxBacktrackingStackSize(-1))
	return out
}

// checkSplit compares the hand-written splitters with regexp2 on s.
func checkSplit(t testing.TB, slow map[fastKind]*regexp2.Regexp, s string) {
	t.Helper()
	for k, re := range slow {
		p := &preStep{fast: k, ext: extClass()}
		fast := p.matches(nil, s)
		idx, err := re.FindAllStringIndex(s, -1)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]span, 0, len(idx))
		prev := 0
		for _, m := range idx {
			if k.gaps() && m[0] > prev { // the splitter's pieces: the gaps too
				want = append(want, span{prev, m[0]})
			}
			want = append(want, span{m[0], m[1]})
			prev = m[1]
		}
		if k.gaps() && prev < len(s) {
			want = append(want, span{prev, len(s)})
		}
		if len(fast) == 0 && len(want) == 0 {
			continue
		}
		if !reflect.DeepEqual(fast, want) {
			t.Fatalf("kind %d, %q:\nfast    %v\nregexp2 %v", k, s, pieces(s, fast), pieces(s, want))
		}
	}
}

func pieces(s string, sp []span) []string {
	out := make([]string, len(sp))
	for i, x := range sp {
		out[i] = s[x.start:x.end]
	}
	return out
}

// splitAlphabet has a member of every class the patterns tell apart, the characters on which
// Oniguruma's, JS's and .NET's notions differ (U+0085, U+FEFF, ſ, K), and invalid bytes.
var splitAlphabet = []string{
	"a", "Z", "s", "S", "t", "T", "r", "R", "e", "E", "v", "V", "m", "M", "l", "L", "d", "D", "é", "ſ", "K", "ǅ", "你", "𝐀", "\U00020000",
	"0", "7", "٣", "①", "½", "Ⅻ", "𝟙",
	" ", "\t", "\n", "\r", "\v", "\f", "\u0085", "\u00a0", "\u1680", "\u2000", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\ufeff", "\u180e", "\u200b",
	"'", "\"", ".", ",", "!", "?", "-", "_", "(", "<", "|", "😀", "\u0301", "\u200d", "\x00", "\x7f",
	"/", "#", "@", "`", "~", "^", "\\", "[", "{", "$", "+", "=", "，", "。", "「", "€", "©", "\u0903", "\u20dd", // punctuation, symbols, marks
	"ʰ", "ǈ", "ß", "Σ", "σ", "ǂ", "\u4e00", "\u9fa5", "\u9fa6", "\u3040", "\u309f", "\u30a0", "\u30ff", "\u3100", "ア", "ー", "\U000e0001", // letter cases; DeepSeek's CJK ranges and their edges
	"\xff", "\xc3", "\xe2\x82", "\xed\xa0\x80", "\U00013460", // invalid bytes; a letter newer than Go's Unicode tables
}

func randomSplitText(r *rand.Rand) string {
	var b strings.Builder
	for n := r.Intn(16); n >= 0; n-- {
		b.WriteString(splitAlphabet[r.Intn(len(splitAlphabet))])
	}
	return b.String()
}

func TestSplitFastMatchesRegexp2(t *testing.T) {
	t.Parallel() // pure CPU, and a tokenizer is shared by concurrent requests
	slow := slowSplitters(t)
	for _, s := range []string{"", "'s", "'S", "'ſ", "'re", "'Re", "'rE", "'l", "'ll", "x'", "a  b", "a \n b", " \n\n ", "   ", "\r\n\r\n", "123456", "  !!", "\u0085a", " \ufeffa"} {
		checkSplit(t, slow, s)
	}
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 20000; i++ {
		checkSplit(t, slow, randomSplitText(r))
	}
}

// FuzzSplit holds the hand-written splitters to regexp2 on arbitrary bytes, invalid UTF-8
// included (each invalid byte is one "other" character to both), the hot loop to the splitter
// and word cache it inlines, and checks that Encode never panics and treats invalid bytes as
// U+FFFD.
func FuzzSplit(f *testing.F) {
	for _, s := range []string{"Hello world", "I'm 'S 're", "a  \n\n b  ", "123456789", "你好😀", "\xff\xfe", "\u0085\ufeff\u3000x", "<|im_start|>x"} {
		f.Add(s)
	}
	slow := slowSplitters(f)
	tk, _ := loadNamed(f, "qwen-like")
	ext := extClass()
	f.Fuzz(func(t *testing.T, s string) {
		checkSplit(t, slow, s)
		st := new(state)
		for _, kind := range []fastKind{fastQwen, fastLlama, fastO200K, fastDeepSeek} {
			if got, want := tk.encodeFast(nil, s, kind, ext, st), wordLoop(tk, s, kind, ext, st); !reflect.DeepEqual(got, want) {
				t.Fatalf("%q (kind %d): encodeFast %v, word loop %v", s, kind, got, want)
			}
		}
		got := tk.Encode(nil, s, false)
		if !utf8.ValidString(s) {
			if want := tk.Encode(nil, sanitize(s), false); !reflect.DeepEqual(got, want) {
				t.Fatalf("%q: %v, want %v", s, got, want)
			}
		}
	})
}

func TestTranslateRegex(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`(?i:'s|x)`, `(?:'[sS]|[xX])`},
		{`a++b*+`, `a+b*`},
		{`\s+(?!\S)`, "[" + whiteSpace + "]+(?![^" + whiteSpace + "])"},
		{`[^\s\p{L}]`, "[^" + whiteSpace + `\p{L}]`},
		{`(a)b{,3}`, `(?:a)b{0,3}`},
		{`.\d\x41\u00e9\x{1F600}`, `[^\n]\p{Nd}A` + "é\U0001F600"},
		{`[-a-c_]`, `[\-a-c_]`},
	} {
		got, err := translateRegex(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("translateRegex(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{`\w`, `\b`, `^a`, `a$`, `(?<n>a)`, `(?>a)`, `\1`, `[[:alpha:]]`, `[a&&b]`, `[\s-z]`, `a{2}+`, `(?i:[a])`, `\p{Word}`, `(a`, `a)`} {
		if got, err := translateRegex(bad); err == nil {
			t.Errorf("translateRegex(%q) = %q, want an error", bad, got)
		}
	}
}

// split returns the pieces of s after this step (each's), collected.
func (p *preStep) split(dst []span, s string, st *state) []span {
	p.each(s, st, func(x span) bool {
		dst = append(dst, x)
		return true
	})
	return dst
}

// matches appends the non-overlapping matches of the step's pattern in s.
func (p *preStep) matches(dst []span, s string) []span {
	p.eachMatch(s, new(state), func(m span) bool {
		dst = append(dst, m)
		return true
	})
	return dst
}

// TestDeepSeekLoopMatchesSteps holds encodeDeepSeek (DeepSeek-V3's three Split steps in one
// loop) to the three steps run one after the other.
func TestDeepSeekLoopMatchesSteps(t *testing.T) {
	t.Parallel()
	bl := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}
	split := func(p string) map[string]any {
		return map[string]any{"type": "Split", "pattern": map[string]any{"Regex": p}, "behavior": "Isolated", "invert": false}
	}
	m := fixtureJSON(t, "qwen-like")
	m["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{split(patternDigits3), split(patternCJK), split(patternDeepSeek), bl}}
	fused, err := New(mustJSON(t, m))
	if err != nil {
		t.Fatal(err)
	}
	steps, err := New(mustJSON(t, m))
	if err != nil {
		t.Fatal(err)
	}
	if !fused.deepSeek {
		t.Fatal("DeepSeek-V3's pre-tokenizer is not recognized")
	}
	steps.deepSeek = false
	r := rand.New(rand.NewSource(3))
	texts := []string{"", "abc123def4567", "自然语言処理ゟ゠ア 12 ab", "  \n\n 1 2  3", "-abc--abc 'sé\u0301x"}
	for range 20000 {
		texts = append(texts, randomSplitText(r))
	}
	for _, s := range texts {
		if got, want := fused.Encode(nil, s, false), steps.Encode(nil, s, false); !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: one loop %v, three steps %v", s, got, want)
		}
	}
}

// TestASCIIWordsMatchNext holds the hot loop's ASCII shortcuts to the splitters they shortcut,
// at every position of random texts (the splitters' alphabet and ASCII words after each
// character the patterns treat apart): where a shortcut answers, it answers as the splitter.
func TestASCIIWordsMatchNext(t *testing.T) {
	t.Parallel()
	ext := extClass()
	r := rand.New(rand.NewSource(11))
	words := []string{"abc", "The", "HTML", "eR", "x", "'s", "'LL"}
	answered := map[string]int{}
	for range 20000 {
		var b strings.Builder
		for n := r.Intn(24); n >= 0; n-- { // characters, and words, in any order
			if r.Intn(2) == 0 {
				b.WriteString(words[r.Intn(len(words))])
			} else {
				b.WriteString(splitAlphabet[r.Intn(len(splitAlphabet))])
			}
		}
		s := b.String()
		for i := range len(s) {
			if !utf8.RuneStart(s[i]) {
				continue
			}
			if j := deepSeekASCII(s, i); j != 0 {
				answered["deepSeek"]++
				if want := deepSeekNext(s, i, ext); j != want {
					t.Fatalf("deepSeekASCII(%q, %d) = %d, deepSeekNext %d", s, i, j, want)
				}
			}
			if j := o200kASCII(s, i); j != 0 {
				answered["o200k"]++
				if want := o200kMatch(s, i, ext); j != want { // not o200kNext, which takes o200kASCII's answer
					t.Fatalf("o200kASCII(%q, %d) = %d, o200kMatch %d", s, i, j, want)
				}
			}
		}
	}
	if answered["deepSeek"] < 10000 || answered["o200k"] < 10000 {
		t.Fatalf("the shortcuts answered %v times: the texts prove little", answered)
	}
}

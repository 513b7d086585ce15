package tokenizer

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// benchFamilies maps a benchmark name to the real family it measures and the synthetic fixture
// used in its place when the real files are absent (realDirs), so that every benchmark measures
// something under make test's -benchtime 1x.
var benchFamilies = []struct{ name, real, fixture string }{
	{"qwen3", "qwen3", "qwen-like"},
	{"llama3", "llama3_1", "llama-like"},
	{"deepseek_v3", "deepseek_v3", "qwen-like"},
	{"gptoss", "gptoss", "qwen-like"},
	{"gemma3", "gemma3", "sp-gemma-like"},
	{"llama2", "llama2", "sp-llama-like"},
}

func benchTokenizer(b *testing.B, family, fixture string) *Tokenizer {
	b.Helper()
	if tk, ok := loadNamed(b, family); ok {
		return tk
	}
	b.Logf("%s: tokenizer files not found (TOKENIZER_DIRS); measuring the %s fixture", family, fixture)
	tk, _ := loadNamed(b, fixture)
	return tk
}

// benchParagraphs is realistic mixed text: prose, code, CJK, emoji, numbers, markup.
var benchParagraphs = []string{
	"The committee reviewed the quarterly results on Tuesday. Revenue grew %d%% year over year, while operating costs fell slightly; the board said it's \"cautiously optimistic\" about the next two quarters.\n\n",
	"def handler_%d(request):\n    payload = json.loads(request.body)\n    if not payload.get(\"items\"):\n        return Response(status=400)\n    return {\"count\": len(payload[\"items\"]), \"ok\": True}\n\n",
	"func (s *Server) serve%d(ctx context.Context, w http.ResponseWriter) error {\n\tif err := s.limiter.Wait(ctx); err != nil {\n\t\treturn fmt.Errorf(\"wait: %%w\", err)\n\t}\n\treturn nil\n}\n\n",
	"自然语言处理是人工智能领域的一个重要方向，第%d章讨论了分词、句法分析和语义理解。日本語の文章も含まれています。한국어 문장도 있습니다.\n",
	"Great job team 🎉🚀! Ticket #%d is closed 👍🏽 — see https://example.com/issues?id=%d&sort=desc for details ❤️.\n",
	"| id | name | score |\n|----|------|-------|\n| %d | Zoë Ångström | 98.6 |\n| 2 | naïve café | 3.14159 |\n\n",
	"<div class=\"card\" data-id=\"%d\"><h2>Title</h2><p>Lorem ipsum dolor sit amet, consectetur adipiscing elit.</p></div>\n",
	"Q: What's the capital of France?\nA: Paris. It has about %d million inhabitants in the city proper; they'll tell you it's the best city.\n\n",
}

// benchText returns deterministic mixed text of about n tokens for tk.
func benchText(tk *Tokenizer, n int) string {
	r := rand.New(rand.NewSource(int64(n)))
	var b strings.Builder
	var ids []int
	for count := 0; count < n; {
		p := benchParagraphs[r.Intn(len(benchParagraphs))]
		para := fmt.Sprintf(p, r.Intn(100000), r.Intn(1000))
		ids = tk.Encode(ids[:0], para, false)
		count += len(ids)
		b.WriteString(para)
	}
	return b.String()
}

// BenchmarkEncode encodes 1k, 32k and 128k tokens of mixed text, single-threaded, into a reused
// dst: MB/s of text, ns per token, allocations per encode.
func BenchmarkEncode(b *testing.B) {
	for _, fam := range benchFamilies {
		b.Run(fam.name, func(b *testing.B) {
			tk := benchTokenizer(b, fam.real, fam.fixture)
			for _, size := range []struct {
				name string
				n    int
			}{{"1k", 1 << 10}, {"32k", 32 << 10}, {"128k", 128 << 10}} {
				b.Run(size.name, func(b *testing.B) {
					text := benchText(tk, size.n)
					dst := tk.Encode(nil, text, false)
					tokens := len(dst)
					b.SetBytes(int64(len(text)))
					b.ReportAllocs()
					b.ResetTimer()
					for range b.N {
						dst = tk.Encode(dst[:0], text, false)
					}
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(tokens), "ns/token")
				})
			}
		})
	}
}

// BenchmarkLoad parses tokenizer.json and reports what a loaded tokenizer keeps on the heap.
func BenchmarkLoad(b *testing.B) {
	for _, fam := range benchFamilies {
		b.Run(fam.name, func(b *testing.B) {
			dir := filepath.Join("testdata", fam.fixture)
			if d := realDirs()[fam.real]; d != "" {
				if _, err := os.Stat(filepath.Join(d, "tokenizer.json")); err == nil {
					dir = d
				} else {
					b.Logf("%s: tokenizer files not found (TOKENIZER_DIRS); measuring the %s fixture", fam.real, fam.fixture)
				}
			}
			data, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
			if err != nil {
				b.Fatal(err)
			}
			var heap uint64
			b.ResetTimer()
			for range b.N {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				tk, err := New(data)
				if err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				heap = after.HeapAlloc - before.HeapAlloc
				runtime.KeepAlive(tk)
			}
			b.ReportMetric(float64(heap)/(1<<20), "heap-MB")
		})
	}
}

// BenchmarkEncodeCuts encodes a conversation of 690 short messages as a chat template renders
// it (each message between two added tokens: a cut or two a message) and finds its cuts, the
// way a history miss does: pieces, Cuts then EncodeLimited of each piece between two cuts (the
// way before EncodeCuts), and onepass, EncodeCuts. ns per token.
func BenchmarkEncodeCuts(b *testing.B) {
	tk := benchTokenizer(b, "qwen3", "qwen-like")
	var text strings.Builder
	r := rand.New(rand.NewSource(1))
	for i := range 690 {
		p := benchParagraphs[r.Intn(len(benchParagraphs))]
		fmt.Fprintf(&text, "<|im_start|>%s\n%.200s<|im_end|>\n", [2]string{"user", "assistant"}[i%2], fmt.Sprintf(p, r.Intn(100000), r.Intn(1000)))
	}
	s := text.String()
	tokens := len(tk.Encode(nil, s, false))
	ways := []struct {
		name   string
		encode func(dst []int) []int
	}{
		{"pieces", func(dst []int) []int {
			at := 0
			for _, c := range tk.Cuts(nil, s) {
				dst, _ = tk.EncodeLimited(dst, s[at:c], false, nil, Limits{})
				at = c
			}
			return dst
		}},
		{"onepass", func(dst []int) []int {
			dst, _, _ = tk.EncodeCuts(dst, s, nil, Limits{}, nil)
			return dst
		}},
	}
	for _, w := range ways {
		b.Run(w.name, func(b *testing.B) {
			dst := w.encode(nil)
			if len(dst) != tokens {
				b.Fatalf("%d ids, want %d", len(dst), tokens)
			}
			b.ReportAllocs()
			for b.Loop() {
				dst = w.encode(dst[:0])
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(tokens), "ns/token")
		})
	}
}

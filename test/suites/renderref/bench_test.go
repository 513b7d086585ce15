package renderref_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/render/tokenizer"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	_ "github.com/epd-dev/coordinator/dataplane/steps" // the render step
	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/internal/peers"
)

// benchParagraphs are what the benchmark conversations are made of: prose, code, CJK, emoji,
// numbers and markup, as a long prompt (a document, a code base, a chat history) mixes them.
var benchParagraphs = []string{
	"The committee reviewed the quarterly results on Tuesday. Revenue grew %d%% year over year, while operating costs fell slightly; the board said it's \"cautiously optimistic\" about the next two quarters.\n\n",
	"def handler_%d(request):\n    payload = json.loads(request.body)\n    if not payload.get(\"items\"):\n        return Response(status=400)\n    return {\"count\": len(payload[\"items\"]), \"ok\": True}\n\n",
	"自然语言处理是人工智能领域的一个重要方向，第%d章讨论了分词、句法分析和语义理解。日本語の文章も含まれています。\n",
	"Great job team 🎉🚀! Ticket #%d is closed 👍🏽 — see https://example.com/issues?id=%d for details.\n",
	"| id | name | score |\n|----|------|-------|\n| %d | Zoë Ångström | 98.6 |\n\n",
}

// benchConversation is a chat body of a system prompt and a user message of about n tokens.
func benchConversation(tok *tokenizer.Tokenizer, n int) []byte {
	r := rand.New(rand.NewPCG(uint64(n), 7))
	var text strings.Builder
	for count := 0; count < n; {
		para := fmt.Sprintf(benchParagraphs[r.IntN(len(benchParagraphs))], r.IntN(100000), r.IntN(1000))
		count += len(tok.Encode(nil, para, false))
		text.WriteString(para)
	}
	msgs, _ := json.Marshal([]map[string]string{{"role": "system", "content": "You are a careful assistant."}, {"role": "user", "content": text.String()}})
	return []byte(`{"model":"sim-model","max_tokens":1,"messages":` + string(msgs) + `}`)
}

// newRenderStep builds the render step with params, as a pipeline would.
func newRenderStep(b *testing.B, own map[string]any) pipeline.Step {
	b.Helper()
	typ, _ := builder.Types.Lookup("render")
	p := params.New("params", own, nil)
	s, err := typ.New(builder.Deps{Log: logr.Discard()}, p)
	if err == nil {
		err = p.Err()
	}
	if err != nil {
		b.Fatal(err)
	}
	if c, ok := s.(pipeline.Closer); ok {
		b.Cleanup(c.Close)
	}
	return s
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRender measures the render step on one-message chats of about 1k, 32k and 128k
// tokens, for each family (models: a family whose tokenizer or template does not load
// fails its own sub-benchmarks, naming why), four ways: inprocess (no cache: every request new),
// warm (in process, the conversation sent before: the segment and history caches answer it, as
// they do a retry or a regenerated answer), hop, the HTTP render service at its floor: the
// simworker's render on loopback (the same request and answer bodies as vLLM's render endpoint;
// its tokenizer is a trivial one, so the hop's numbers are the floor of the round trip, not what
// a real render service costs), and hopsim, the same hop to llm-d's vLLM simulator (the render
// service upstream's coordinator runs in its e2e tests: a real peer, with its dummy tokenizer,
// in its own process). Each request ends with its ids' JSON array, which every leg sends (in
// process it is written from the ids; on a hop it is the service's answer, reused). Reported
// per request: ns/op (latency), ns/token and cpu-ns/token (the process's CPU, and the render
// service's on a hop: the simworker runs in the process, the simulator's is read from /proc),
// allocations. A hop's tokens are its service's (the simulator's dummy tokenizer counts its own):
// compare the ways by ns/op.
func BenchmarkRender(b *testing.B) {
	svc, err := simworker.Start(simworker.Config{Name: "render", Role: simworker.RoleBoth})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = svc.Close() })
	sim := peers.StartSim(b, "sim-model", "--max-model-len", "1048576", "--max-request-body-size-mb", "64")
	eachFamily(b, func(b *testing.B, dir string, tok *tokenizer.Tokenizer) {
		ways := []struct {
			name string
			own  map[string]any
			warm bool                          // render the request once before measuring
			cpu  func() (time.Duration, error) // the render service's CPU, when in another process
		}{
			{"inprocess", map[string]any{"tokenizer": dir, "cache_size": 0, "history_cache_size": 0}, false, nil},
			{"warm", map[string]any{"tokenizer": dir, "cache_size": 256, "history_cache_size": 256}, true, nil},
			{"hop", map[string]any{"address": svc.URL()}, false, nil},
			{"hopsim", map[string]any{"address": sim.URL}, false, sim.CPU},
		}
		for _, n := range []int{1 << 10, 32 << 10, 128 << 10} {
			raw := benchConversation(tok, n)
			b.Run(fmt.Sprintf("%dk", n>>10), func(b *testing.B) {
				for _, w := range ways {
					b.Run(w.name, func(b *testing.B) { benchRenderStep(b, svc, newRenderStep(b, w.own), raw, w.warm, w.cpu) })
				}
			})
		}
	})
}

// benchRenderStep runs step on the chat body raw; serviceCPU, when set, is the CPU of a render
// service in another process, counted with the process's.
func benchRenderStep(b *testing.B, svc *simworker.Worker, step pipeline.Step, raw []byte, warm bool, serviceCPU func() (time.Duration, error)) {
	obj, err := body.Parse(raw) // the server's parse, not the step's: outside the loop (render leaves a chat body as it is)
	if err != nil {
		b.Fatal(err)
	}
	run := func() int {
		rc := &request.Context{ID: "bench", API: request.APIChat, Path: "/v1/chat/completions", Header: http.Header{},
			Forwarded: http.Header{}, Body: obj, Model: "sim-model", Log: logr.Discard()}
		if err := step.Execute(context.Background(), rc); err != nil {
			b.Fatal(err)
		}
		if js := idsJSONSize(rc); js < 2*rc.TokenCount() {
			b.Fatalf("the JSON of %d ids is %d bytes", rc.TokenCount(), js)
		}
		svc.Reset() // the simworker records every request: keep its memory flat
		return rc.TokenCount()
	}
	if warm {
		run()
	}
	cpu := cpuTime
	if serviceCPU != nil {
		cpu = func() time.Duration {
			d, err := serviceCPU()
			if err != nil {
				b.Fatal(err)
			}
			return cpuTime() + d
		}
	}
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	tokens, cpu0 := 0, cpu()
	for b.Loop() {
		tokens += run()
	}
	b.StopTimer()
	if tokens > 0 {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(tokens), "ns/token")
		b.ReportMetric(float64((cpu()-cpu0).Nanoseconds())/float64(tokens), "cpu-ns/token")
	}
}

// idsJSONSize is the size of the JSON array of rc's ids as the legs send it (the pieces it is held
// in, made when first asked for, as the first leg does).
func idsJSONSize(rc *request.Context) int {
	n := 0
	for _, seg := range rc.TokenIDsSegments() {
		n += len(seg)
	}
	return n
}

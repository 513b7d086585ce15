package renderref_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/render"
	"github.com/epd-dev/coordinator/dataplane/render/tokenizer"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// eachFamily runs bench as a sub-benchmark of b for each family (models) with its model
// directory and tokenizer, after loading its tokenizer and chat template: a family where either
// does not load fails its sub-benchmark with the loader's reason.
func eachFamily(b *testing.B, bench func(b *testing.B, dir string, tok *tokenizer.Tokenizer)) {
	dirs := modelDirs(b)
	for i, fam := range models {
		b.Run(fam.name, func(b *testing.B) {
			m, err := render.Open(dirs[i], render.Options{})
			if err != nil {
				b.Fatalf("%s does not load: %v", fam.name, err)
			}
			m.Close()
			tok, err := tokenizer.Load(dirs[i])
			if err != nil {
				b.Fatalf("%s does not load: %v", fam.name, err)
			}
			bench(b, dirs[i], tok)
		})
	}
}

// benchText is about n tokens of benchParagraphs, drawn by r.
func benchText(tok *tokenizer.Tokenizer, r *rand.Rand, n int) string {
	var text strings.Builder
	for count := 0; count < n; {
		para := fmt.Sprintf(benchParagraphs[r.IntN(len(benchParagraphs))], r.IntN(100000), r.IntN(1000))
		count += len(tok.Encode(nil, para, false))
		text.WriteString(para)
	}
	return text.String()
}

// turnConversation is a conversation of a system prompt, a history of about history tokens in
// user messages and answers of about perHistory tokens each (none when history is 0), and turns
// user and assistant messages of about perMessage tokens each (the last assistant message is the
// answer to the last turn, never sent).
func turnConversation(tok *tokenizer.Tokenizer, seed uint64, history, perHistory, turns, perMessage int) []map[string]string {
	r := rand.New(rand.NewPCG(seed, 11))
	msgs := []map[string]string{{"role": "system", "content": "You are a careful assistant."}}
	for n := 0; n < history; n += 2 * perHistory {
		msgs = append(msgs, map[string]string{"role": "user", "content": benchText(tok, r, perHistory)},
			map[string]string{"role": "assistant", "content": benchText(tok, r, perHistory)})
	}
	for range turns {
		msgs = append(msgs, map[string]string{"role": "user", "content": benchText(tok, r, perMessage)},
			map[string]string{"role": "assistant", "content": benchText(tok, r, perMessage)})
	}
	return msgs
}

// turnBodies are the chat bodies a client sends over the last turns of msgs (one per user
// message after the system prompt), each message's content marked with salt (so that no two
// conversations share a message). With newOnly, a body after the first holds only what its turn
// adds to the one before (the answer to it and the new user message) after the system prompt
// and a short user message (which templates that want user and assistant turns to alternate
// need): the least that rendering the turn must encode.
func turnBodies(msgs []map[string]string, salt, turns int, newOnly bool) []*body.Object {
	salted := make([]map[string]string, len(msgs))
	for i, m := range msgs {
		salted[i] = map[string]string{"role": m["role"], "content": fmt.Sprintf("[%d] %s", salt, m["content"])}
	}
	last := len(salted) &^ 1 // the messages of the last turn: the answer to it is never sent
	out := make([]*body.Object, 0, turns)
	for k := max(last-2*(turns-1), 2); k <= last; k += 2 {
		sent := salted[:k]
		if newOnly && k > 2 {
			sent = append([]map[string]string{salted[0], {"role": "user", "content": fmt.Sprintf("[%d] Go on.", salt)}}, salted[k-2:k]...)
		}
		raw, _ := json.Marshal(sent)
		obj, err := body.Parse([]byte(`{"model":"sim-model","max_tokens":1,"messages":` + string(raw) + `}`))
		if err != nil {
			panic(err)
		}
		out = append(out, obj)
	}
	return out
}

// turnLabels label a CPU profile's samples of a conversation's first turn and of its later
// ones (go tool pprof -tagfocus turn=later).
var turnLabels = [2]pprof.LabelSet{pprof.Labels("turn", "first"), pprof.Labels("turn", "later")}

// BenchmarkRenderTurns measures the render step over the turns of conversations, each new (no
// message of one was seen before: every content is marked with the iteration), for each family
// (models), in two shapes: grow, 10 turns of a conversation that grows to about 32k tokens
// (each turn adds the previous answer and a user message, about 1.6k tokens each); long, 10
// turns after a 32k-token history of one long exchange (each adding an answer and a user message
// of about 300 tokens, as a chat over a long document goes); and chatty, 10 turns after a
// 32k-token history of short messages (about 48 tokens each, under the segment cache's 256-byte
// minimum, as an agent's many small steps). Four ways: nocache (every turn encodes the whole
// conversation), segments (the segment cache alone, the default before the history cache:
// messages are found by content), history (the segment and history caches, the default) and
// historyonly (the history cache alone), each cache at the render step's default size and, when
// the clock starts, full of other conversations (warmUp: the reported warm-up-convs). The
// template renders the whole conversation every turn in all four. Each turn ends with the JSON array of its ids as every leg sends it (the pieces
// TokenIDsSegments hands the legs: with the history cache, the history's lists as the cache holds
// them and the new ids' list, written in the step; without, the array, made when the first leg
// asks). Reported, the mean of a turn: ns/turn and cpu-ns/turn (the process's CPU, which the
// other load of a shared machine disturbs less than the wall clock) of the step and the ids'
// JSON, and render-ns/turn of the step alone; of the whole turn too (the step and the ids'
// JSON, whichever of the two writes it), first-ns/turn, a conversation's first turn measured
// (the caches hold none of it: its history is new), and later-ns/turn, the nine after it (each
// follows a turn the caches hold). A CPU profile's samples of the turn carry the label turn
// (first or later), and warmUp's the label warm-up. A conversation's turns run back to back
// here, so a turn finds what its previous turn touched still in the processor's caches, which a
// coordinator serving many conversations does not: BenchmarkRenderTurnsPaired measures the
// uncached and the cached way as it meets them, and is the one their ratio is taken from.
func BenchmarkRenderTurns(b *testing.B) {
	const turns = benchTurns
	eachFamily(b, func(b *testing.B, dir string, tok *tokenizer.Tokenizer) {
		for _, sh := range turnShapes {
			msgs := turnConversation(tok, 1, sh.history, sh.perHistory, turns, sh.perMessage)
			b.Run(sh.name, func(b *testing.B) {
				for _, w := range turnWays {
					b.Run(w.name, func(b *testing.B) {
						step := newRenderStep(b, w.params(dir))
						warm := warmUp(b, step, dir, msgs)
						b.ReportAllocs()
						b.ResetTimer()
						var cpu, rendering, first, later time.Duration
						for i := range b.N {
							// Each conversation's bodies are made off the clock, just before its
							// turns, as a coordinator parses each request: none is held longer.
							b.StopTimer()
							bodies := turnBodies(msgs, i+1, turns, false)
							b.StartTimer()
							cpu0 := cpuTime()
							for t, obj := range bodies {
								stepOnly, whole := timeTurn(b, step, obj, turnLabels[min(t, 1)])
								rendering += stepOnly
								if t == 0 {
									first += whole
								} else {
									later += whole
								}
							}
							cpu += cpuTime() - cpu0
						}
						b.StopTimer()
						b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*turns), "ns/turn")
						b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*turns), "cpu-ns/turn")
						b.ReportMetric(float64(rendering.Nanoseconds())/float64(b.N*turns), "render-ns/turn")
						b.ReportMetric(float64(first.Nanoseconds())/float64(b.N), "first-ns/turn")
						b.ReportMetric(float64(later.Nanoseconds())/float64(b.N*(turns-1)), "later-ns/turn")
						b.ReportMetric(float64(warm), "warm-up-convs")
					})
				}
			})
		}
	})
}

// BenchmarkRenderTurnsPaired measures the turns of BenchmarkRenderTurns' conversations (every
// shape, every family) the uncached and the cached way side by side, as a coordinator serving
// many conversations meets them: pairedBatch conversations at a time, round robin (the first
// turn of each, then the second of each, ...), each turn rendered by the nocache step and by the
// history step one after the other (which goes first rotates). Between two turns of one
// conversation, then, the process renders the other conversations' turns both ways, so a turn
// finds the processor's caches holding other work, not its own previous turn, and the machine's
// other load weighs on both ways alike. Each way has its own conversations (salted apart), new
// to its caches, which are those of BenchmarkRenderTurns: at the step's default size and full of
// other conversations when the clock starts (warmUp). A turn is the step and its ids' JSON.
// In the same rotation a third way, new, renders with the nocache step what each later turn
// adds alone (turnBodies' newOnly): what any cached turn must still encode, decode and render,
// so that nocache ÷ new bounds the ratio a cache can reach at that turn.
// Reported per conversation: the mean first turn (the caches hold none of it) and later turn
// (each follows a turn the caches hold) of each way, nocache-first-ns, history-first-ns,
// nocache-later-ns, history-later-ns and new-later-ns; later-ratio, nocache ÷ history over the
// later turns, last-ratio over the last turns (where a growing conversation is longest), and
// mean-ratio over all of a conversation's turns; later-bound and last-bound, nocache ÷ new over
// the later and the last turns. A CPU profile's samples of the turns carry the labels way
// (nocache, history or new) and turn (first or later).
func BenchmarkRenderTurnsPaired(b *testing.B) {
	const turns = benchTurns
	eachFamily(b, func(b *testing.B, dir string, tok *tokenizer.Tokenizer) {
		for _, sh := range turnShapes {
			msgs := turnConversation(tok, 1, sh.history, sh.perHistory, turns, sh.perMessage)
			b.Run(sh.name, func(b *testing.B) {
				const nocache, history, added = 0, 1, 2
				ways := [3]turnWay{turnWays[0], turnWays[2], {"new", turnWays[0].caches}}
				var steps [len(ways)]pipeline.Step
				var labels [len(ways)][2]pprof.LabelSet // by way, then turn (first, later)
				for w, way := range ways {
					steps[w] = newRenderStep(b, way.params(dir))
					for t, turn := range [2]string{"first", "later"} {
						labels[w][t] = pprof.Labels("way", way.name, "turn", turn)
					}
					warmUp(b, steps[w], dir, msgs)
				}
				b.ReportAllocs()
				b.ResetTimer()
				var first, later, last [len(ways)]time.Duration
				for i := range b.N {
					b.StopTimer() // a batch's bodies are made just before its turns, off the clock
					var bodies [pairedBatch][len(ways)][]*body.Object
					for c := range pairedBatch {
						for w := range ways {
							bodies[c][w] = turnBodies(msgs, (i*pairedBatch+c)*len(ways)+w+1, turns, w == added)
						}
					}
					b.StartTimer()
					for t := range turns {
						for c := range pairedBatch {
							for k := range ways {
								w := (k + c + t) % len(ways) // each way goes first as often as the others
								if t == 0 && w == added {
									continue // a first turn is all new: the nocache way's
								}
								_, whole := timeTurn(b, steps[w], bodies[c][w][t], labels[w][min(t, 1)])
								if t == 0 {
									first[w] += whole
									continue
								}
								later[w] += whole
								if t == turns-1 {
									last[w] += whole
								}
							}
						}
					}
				}
				b.StopTimer()
				convs := float64(b.N * pairedBatch)
				for w, way := range ways {
					if w != added {
						b.ReportMetric(float64(first[w].Nanoseconds())/convs, way.name+"-first-ns")
					}
					b.ReportMetric(float64(later[w].Nanoseconds())/convs/(turns-1), way.name+"-later-ns")
				}
				b.ReportMetric(float64(later[nocache])/float64(later[history]), "later-ratio")
				b.ReportMetric(float64(last[nocache])/float64(last[history]), "last-ratio")
				b.ReportMetric(float64(first[nocache]+later[nocache])/float64(first[history]+later[history]), "mean-ratio")
				b.ReportMetric(float64(later[nocache])/float64(later[added]), "later-bound")
				b.ReportMetric(float64(last[nocache])/float64(last[added]), "last-bound")
			})
		}
	})
}

// pairedBatch is the number of conversations BenchmarkRenderTurnsPaired serves round robin.
const pairedBatch = 4

// benchTurns is the number of turns the turn benchmarks measure of each conversation.
const benchTurns = 10

// turnShapes are the conversations BenchmarkRenderTurns describes (token counts: a history of
// messages of perHistory each, then turns of perMessage each).
var turnShapes = []struct {
	name                            string
	history, perHistory, perMessage int
}{
	{"grow", 0, 0, (32 << 10) / benchTurns / 2},
	{"long", 32 << 10, 16 << 10, 300},
	{"chatty", 32 << 10, 48, 48},
}

// turnWay is a render step's caches: the parameters it sets (a cache it leaves out has the
// step's default size, the size a deployment has unless it says otherwise).
type turnWay struct {
	name   string
	caches map[string]any
}

// turnWays are the ways BenchmarkRenderTurns describes.
var turnWays = []turnWay{
	{"nocache", map[string]any{"cache_size": 0, "history_cache_size": 0}},
	{"segments", map[string]any{"history_cache_size": 0}},
	{"history", map[string]any{}},
	{"historyonly", map[string]any{"cache_size": 0}},
}

// params are the render step's parameters for the model directory dir.
func (w turnWay) params(dir string) map[string]any {
	p := map[string]any{"tokenizer": dir}
	maps.Copy(p, w.caches)
	return p
}

// warmUp brings step and the process to the state a coordinator that has served many
// conversations is in, before the clock starts: it renders whole conversations like msgs (salted
// apart from the measured ones) through step until its caches are full (a conversation adds to
// the bytes they hold, render's metrics for dir, less than a tenth of what the first added) and
// the heap has reached its working size (the last warmUpQuiet conversations touched fewer than
// warmUpQuiet new pages between them), or warmUpMax conversations. The measured turns then find
// caches that evict as they keep, and a heap that reuses its memory: before, a run found them
// empty and growing, and each turn paid the first touch of the pages its caches grew into (a
// Qwen3 growing later turn with the history cache, 0.16-0.35 ms and 1-16 page faults a turn
// depending on the run's length). It returns the number of conversations it rendered.
func warmUp(b *testing.B, step pipeline.Step, dir string, msgs []map[string]string) int {
	reg := prometheus.NewRegistry()
	reg.MustRegister(render.Collector("warm"))
	var faults [warmUpQuiet + 1]int64 // page faults before each of the last conversations, a ring
	var first, last float64
	for n := 1; ; n++ {
		faults[n%len(faults)] = pageFaults()
		timeTurn(b, step, turnBodies(msgs, -n, 1, false)[0], warmUpLabel)
		held := cachedBytes(b, reg, dir)
		grew := held - last
		if n == 1 {
			first = grew
		}
		last = held
		quiet := n > warmUpQuiet && pageFaults()-faults[(n+1)%len(faults)] < warmUpQuiet
		if n == warmUpMax || quiet && grew <= first/10 {
			runtime.GC()
			return n
		}
	}
}

// warmUpQuiet and warmUpMax bound the conversations warmUp renders.
const warmUpQuiet, warmUpMax = 32, 1024

// pageFaults are the process's minor page faults so far (the first touch of a page).
func pageFaults() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Minflt
}

// warmUpLabel labels a CPU profile's samples of warmUp's turns.
var warmUpLabel = pprof.Labels("warm-up", "yes")

// cachedBytes are the bytes render's caches for the model directory dir hold (the metrics
// render_cache_bytes and render_history_bytes of the collector reg has).
func cachedBytes(b *testing.B, reg *prometheus.Registry, dir string) float64 {
	fams, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	held := 0.0
	for _, f := range fams {
		if f.GetName() != "warm_render_cache_bytes" && f.GetName() != "warm_render_history_bytes" {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == dir {
				held += m.GetGauge().GetValue()
			}
		}
	}
	return held
}

// timeTurn runs step on a turn's body, labelled for a CPU profile, and ends it as a leg would,
// taking the ids' JSON: it returns the time of the step alone and of the whole turn.
func timeTurn(b *testing.B, step pipeline.Step, obj *body.Object, label pprof.LabelSet) (stepOnly, whole time.Duration) {
	rc := &request.Context{ID: "bench", API: request.APIChat, Path: "/v1/chat/completions", Header: http.Header{},
		Forwarded: http.Header{}, Body: obj, Model: "sim-model", Log: logr.Discard()}
	t0 := time.Now()
	var err error
	var rendered time.Time
	js := 0
	pprof.Do(context.Background(), label, func(ctx context.Context) {
		if err = step.Execute(ctx, rc); err == nil {
			rendered = time.Now()
			js = idsJSONSize(rc)
		}
	})
	whole = time.Since(t0)
	if err != nil {
		b.Fatal(err)
	}
	if js < 2*rc.TokenCount() {
		b.Fatalf("the JSON of %d ids is %d bytes", rc.TokenCount(), js)
	}
	return rendered.Sub(t0), whole
}

//go:build linux

package hostile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/dataplane/render/tokenizer"
)

// The cost suite: every transformer a client or a worker can feed, each shape of input that was
// (or could be) expensive, on a ladder of sizes, through the real binary. Each rung runs in a
// fresh process, so that memory freed by an earlier rung does not hide what a later one takes;
// its cost is the process's peak resident set over what it held before the request (VmHWM, reset
// through clear_refs) and the CPU seconds it spent (utime+stime). A rung fails when its memory
// is over the shape's ceiling per input byte (plus costBase), or when the CPU of a rung grows
// faster than linearly from the rung four times smaller (over 5×, plus costCPUSlack).
// Inputs over a limit must be refused with the status and key the shape names, at the cost of
// reading them.

// costBase is what any request may take over its ceiling: buffers, pools and the runtime's
// heap growth.
const costBase = 24 * mib

// costCPUSlack absorbs the CPU clock's resolution (10 ms ticks) and the collector's pace, which
// make a 1 MiB rung's 50-100 ms vary by half: a quadratic cost still shows (16× for 4× the input).
const costCPUSlack = 300 * time.Millisecond

// rungs are the sizes of the ladder.
var rungs = []int{1 * mib, 4 * mib, 16 * mib}

// costShape is one input shape a client or a worker controls.
type costShape struct {
	name string
	// class is the finding this shape reproduces (or what it goes past).
	class string
	// steps is the pipeline; path the endpoint.
	steps, path string
	// body builds a request whose transformed input is about n bytes.
	body func(n int) []byte
	// perByte is the ceiling of peak memory per input byte (over the body itself, counted as 1),
	// and perToken per token of the input (tokens counts them: render's shapes).
	perByte, perToken float64
	tokens            func(n int) int
	// key, when set, is the limit that refuses the shape at every size, with a 400 naming it;
	// limit is the largest body accepted at all (0: any), limitKey the key that refuses a larger.
	key      string
	limit    int
	limitKey string
}

// costModel writes a model directory (a tokenizer fixture of the render tests, qwen-like or
// sp-gemma-like, and the chatml template) whose pre-tokenizer is pattern (empty: the fixture's
// own, Qwen's split by hand for qwen-like; another pattern takes the general regexp path). A
// SentencePiece fixture's added tokens are all matched on the raw text, as Gemma 3's and
// Llama 2's are: its sections take the path the real files take (not normalized, cut at
// spaces where they lie).
func costModel(t *testing.T, fixture, pattern string) string {
	t.Helper()
	root := filepath.Join("..", "..", "..", "dataplane", "render")
	tok, err := os.ReadFile(filepath.Join(root, "tokenizer", "testdata", fixture, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if sp := strings.HasPrefix(fixture, "sp-"); pattern != "" || sp {
		var doc map[string]any
		if err := json.Unmarshal(tok, &doc); err != nil {
			t.Fatal(err)
		}
		if pattern != "" {
			split := doc["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)
			split["pattern"] = map[string]any{"Regex": pattern}
		}
		if sp {
			for _, a := range doc["added_tokens"].([]any) {
				a.(map[string]any)["normalized"] = false
			}
		}
		if tok, err = json.Marshal(doc); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := os.ReadFile(filepath.Join(root, "testdata", "chatml", "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, b := range map[string][]byte{"tokenizer.json": tok, "tokenizer_config.json": cfg} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// patternGeneric is o200k's pre-tokenizer (gpt-oss) without the '/' its punctuation runs take
// along: no pattern split by hand, so it runs on the general regexp path.
const patternGeneric = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// words is n bytes of short English-like words.
func words(n int) string {
	const w = "the cat sat on a mat and then it ran far away "
	return strings.Repeat(w, n/len(w)+1)[:n]
}

func chatText(text string) []byte {
	b, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 4,
		"messages": []any{map[string]any{"role": "user", "content": text}}})
	return b
}

// toolsOf is a chat request with n bytes of tool definitions made of many small values (enums),
// the shape that costs a template's value tree the most per byte.
func toolsOf(n int) []byte {
	enum := make([]string, 0, n/6)
	for size := 0; size < n; size += 6 {
		enum = append(enum, "e"+strconv.Itoa(len(enum)%1000))
	}
	b, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 4,
		"messages": []any{map[string]any{"role": "user", "content": "pick one"}},
		"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "pick",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"x": map[string]any{"type": "string", "enum": enum}}}}}}})
	return b
}

// repeated is open, then the items item(0), item(1), ... joined by commas until there are at
// least n bytes, then closing: a body of n bytes of small JSON values.
func repeated(open string, item func(i int) string, closing string, n int) []byte {
	var b bytes.Buffer
	b.WriteString(open)
	for i := 0; b.Len() < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(item(i))
	}
	b.WriteString(closing)
	return b.Bytes()
}

// always is an item that is the same every time.
func always(s string) func(int) string { return func(int) string { return s } }

// messagesBlocks is a /v1/messages request whose one message has n bytes of tiny text blocks.
func messagesBlocks(n int) []byte {
	return repeated(`{"model":"sim-model","max_tokens":4,"messages":[{"role":"user","content":[`, always(`{"type":"text","text":"x"}`), `]}]}`, n)
}

// manyMessages is a chat request of n bytes of copies of msg.
func manyMessages(msg string, n int) []byte {
	return repeated(`{"model":"sim-model","max_tokens":4,"messages":[`, always(msg), `]}`, n)
}

// responsesItems is a Responses request of n bytes of small input items.
func responsesItems(n int) []byte {
	return repeated(`{"model":"sim-model","max_output_tokens":4,"input":[`, always(`{"role":"user","content":"x"}`), `]}`, n)
}

// tokenPrompt is a completions request whose prompt is n bytes of token ids.
func tokenPrompt(n int) []byte {
	return repeated(`{"model":"sim-model","max_tokens":4,"prompt":[`, func(i int) string { return strconv.Itoa(100 + i%800) }, `]}`, n)
}

// costModels are the model directories of the render shapes, and how many tokens a text is.
type costModels struct {
	model, generic, sp string // the Qwen-pattern one, the general-regexp one, a SentencePiece one
	tokens, spTokens   func(string) int
}

// newCostModels writes the model directories.
func newCostModels(t *testing.T) costModels {
	m := costModels{model: costModel(t, "qwen-like", ""), generic: costModel(t, "qwen-like", patternGeneric), sp: costModel(t, "sp-gemma-like", "")}
	counter := func(dir string) func(string) int {
		tok, err := tokenizer.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		return func(s string) int { return len(tok.Encode(nil, s, false)) }
	}
	m.tokens, m.spTokens = counter(m.model), counter(m.sp)
	return m
}

// costShapes are the client-controlled shapes over the models m.
func costShapes(m costModels) []costShape {
	model, generic, tokens := m.model, m.generic, m.tokens
	render := func(dir string) string {
		return fmt.Sprintf("{type: render, params: {tokenizer: %q}}, {type: decode}", dir)
	}
	const renderIn = 8 * mib // render's max_input_size
	wordTokens := func(n int) int { return tokens(words(n)) }
	return []costShape{
		{name: "chat, no render", class: "the body parser and the decode leg", steps: "{type: decode}", path: "/v1/chat/completions",
			body: func(n int) []byte { return chatText(words(n)) }, perByte: 4},
		{name: "chat, many small messages, no render", class: "the body parser over many values", steps: "{type: decode}", path: "/v1/chat/completions",
			body: func(n int) []byte { return manyMessages(`{"role":"user","content":"x"}`, n) }, perByte: 4},
		{name: "responses, many small input items", class: "the Responses translation", steps: "{type: decode}", path: "/v1/responses",
			body: responsesItems, perByte: 4, key: "4096"},
		{name: "messages, many small blocks", class: "/v1/messages with many small content blocks", steps: "{type: decode}", path: "/v1/messages",
			body: messagesBlocks, perByte: 4, key: "max_content_blocks"},
		{name: "render, words", class: "in-process render (Qwen pattern, split by hand)", steps: render(model), path: "/v1/chat/completions",
			body: func(n int) []byte { return chatText(words(n)) }, perByte: 4, perToken: 24, tokens: wordTokens,
			limit: renderIn, limitKey: "max_input_size"},
		{name: "render, one long pre-token of letters", class: "in-process render, one long pre-token", steps: render(model), path: "/v1/chat/completions",
			body: func(n int) []byte { return chatText(strings.Repeat("a", n)) }, perByte: 4,
			key: "max_word_size", limit: renderIn, limitKey: "max_input_size"},
		{name: "render, one long run of spaces", class: "in-process render, one long pre-token", steps: render(model), path: "/v1/completions",
			body: func(n int) []byte {
				b, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 4, "prompt": "x" + strings.Repeat(" ", n) + "y"})
				return b
			}, perByte: 4, key: "max_word_size", limit: renderIn, limitKey: "max_input_size"},
		{name: "render, words, general regexp path", class: "render on the generic regexp2 pre-tokenizer path", steps: render(generic), path: "/v1/chat/completions",
			body: func(n int) []byte { return chatText(words(n)) }, perByte: 4, perToken: 24, tokens: wordTokens,
			limit: renderIn, limitKey: "max_input_size"},
		{name: "render, words, SentencePiece", class: "in-process render of a SentencePiece-style BPE (Gemma, Llama 2)", steps: render(m.sp), path: "/v1/chat/completions",
			body: func(n int) []byte { return chatText(words(n)) }, perByte: 4, perToken: 24, tokens: func(n int) int { return m.spTokens(words(n)) },
			limit: renderIn, limitKey: "max_input_size"},
		{name: "render, one long piece, SentencePiece", class: "in-process render of a SentencePiece-style BPE, one piece without spaces", steps: render(m.sp), path: "/v1/chat/completions",
			body: func(n int) []byte { return chatText(strings.Repeat("字", n/3)) }, perByte: 4,
			key: "max_word_size", limit: renderIn, limitKey: "max_input_size"},
		{name: "render, one long run of spaces, SentencePiece", class: "in-process render of a SentencePiece-style BPE, one piece of spaces (each a symbol)", steps: render(m.sp), path: "/v1/completions",
			body: func(n int) []byte {
				b, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 4, "prompt": "x" + strings.Repeat(" ", n) + "y"})
				return b
			}, perByte: 4, key: "max_word_size", limit: renderIn, limitKey: "max_input_size"},
		{name: "render, tools of small values", class: "chat-template inputs (tools, enums)", steps: render(model), path: "/v1/chat/completions",
			body: toolsOf, perByte: 4, key: "max_template_values", limit: renderIn, limitKey: "max_input_size"},
		{name: "completions prompt, render", class: "in-process render of a completions prompt", steps: render(model), path: "/v1/completions",
			body: func(n int) []byte {
				b, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 4, "prompt": words(n)})
				return b
			}, perByte: 4, perToken: 24, tokens: wordTokens, limit: renderIn, limitKey: "max_input_size"},
		{name: "completions token-id prompt", class: "token ids, checked as integers of the vocabulary", steps: render(model), path: "/v1/completions",
			body: tokenPrompt, perByte: 4},
		{name: "count_tokens, render only", class: "/v1/messages/count_tokens (render, no worker)", steps: render(model), path: "/v1/messages/count_tokens",
			body: func(n int) []byte {
				b, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": []any{map[string]any{"role": "user", "content": words(n)}}})
				return b
			}, perByte: 4, perToken: 24, tokens: wordTokens, limit: renderIn, limitKey: "max_input_size"},
	}
}

// sink is a gateway whose workers read the whole leg and answer a small chat completion (or a
// stream of one event), so that a rung measures the coordinator alone.
func sink(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","created":1,"model":"sim-model","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// procCost is what a process spent on one request.
type procCost struct {
	peak int64         // resident set over the one before the request
	cpu  time.Duration // user + system
}

// measure resets the process's peak resident set and returns what send costs it.
func (c *coordinator) measure(t *testing.T, send func()) procCost {
	t.Helper()
	c.resetPeak(t)
	before, cpu := c.memory(t, "VmRSS"), c.procCPU(t)
	send()
	return procCost{peak: c.memory(t, "VmHWM") - before, cpu: c.procCPU(t) - cpu}
}

// TestCost runs every shape's ladder.
func TestCost(t *testing.T) {
	gw := sink(t)
	for _, s := range costShapes(newCostModels(t)) {
		t.Run(s.name, func(t *testing.T) {
			var prev *procCost
			for _, n := range rungs {
				body := s.body(n)
				co := startCoordinator(t, gw, config{steps: s.steps})
				var r response
				cost := co.measure(t, func() { r = do(t, http.MethodPost, co.url+s.path, body, nil) })
				_ = co.Cmd.Process.Kill()
				key := s.key
				if s.limit > 0 && len(body) > s.limit {
					key = s.limitKey
				}
				t.Logf("%-40s %6.1f MiB: HTTP %d, peak +%4d MiB (%5.1f B/byte), CPU %v", s.name, float64(len(body))/mib, r.status,
					cost.peak/mib, float64(cost.peak)/float64(len(body)), cost.cpu.Round(10*time.Millisecond))
				switch {
				case key == "" && r.status != http.StatusOK:
					t.Errorf("%d bytes: HTTP %d, want 200: %.300s", len(body), r.status, r.body)
				case key != "" && r.status != http.StatusBadRequest:
					t.Errorf("%d bytes: HTTP %d, want 400 naming %s: %.300s", len(body), r.status, key, r.body)
				case key != "" && !strings.Contains(r.jsonError(t).Error.Message, key):
					t.Errorf("%d bytes: the refusal does not name %s: %.300s", len(body), key, r.body)
				}
				ceiling := (s.perByte+1)*float64(len(body)) + costBase
				if key == "" && s.tokens != nil {
					ceiling += s.perToken * float64(s.tokens(n))
				}
				if float64(cost.peak) > ceiling {
					t.Errorf("%d bytes: peak +%d MiB, over the ceiling of %.0f B/byte + %.0f B/token (+%.0f MiB)", len(body), cost.peak/mib, s.perByte+1, s.perToken, ceiling/mib)
				}
				if prev != nil && cost.cpu > 5*prev.cpu+costCPUSlack {
					t.Errorf("%d bytes: CPU %v after %v for a quarter of the input: faster than linear", len(body), cost.cpu, prev.cpu)
				}
				prev = &cost
			}
		})
	}
}

// TestCostConcurrent: 16 clients at once, each with the largest conversation in-process render
// accepts, keep the process under render's budget (max_inflight_render_size, 512 MiB by default)
// plus their bodies and a base: the renders the budget cannot hold are refused with 429 and a
// Retry-After, the others are answered. The Go collector lets garbage grow as large as the live
// heap before it runs, unless GOMEMLIMIT says otherwise (in a pod, automemlimit sets it from the
// container's limit: cmd/coordinator): the process runs with GOMEMLIMIT at that bound, which it
// can keep only if what the requests hold live fits under it.
func TestCostConcurrent(t *testing.T) {
	const clients, budget = 16, 512 * mib
	body := chatText(words(8*mib - 256))
	// Each client's body is read whole before it renders, and the decode leg carries it again.
	bound := int64(budget + clients*2*len(body) + 64*mib)
	model := costModel(t, "qwen-like", "")
	co := startCoordinator(t, sink(t), config{steps: fmt.Sprintf("{type: render, params: {tokenizer: %q}}, {type: decode}", model),
		env: []string{fmt.Sprintf("GOMEMLIMIT=%dMiB", bound/mib)}})
	statuses := make([]int, clients)
	cost := co.measure(t, func() {
		var wg sync.WaitGroup
		for i := range clients {
			wg.Go(func() {
				r := do(t, http.MethodPost, co.url+"/v1/chat/completions", body, nil)
				statuses[i] = r.status
				if r.status == http.StatusTooManyRequests && (r.header.Get("Retry-After") == "" || !strings.Contains(r.jsonError(t).Error.Message, "max_inflight_render_size")) {
					t.Errorf("a 429 without Retry-After or the key: %v %.300s", r.header, r.body)
				}
			})
		}
		wg.Wait()
	})
	ok, busy := 0, 0
	for _, s := range statuses {
		switch s {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			busy++
		default:
			t.Errorf("HTTP %d, want 200 or 429", s)
		}
	}
	t.Logf("%d clients × %.1f MiB: %d answered, %d refused (429); peak +%d MiB (bound %d MiB), CPU %v", clients, float64(len(body))/mib, ok, busy, cost.peak/mib, bound/mib, cost.cpu)
	if ok == 0 {
		t.Error("no render was answered")
	}
	if cost.peak > bound+bound/20 {
		t.Errorf("peak +%d MiB, over render's budget plus the bodies and a base (%d MiB, +5%% for the collector's pace)", cost.peak/mib, bound/mib)
	}
}

// TestCostClientLeaves: a render whose client leaves stops: a client that closes its connection
// a quarter of the way through (by the whole render's wall time) costs the coordinator a small
// share of what the whole render does, for the in-process chat render (general regexp path, the
// slowest) and count_tokens (render alone). Were the client to leave before the render started,
// or after it ended, the share would be smaller still: only a render that goes on fails this.
func TestCostClientLeaves(t *testing.T) {
	generic := costModel(t, "qwen-like", patternGeneric)
	co := startCoordinator(t, sink(t), config{steps: fmt.Sprintf("{type: render, params: {tokenizer: %q}}, {type: decode}", generic)})
	text := words(8*mib - 256)
	for i, tc := range []struct{ name, path, route string }{
		{"chat", "/v1/chat/completions", "chat"},
		{"count_tokens", "/v1/messages/count_tokens", "count_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Texts no other render had, which a cache may hold; the first warms the tokenizer's
			// word cache, so that the whole render is timed as the one the client leaves.
			warm, body, other := chatText(strconv.Itoa(3*i)+text[1:]), chatText(strconv.Itoa(3*i+1)+text[1:]), chatText(strconv.Itoa(3*i+2)+text[1:])
			if r := do(t, http.MethodPost, co.url+tc.path, warm, nil); r.status != http.StatusOK {
				t.Fatalf("HTTP %d: %.300s", r.status, r.body)
			}
			var wall time.Duration
			whole := co.measure(t, func() {
				start := time.Now()
				if r := do(t, http.MethodPost, co.url+tc.path, body, nil); r.status != http.StatusOK {
					t.Fatalf("HTTP %d: %.300s", r.status, r.body)
				}
				wall = time.Since(start)
			})
			served := requestsIn(t, co, tc.route, "499")
			var gone time.Duration // CPU from the client's leaving to the request's end
			co.measure(t, func() {
				conn, err := net.Dial("tcp", strings.TrimPrefix(co.url, "http://"))
				if err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", tc.path, len(other))
				if _, err := conn.Write(other); err != nil {
					t.Fatal(err)
				}
				time.Sleep(wall / 4) // the client leaves a quarter of the way through
				conn.Close()
				// The CPU spent until the whole render would have ended, and the request ended
				// (logged 499), whichever is later.
				left, end := co.procCPU(t), time.Now().Add(wall*3/4)
				defer func() {
					time.Sleep(time.Until(end))
					gone = co.procCPU(t) - left
				}()
				for deadline := time.Now().Add(20 * time.Second); requestsIn(t, co, tc.route, "499") == served; {
					if time.Now().After(deadline) {
						t.Fatalf("no 499 for the request whose client left; log:\n%s", co.logs.Tail(2000))
					}
					time.Sleep(10 * time.Millisecond) // polling the process's metrics: there is no event to wait on from outside
				}
			})
			t.Logf("the whole render: CPU %v; after the client left: CPU %v", whole.cpu, gone)
			if gone > whole.cpu/4+costCPUSlack {
				t.Errorf("CPU %v after the client left a quarter of the way, of %v for the whole render", gone, whole.cpu)
			}
		})
	}
}

// requestsIn reads coordinator_requests_total for route and status, summed over models.
func requestsIn(t *testing.T, co *coordinator, route, status string) int {
	t.Helper()
	n := 0
	for line := range strings.SplitSeq(co.metrics(t), "\n") {
		if strings.HasPrefix(line, "coordinator_requests_total{") && strings.Contains(line, `route="`+route+`"`) && strings.Contains(line, `status="`+status+`"`) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			n += int(v)
		}
	}
	return n
}

package render

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/epd-dev/coordinator/dataplane/render/tokenizer"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/test/harness/heap"
)

// Templates that render a conversation's history differently once a turn follows: the history
// cache must not assume that the history renders the same.
const (
	// countTemplate opens with the number of messages: every turn changes the first bytes.
	countTemplate = `<|im_start|>system
{{ messages|length }} messages<|im_end|>
{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}`
	// reasoningTemplate drops the reasoning of the answers before the last user message, as
	// Qwen3's does: the last answer renders otherwise once a user message follows it.
	reasoningTemplate = `{% set ns = namespace(last=0) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}` +
		`{% for m in messages %}<|im_start|>{{ m.role }}
{% if m.role == 'assistant' and loop.index0 > ns.last and m.reasoning_content %}<think>
{{ m.reasoning_content }}
</think>
{% endif %}{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}`
)

// conversation is a chat of n user turns and their answers, marked with tag: the messages of turn
// k are conversation[:2k-1] (a user message last).
func conversation(tag string, n int) []map[string]any {
	var msgs []map[string]any
	for i := range n {
		msgs = append(msgs,
			map[string]any{"role": "user", "content": fmt.Sprintf("%s question %d: %s<|im_end|> (a special token in the content) ", tag, i, strings.Repeat("why is the sky blue? ", 12))},
			map[string]any{"role": "assistant", "content": fmt.Sprintf("%s answer %d: %s", tag, i, strings.Repeat("because of Rayleigh scattering. ", 10)),
				"reasoning_content": fmt.Sprintf("%s thinking %d", tag, i)})
	}
	return msgs
}

// turn is the request of turn k of msgs.
func turn(t *testing.T, msgs []map[string]any, k int) ChatRequest {
	t.Helper()
	raw, err := json.Marshal(msgs[:2*k-1])
	if err != nil {
		t.Fatal(err)
	}
	return ChatRequest{Messages: raw, AddGenerationPrompt: true}
}

// TestHistoryTurnByTurn: with the history cache, every turn of a conversation renders to the ids
// it renders to without a cache, and turns after the first reuse the history's ids, on
// templates that render the history the same and otherwise.
func TestHistoryTurnByTurn(t *testing.T) {
	for _, tc := range []struct {
		name, template string
		reuses         bool // each turn after the first takes most of the turn before's ids from the cache
	}{
		{"chatml", "", true},
		{"message count first", countTemplate, false}, // only the first token, before the count, is shared
		{"reasoning dropped before the last user message", reasoningTemplate, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := modelDir(t, tc.template)
			cached := open(t, dir, Options{HistoryBytes: 1 << 20})
			segments := open(t, dir, Options{HistoryBytes: 1 << 20, CacheBytes: 1 << 20})
			plain := open(t, dir, Options{})
			msgs := conversation("c", 6)
			prev := 0 // the ids of the turn before
			for k := 1; k <= 6; k++ {
				req := turn(t, msgs, k)
				n := 0 // the turn's ids
				for _, m := range []*Model{cached, segments} {
					hits0, _, tokens0, _ := m.HistoryStats()
					toks := renderBoth(t, plain, m, req, fmt.Sprint("turn ", k))
					n = toks.Len()
					hits, _, tokens, _ := m.HistoryStats()
					reused := tokens - tokens0
					shared := toks.Len() - len(toks.Own)
					switch {
					case uint64(shared) != reused:
						t.Fatalf("turn %d: %d ids shared with the cache, %d counted reused", k, shared, reused)
					case k > 1 && tc.reuses && (hits != hits0+1 || reused < uint64(prev*9/10)):
						t.Fatalf("turn %d: reused %d of %d ids: the turn before (%d ids) is the history", k, reused, n, prev)
					case !tc.reuses && reused > 1:
						t.Fatalf("turn %d: reused %d ids, though the template renders the history otherwise", k, reused)
					}
				}
				prev = n
			}
			if _, _, _, bytes := cached.HistoryStats(); bytes == 0 {
				t.Fatal("the cache holds nothing")
			}
		})
	}
}

// TestHistoryChunksBounded: a conversation of many turns is held in at most maxChunks chunks
// (joined when it passes them), so a leg sends its ids in a bounded number of pieces, and its
// text in at most maxChunks pieces, counted for at least their bytes, or, when it has long
// messages (whose renderings stay pieces of their own, shared with the iteration cache), in no
// more than two pieces for each minSharedSpan bytes; every turn still renders exactly, its JSON
// too.
func TestHistoryChunksBounded(t *testing.T) {
	for _, long := range []bool{false, true} {
		t.Run(fmt.Sprint("long messages: ", long), func(t *testing.T) {
			dir := modelDir(t, "")
			cached := open(t, dir, Options{HistoryBytes: 8 << 20})
			plain := open(t, dir, Options{})
			msgs := conversation("many", 3*maxChunks)
			if long {
				for i := 0; i < len(msgs); i += 4 { // every other user message
					msgs[i]["content"] = strings.Repeat(msgs[i]["content"].(string), 5)
				}
			}
			most, mostPieces := 0, 0
			for k := 1; k <= len(msgs)/2; k++ {
				toks := renderBoth(t, plain, cached, turn(t, msgs, k), fmt.Sprint("turn ", k))
				if k > 1 && len(toks.Shared) == 0 {
					t.Fatalf("turn %d shares no ids with the turn before", k)
				}
				most = max(most, len(toks.Shared))
				if len(toks.Shared) > maxChunks || len(toks.JSON) > 2*maxChunks+1 {
					t.Fatalf("turn %d: %d chunks, %d pieces of JSON", k, len(toks.Shared), len(toks.JSON))
				}
				for _, e := range cached.history.keys {
					mostPieces = max(mostPieces, len(e.text))
					if len(e.text) > max(maxChunks, 2*e.text.len()/minSharedSpan+1) || e.held < 0 {
						t.Fatalf("turn %d: a text of %d bytes in %d pieces, %d bytes of slack counted", k, e.text.len(), len(e.text), e.held)
					}
				}
			}
			switch {
			case most != maxChunks:
				t.Fatalf("at most %d chunks over %d turns, want %d: the test does not reach the bound", most, len(msgs)/2, maxChunks)
			case !long && mostPieces != maxChunks:
				t.Fatalf("at most %d pieces of text over %d turns, want %d: the test does not reach the bound", mostPieces, len(msgs)/2, maxChunks)
			case long && mostPieces <= maxChunks:
				t.Fatalf("at most %d pieces of text over %d turns, want more than %d: the long messages' are not kept", mostPieces, len(msgs)/2, maxChunks)
			}
		})
	}
}

// TestHistorySharesOutputs: a history entry keeps each long message's rendering as the string
// the template's iteration cache holds (its output, jinja.Span), not a copy: a later turn that
// replays the message writes that very string, which compares equal to the entry's piece by its
// address, unread. Two renderings of the same messages (each turn of a conversation, and the
// same messages under another key, which the cache does not find and renders whole) keep the
// same strings for the long messages, the text between them in an array of the entry's own.
func TestHistorySharesOutputs(t *testing.T) {
	dir := modelDir(t, "")
	m := open(t, dir, Options{HistoryBytes: 8 << 20})
	plain := open(t, dir, Options{})
	var msgs []map[string]any
	for i := range 4 {
		msgs = append(msgs,
			map[string]any{"role": "user", "content": fmt.Sprintf("question %d: %s", i, strings.Repeat("why is the sky blue? ", 60))},
			map[string]any{"role": "assistant", "content": fmt.Sprintf("short answer %d", i)})
	}
	entry := func(req ChatRequest) *historyEntry {
		t.Helper()
		renderBoth(t, plain, m, req, "a turn")
		keys := m.history.newKeys(&req)
		var split []json.RawMessage
		for msg := range body.Elements(req.Messages) {
			split = append(split, msg)
		}
		for _, f := range m.messages.FindAll(nil, split) {
			keys.add(len(split[len(keys.keys)]), f.Hash())
		}
		e := m.history.find(keys.keys)
		if e == nil {
			t.Fatal("the rendering is not kept")
		}
		return e
	}
	long := func(e *historyEntry) []*byte { // the pieces of the long messages, by address
		var out []*byte
		for _, p := range e.text {
			if len(p) >= minSharedSpan {
				out = append(out, unsafe.StringData(p))
			}
		}
		return out
	}
	var before []*byte
	for k := 1; k <= 4; k++ {
		req := turn(t, msgs, k)
		pieces := long(entry(req))
		if len(pieces) != k || !slices.Equal(pieces[:k-1], before) {
			t.Fatalf("turn %d: the entry keeps %d long messages as pieces, want %d, those of the turn before as they were (%p, then %p)", k, len(pieces), k, before, pieces)
		}
		before = pieces
	}
	req := turn(t, msgs, 4)
	req.AddGenerationPrompt = false // another key: rendered whole, its messages replayed
	if again := long(entry(req)); !slices.Equal(again, before) {
		t.Fatalf("the same messages rendered again keep their long messages as other strings (%p, then %p)", before, again)
	}
}

// renderBoth renders req with plain (no cache) and with cached, and fails t (what names the
// render) unless the cached render's ids, and their JSON, are the plain one's: it returns the
// cached render's.
func renderBoth(t *testing.T, plain, cached *Model, req ChatRequest, what string) Tokens {
	t.Helper()
	want, err := plain.Chat(nil, req)
	if err != nil {
		t.Fatal(err)
	}
	toks, err := cached.ChatTokens(req)
	if err != nil {
		t.Fatal(err)
	}
	got := toks.AppendIDs([]int{-1}) // after ids already in dst
	if got[0] != -1 || !slices.Equal(got[1:], want) || toks.Len() != len(want) {
		t.Fatalf("%s: ids differ from the uncached render %s", what, idsAt(got[1:], want))
	}
	if js, wantJSON := bytes.Join(toks.JSON, nil), body.AppendInts(nil, want); string(js) != string(wantJSON) {
		t.Fatalf("%s: the ids' JSON differs from theirs at byte %d of %d", what, commonPrefix(string(js), string(wantJSON)), len(wantJSON))
	}
	return toks
}

// idsAt says where two id sequences part.
func idsAt(got, want []int) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	return fmt.Sprintf("at index %d of %d (want %d)", i, len(got), len(want))
}

// TestHistorySwitches: requests that differ from the cached one in what the template renders or
// how the text is encoded render exactly as uncached.
func TestHistorySwitches(t *testing.T) {
	dir := modelDir(t, "")
	cached := open(t, dir, Options{HistoryBytes: 1 << 20})
	plain := open(t, dir, Options{})
	msgs := conversation("s", 3)
	base := turn(t, msgs, 3)
	for _, tc := range []struct {
		name string
		edit func(*ChatRequest)
	}{
		{"the same request again", func(*ChatRequest) {}},
		{"no generation prompt", func(r *ChatRequest) { r.AddGenerationPrompt = false }},
		{"continue the final message", func(r *ChatRequest) {
			r.AddGenerationPrompt, r.ContinueFinalMessage = false, true
		}},
		{"special tokens added", func(r *ChatRequest) { r.AddSpecialTokens = true }},
		{"tools", func(r *ChatRequest) {
			r.Tools = json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`)
		}},
		{"a word limit", func(r *ChatRequest) { r.Limits.Encode.MaxWordBytes = 1 << 10 }},
		{"an edited early message", func(r *ChatRequest) {
			r.Messages = json.RawMessage(strings.Replace(string(r.Messages), "question 0", "question zero", 1))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := cached.Chat(nil, base); err != nil { // the history, cached
				t.Fatal(err)
			}
			req := base
			tc.edit(&req)
			want, err := plain.Chat(nil, req)
			if err != nil {
				t.Fatal(err)
			}
			got, err := cached.Chat(nil, req)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("ids differ from the uncached render %s", idsAt(got, want))
			}
		})
	}
}

// TestHistoryTenants: a conversation is never answered from another's entry, even when both
// share their system prompt, their first messages' lengths and every field but the content;
// the same content, sent by anyone, is the same entry (the key is the content).
func TestHistoryTenants(t *testing.T) {
	dir := modelDir(t, "")
	cached := open(t, dir, Options{HistoryBytes: 1 << 20})
	plain := open(t, dir, Options{})
	system := map[string]any{"role": "system", "content": strings.Repeat("You are a helpful assistant. ", 20)}
	a := append([]map[string]any{system}, conversation("tenant-a", 4)...)
	b := append([]map[string]any{system}, conversation("tenant-b", 4)...)
	req := func(msgs []map[string]any, k int) ChatRequest {
		raw, _ := json.Marshal(msgs[:2*k])
		return ChatRequest{Messages: raw, AddGenerationPrompt: true}
	}
	check := func(r ChatRequest, wantHit bool) {
		t.Helper()
		hits0, misses0, _, _ := cached.HistoryStats()
		got, err := cached.Chat(nil, r)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := plain.Chat(nil, r)
		if !slices.Equal(got, want) {
			t.Fatalf("ids differ from the uncached render %s", idsAt(got, want))
		}
		hits, misses, _, _ := cached.HistoryStats()
		if hit := hits == hits0+1 && misses == misses0; hit != wantHit {
			t.Fatalf("hit %v, want %v (hits %d→%d, misses %d→%d)", hit, wantHit, hits0, hits, misses0, misses)
		}
	}
	for k := 1; k <= 4; k++ {
		check(req(a, k), k > 1) // a's own history, from its second turn on
	}
	for k := 1; k <= 4; k++ {
		check(req(b, k), k > 1) // b never finds a's entry: only its own, from its second turn
	}
	check(req(a, 4), true) // the same content again (a retry, by anyone) is found
	// A one-turn conversation stays kept as it is; another with its system prompt and its
	// message lengths does not find it.
	c := append([]map[string]any{system}, conversation("tenant-c", 1)...)
	d := append([]map[string]any{system}, conversation("tenant-d", 1)...)
	check(req(c, 1), false)
	check(req(d, 1), false)
}

// TestHistoryBound: the cache never holds more than its bound, evicting the least recently used
// conversations; a conversation over an eighth of it is not kept; evicted ones render exactly.
func TestHistoryBound(t *testing.T) {
	dir := modelDir(t, "")
	const bound = 64 << 10
	cached := open(t, dir, Options{HistoryBytes: bound})
	plain := open(t, dir, Options{})
	var first ChatRequest
	for i := range 40 {
		r := turn(t, conversation(fmt.Sprint("conv", i), 2), 2)
		if i == 0 {
			first = r
		}
		if _, err := cached.Chat(nil, r); err != nil {
			t.Fatal(err)
		}
		if _, _, _, bytes := cached.HistoryStats(); bytes > bound || bytes <= 0 {
			t.Fatalf("after %d conversations the cache holds %d bytes, bound %d", i+1, bytes, bound)
		}
	}
	// The first conversation was evicted: its next turn misses, and renders exactly.
	msgs := conversation("conv0", 3)
	next := turn(t, msgs, 3)
	_ = first
	_, misses0, _, _ := cached.HistoryStats()
	got, err := cached.Chat(nil, next)
	if err != nil {
		t.Fatal(err)
	}
	if _, misses, _, _ := cached.HistoryStats(); misses != misses0+1 {
		t.Fatal("the least recently used conversation was not evicted")
	}
	if want, _ := plain.Chat(nil, next); !slices.Equal(got, want) {
		t.Fatalf("ids differ from the uncached render %s", idsAt(got, want))
	}
	// A conversation over bound/8 (a client sending one huge history) is not kept.
	_, _, _, before := cached.HistoryStats()
	huge := []map[string]any{{"role": "user", "content": strings.Repeat("x y ", bound/8/4+1)}}
	raw, _ := json.Marshal(huge)
	if _, err := cached.Chat(nil, ChatRequest{Messages: raw, AddGenerationPrompt: true}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, after := cached.HistoryStats(); after > before {
		t.Fatalf("a conversation of %d bytes was kept in a cache of %d (%d → %d bytes)", len(raw), bound, before, after)
	}
}

// TestHistoryLimits: a request over a limit is refused as it is without the cache, though its
// history is cached: the cached ids count against the token limit, the word limit is part of
// the key, and a done context stops the render.
func TestHistoryLimits(t *testing.T) {
	dir := modelDir(t, "")
	cached := open(t, dir, Options{HistoryBytes: 1 << 20})
	plain := open(t, dir, Options{})
	msgs := conversation("lim", 4)
	msgs[0]["content"] = "a word longer than the tokenizer caches: " + strings.Repeat("z", 200) + msgs[0]["content"].(string)
	if _, err := cached.Chat(nil, turn(t, msgs, 3)); err != nil {
		t.Fatal(err)
	}
	full, _ := plain.Chat(nil, turn(t, msgs, 4))
	hist, _ := plain.Chat(nil, turn(t, msgs, 3))
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name  string
		limit Limits
		want  string // the LimitError's Limit, or "context"
	}{
		{"tokens under the cached history", Limits{Encode: tokenizer.Limits{MaxTokens: len(hist) / 2}}, "MaxTokens"},
		{"tokens between the history and the turn", Limits{Encode: tokenizer.Limits{MaxTokens: len(full) - 1}}, "MaxTokens"},
		{"input bytes", Limits{MaxInputBytes: 2 << 10}, "MaxInputBytes"},
		{"a word limit the history was not encoded under", Limits{Encode: tokenizer.Limits{MaxWordBytes: 100}}, "MaxWordBytes"},
		{"a done context", Limits{Encode: tokenizer.Limits{Context: done}}, "context"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := turn(t, msgs, 4)
			req.Limits = tc.limit
			for _, m := range []*Model{plain, cached} {
				_, err := m.Chat(nil, req)
				var le *LimitError
				switch {
				case tc.want == "context" && errors.Is(err, context.Canceled):
				case errors.As(err, &le) && le.Limit == tc.want:
				default:
					t.Fatalf("err %v, want a %s error", err, tc.want)
				}
			}
		})
	}
	// Within the limits, the same request renders.
	req := turn(t, msgs, 4)
	req.Limits = Limits{Encode: tokenizer.Limits{MaxTokens: len(full)}}
	if got, err := cached.Chat(nil, req); err != nil || !slices.Equal(got, full) {
		t.Fatalf("at the token limit: err %v, ids equal %v", err, slices.Equal(got, full))
	}
}

// TestHistoryConcurrent: conversations rendered turn by turn from many goroutines, several of
// them the same conversation, render exactly (run with -race).
func TestHistoryConcurrent(t *testing.T) {
	dir := modelDir(t, "")
	cached := open(t, dir, Options{HistoryBytes: 48 << 10, CacheBytes: 1 << 20}) // small: evictions race with lookups
	plain := open(t, dir, Options{})
	const convs, turns = 6, 5
	want := make([][][]int, convs)
	for c := range convs {
		msgs := conversation(fmt.Sprint("race", c), turns)
		for k := 1; k <= turns; k++ {
			ids, err := plain.Chat(nil, turn(t, msgs, k))
			if err != nil {
				t.Fatal(err)
			}
			want[c] = append(want[c], ids)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 3*convs)
	for g := range 3 * convs {
		wg.Go(func() {
			c := g % convs
			msgs := conversation(fmt.Sprint("race", c), turns)
			for k := 1; k <= turns; k++ {
				raw, _ := json.Marshal(msgs[:2*k-1])
				got, err := cached.Chat(nil, ChatRequest{Messages: raw, AddGenerationPrompt: true})
				if err != nil {
					errs <- err
					return
				}
				if !slices.Equal(got, want[c][k-1]) {
					errs <- fmt.Errorf("conversation %d turn %d: ids differ %s", c, k, idsAt(got, want[c][k-1]))
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if hits, _, _, bytes := cached.HistoryStats(); hits == 0 || bytes > 48<<10 {
		t.Fatalf("hits %d, bytes %d (bound %d)", hits, bytes, 48<<10)
	}
}

// TestHistoryCollector: the history cache's counts are exported by directory. The second turn
// finds its first message decoded and decodes the two new ones, which the message cache keeps (so
// no string of theirs is looked up in the string cache); it replays the template's iteration over
// the first and runs those over the new ones.
func TestHistoryCollector(t *testing.T) {
	dir := modelDir(t, "")
	m := open(t, dir, Options{HistoryBytes: 1 << 20})
	msgs := conversation("metrics", 2)
	for k := 1; k <= 2; k++ {
		if _, err := m.Chat(nil, turn(t, msgs, k)); err != nil {
			t.Fatal(err)
		}
	}
	_, _, tokens, bytes := m.HistoryStats()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(Collector("coordinator"))
	want := fmt.Sprintf(`
# HELP coordinator_render_history_hits_total Chat renders that reused the ids of a conversation rendered before (its history).
# TYPE coordinator_render_history_hits_total counter
coordinator_render_history_hits_total{tokenizer=%[1]q} 1
# HELP coordinator_render_history_misses_total Chat renders with the history cache on that found no rendered history to reuse.
# TYPE coordinator_render_history_misses_total counter
coordinator_render_history_misses_total{tokenizer=%[1]q} 1
# HELP coordinator_render_history_tokens_total Token ids taken from the rendered-history cache instead of encoded.
# TYPE coordinator_render_history_tokens_total counter
coordinator_render_history_tokens_total{tokenizer=%[1]q} %[2]d
# HELP coordinator_render_history_bytes Bytes the rendered-history cache holds (rendered text, ids, decoded messages and strings, template iterations, bookkeeping).
# TYPE coordinator_render_history_bytes gauge
coordinator_render_history_bytes{tokenizer=%[1]q} %[3]d
# HELP coordinator_render_history_iterations_replayed_total Iterations of the chat template's loops over messages replayed from an earlier turn (everything they read unchanged).
# TYPE coordinator_render_history_iterations_replayed_total counter
coordinator_render_history_iterations_replayed_total{tokenizer=%[1]q} 1
# HELP coordinator_render_history_iterations_run_total Iterations of the chat template's loops over messages run (new, changed, or not to be kept).
# TYPE coordinator_render_history_iterations_run_total counter
coordinator_render_history_iterations_run_total{tokenizer=%[1]q} 3
# HELP coordinator_render_history_messages_hits_total Chat messages found decoded into the template's values in the rendered-history cache.
# TYPE coordinator_render_history_messages_hits_total counter
coordinator_render_history_messages_hits_total{tokenizer=%[1]q} 1
# HELP coordinator_render_history_messages_misses_total Chat messages decoded because the rendered-history cache did not hold them (none while the template may change its inputs).
# TYPE coordinator_render_history_messages_misses_total counter
coordinator_render_history_messages_misses_total{tokenizer=%[1]q} 3
# HELP coordinator_render_history_strings_hits_total Long message strings (with escapes) found decoded in the rendered-history cache.
# TYPE coordinator_render_history_strings_hits_total counter
coordinator_render_history_strings_hits_total{tokenizer=%[1]q} 0
# HELP coordinator_render_history_strings_misses_total Long message strings (with escapes) decoded because the rendered-history cache did not hold them.
# TYPE coordinator_render_history_strings_misses_total counter
coordinator_render_history_strings_misses_total{tokenizer=%[1]q} 0
`, dir, tokens, bytes)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if tokens == 0 {
		t.Fatal("no tokens reused")
	}
}

// TestHistoryConvertedMessages: a message the conversion changes (a null content, a list of
// text parts) is looked up as converted, so a later turn finds it decoded as it finds the others;
// each message is counted once a turn, and every turn renders as without the cache.
func TestHistoryConvertedMessages(t *testing.T) {
	dir := modelDir(t, "")
	m := open(t, dir, Options{HistoryBytes: 1 << 20})
	plain := open(t, dir, Options{})
	turns := []string{
		`[{"role":"user","content":"a"},{"role":"assistant","content":null},{"role":"user","content":[{"type":"text","text":"b"},{"type":"text","text":"c"}]}]`,
		`[{"role":"user","content":"a"},{"role":"assistant","content":null},{"role":"user","content":[{"type":"text","text":"b"},{"type":"text","text":"c"}]},{"role":"assistant","content":"d"},{"role":"user","content":"e"}]`,
	}
	for _, msgs := range turns {
		req := ChatRequest{Messages: json.RawMessage(msgs), AddGenerationPrompt: true}
		want, err := plain.Chat(nil, req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := m.Chat(nil, req)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("%s: ids %v (%v), want %v", msgs, got, err, want)
		}
	}
	if hits, misses, _, _ := m.DecodedStats(); hits != 3 || misses != 5 {
		t.Fatalf("messages found decoded %d times, decoded %d; want 3 (the second turn's first three, two of them converted) and 5", hits, misses)
	}
}

// TestHistoryHeld: the history caches' bound holds for the memory they keep, not only for their
// own count of it. A model with the caches, after more conversations than they hold, keeps on
// the heap (measured after a collection) no more than the bound beyond what the same
// conversations leave with a model without them, and no more than a tenth over its count (the
// count's per-entry approximations: Go's size classes, maps' slots). Before, an entry's JSON
// list kept an array of seven bytes an id and counted its length, and its text the template's
// buffer and counted the rendering's: the caches kept 4.67 MB under a bound of 4 MiB, 27% over
// their count of 3.67 MB.
//
// With long messages too, whose renderings the history entries share with the iteration cache
// (ownAround): each cache counts what it keeps, whole arrays included (the count is theirs, all
// four: HistoryStats), so an entry that keeps a rendering the iteration cache let go of still
// counts it.
func TestHistoryHeld(t *testing.T) {
	const bound = 4 << 20
	for _, tc := range []struct {
		name         string
		conversation func(tag string) []map[string]any
	}{
		{"short messages", func(tag string) []map[string]any { return conversation(tag, 4) }},
		{"long messages", func(tag string) []map[string]any {
			msgs := conversation(tag, 4)
			for _, m := range msgs {
				m["content"] = strings.Repeat(m["content"].(string), 5) // past minSharedSpan
			}
			return msgs
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := modelDir(t, "")
			kept := func(o Options) int64 {
				m := open(t, dir, o)
				before := heap.Live()
				for i := range 600 {
					msgs := tc.conversation(fmt.Sprint("held", i))
					for k := 1; k <= 4; k++ {
						if _, err := m.Chat(nil, turn(t, msgs, k)); err != nil {
							t.Fatal(err)
						}
					}
				}
				after := heap.Live()
				runtime.KeepAlive(m)
				return after - before
			}
			plain := kept(Options{})
			cached := kept(Options{HistoryBytes: bound})
			m := open(t, dir, Options{HistoryBytes: bound})
			_, _, _, counted := m.HistoryStats()
			t.Logf("kept %d bytes without the caches, %d with (bound %d, counted %d)", plain, cached, bound, counted)
			if cached-plain > bound || cached-plain > counted+counted/10 {
				t.Fatalf("the caches keep %d bytes on the heap: their bound is %d, their count %d", cached-plain, bound, counted)
			}
		})
	}
}

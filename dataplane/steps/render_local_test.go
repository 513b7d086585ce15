package steps

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/budget"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/render"
	"github.com/epd-dev/coordinator/dataplane/render/tokenizer"
)

// localModel is a model directory of a ChatML template over a small test tokenizer.
func localModel(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../render/testdata/chatml")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func newLocalRender(t *testing.T, own map[string]any, deps builder.Deps) (pipeline.Step, error) {
	t.Helper()
	p := params.New("params", own, nil)
	deps.Log = logr.Discard()
	s, err := newRender(deps, p)
	if err == nil {
		err = p.Err()
	}
	if s != nil {
		t.Cleanup(s.(*renderStep).Close)
	}
	return s, err
}

// TestRenderLocal: text requests are tokenized in process, with the ids of the model's own
// template and tokenizer and no call to the render service; media go to the service, or are
// refused when there is none.
func TestRenderLocal(t *testing.T) {
	dir := localModel(t)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := render.Open(dir, render.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	chatIDs := func(msgs, tools string) []int {
		req := render.ChatRequest{Messages: json.RawMessage(msgs), AddGenerationPrompt: true}
		if tools != "" {
			req.Tools = json.RawMessage(tools)
		}
		ids, err := m.Chat(nil, req)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	media := chatWithImages("data:image/png;base64,AAAA", "data:image/png;base64,BBBB")
	tests := map[string]struct {
		path, body string
		service    bool // a render service is configured too
		calls      int  // render service calls
		want       []int
		answer     string // the render service's answer (renderedTwoImages when empty)
		status     int
		msg        string
	}{
		"chat": {path: "/v1/chat/completions", body: `{"model":"m","messages":[{"role":"user","content":"hello there"}]}`,
			want: tok.Encode(nil, "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n", false)},
		"chat without the generation prompt, with special tokens": {path: "/v1/chat/completions",
			body: `{"model":"m","messages":[{"role":"user","content":"x"}],"add_generation_prompt":false,"add_special_tokens":true}`,
			want: tok.Encode(nil, "<|im_start|>user\nx<|im_end|>\n", true)},
		"chat with a tool call": {path: "/v1/chat/completions",
			body: `{"model":"m","messages":[{"role":"user","content":"w"},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"1","content":"r"}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
			// the ids of the conversation as vLLM hands it to the template: content "", arguments decoded
			want: chatIDs(`[{"role":"user","content":"w"},{"role":"assistant","content":"","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":{"a":1}}}]},{"role":"tool","tool_call_id":"1","content":"r"}]`, `[{"type":"function","function":{"name":"f"}}]`)},
		"responses": {path: "/v1/responses", body: `{"model":"m","input":"hi","instructions":"be brief"}`,
			want: chatIDs(`[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]`, "")},
		"completions: BOS rules are the tokenizer's (add_special_tokens defaults to true)": {path: "/v1/completions",
			body: `{"model":"m","prompt":"once upon"}`, want: tok.Encode(nil, "once upon", true)},
		"completions without special tokens": {path: "/v1/completions",
			body: `{"model":"m","prompt":"once upon","add_special_tokens":false}`, want: tok.Encode(nil, "once upon", false)},
		"media go to the render service":      {path: "/v1/chat/completions", body: media, service: true, calls: 1, want: []int{1, 4, 9, 32000, 32000, 32000, 32000, 32000, 7}},
		"media without a render service":      {path: "/v1/chat/completions", body: media, status: 400, msg: "no render service for media"},
		"a request's own template":            {path: "/v1/chat/completions", body: `{"model":"m","messages":[],"chat_template":"{{ 1 }}"}`, status: 400, msg: "a request's own chat_template"},
		"documents go to the service":         {path: "/v1/chat/completions", body: `{"model":"m","messages":[{"role":"user","content":"q"}],"documents":[{"text":"d"}]}`, service: true, calls: 1, answer: `{"token_ids":[3,1,4]}`, want: []int{3, 1, 4}},
		"the template refuses":                {path: "/v1/chat/completions", body: `{"model":"m","messages":[{"role":"tool","content":"r"}]}`, status: 400, msg: "the chat template refused the conversation: a tool message cannot come first"},
		"a part that is not text":             {path: "/v1/chat/completions", body: `{"model":"m","messages":[{"role":"user","content":[{"type":"refusal","refusal":"no"}]}]}`, status: 400, msg: `a "refusal" part cannot be rendered`},
		"too many tokens":                     {path: "/v1/completions", body: `{"model":"m","prompt":"` + strings.Repeat("word ", 200) + `"}`, status: 400, msg: "too many total tokens"},
		"chat_template_kwargs not an object":  {path: "/v1/chat/completions", body: `{"model":"m","messages":[],"chat_template_kwargs":[1]}`, status: 400, msg: "must be an object"},
		"add_generation_prompt not a boolean": {path: "/v1/chat/completions", body: `{"model":"m","messages":[],"add_generation_prompt":"yes"}`, status: 400, msg: "add_generation_prompt"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			answer := tc.answer
			if answer == "" {
				answer = renderedTwoImages
			}
			svc := newFakeGateway(t, okJSON(answer))
			own := map[string]any{"tokenizer": dir, "max_total_tokens": 150}
			if tc.service {
				own["address"] = svc.srv.URL
			}
			s, err := newLocalRender(t, own, builder.Deps{})
			if err != nil {
				t.Fatal(err)
			}
			rc, _ := newRC(t, tc.path, tc.body, nil)
			err = s.Execute(context.Background(), rc)
			if n := len(svc.requests()); n != tc.calls {
				t.Fatalf("%d render service calls, want %d", n, tc.calls)
			}
			if tc.status != 0 {
				e := apierror.From(err)
				if err == nil || e.Status != tc.status || !strings.Contains(e.Message, tc.msg) {
					t.Fatalf("err = %v -> %d %q, want %d %q", err, e.Status, e.Message, tc.status, tc.msg)
				}
				if strings.Contains(e.Message, dir) {
					t.Fatalf("the error shows the model directory: %q", e.Message)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !rc.Rendered || !slices.Equal(rc.TokenIDs(), tc.want) {
				t.Fatalf("tokens %v\nwant   %v", rc.TokenIDs(), tc.want)
			}
			if rc.API.String() == "completions" {
				if p, _ := rc.Body.Get("prompt"); string(p) != string(rc.TokenIDsJSON()) {
					t.Fatalf("prompt %s, want the ids", p)
				}
			}
		})
	}
}

// TestRenderLocalParams: what the in-process mode needs, and that the operator's validation can
// check the params without the files (LocalFiles saying they are not there).
func TestRenderLocalParams(t *testing.T) {
	dir := localModel(t)
	tests := map[string]struct {
		own  map[string]any
		deps builder.Deps
		key  string // the param the error names ("" when the step builds)
		msg  string
	}{
		"neither address nor tokenizer":   {own: map[string]any{}, key: "params.address", msg: "unless tokenizer is set"},
		"a relative tokenizer path":       {own: map[string]any{"tokenizer": "models/qwen"}, key: "params.tokenizer", msg: "absolute"},
		"an unclean tokenizer path":       {own: map[string]any{"tokenizer": "/models/../etc"}, key: "params.tokenizer", msg: "absolute, clean"},
		"chat_template without tokenizer": {own: map[string]any{"address": "http://r:8000", "chat_template": "tool_use"}, key: "params.tokenizer", msg: "required by chat_template"},
		"files that do not load":          {own: map[string]any{"tokenizer": "/nonexistent/model"}, key: "params.tokenizer", msg: "tokenizer.json"},
		"an unknown named template":       {own: map[string]any{"tokenizer": dir, "chat_template": "nope"}, key: "params.tokenizer", msg: `no chat template named "nope"`},
		"a negative cache":                {own: map[string]any{"tokenizer": dir, "cache_size": -1}, key: "params.cache_size"},
		"a negative history cache":        {own: map[string]any{"tokenizer": dir, "history_cache_size": -1}, key: "params.history_cache_size"},
		"history cache without tokenizer": {own: map[string]any{"address": "http://r:8000", "history_cache_size": 8}, key: "params.tokenizer", msg: "history_cache_size"},
		"the files elsewhere (the operator)": {own: map[string]any{"tokenizer": "/var/run/coordinator/tokenizers/qwen", "tokenizer_revision": "abc"},
			deps: builder.Deps{Overrides: builder.Overrides{LocalFiles: func(string) (string, bool) { return "", false }}}},
		"the files found where LocalFiles says": {own: map[string]any{"tokenizer": "/var/run/coordinator/tokenizers/qwen"},
			deps: builder.Deps{Overrides: builder.Overrides{LocalFiles: func(string) (string, bool) { return dir, true }}}},
		"tokenizer alone":       {own: map[string]any{"tokenizer": dir, "cache_size": 0}},
		"no caches":             {own: map[string]any{"tokenizer": dir, "cache_size": 0, "history_cache_size": 0}},
		"tokenizer and address": {own: map[string]any{"tokenizer": dir, "address": "http://r:8000"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := newLocalRender(t, tc.own, tc.deps)
			if tc.key == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err %v, want one naming %s: %q", err, tc.key, tc.msg)
			}
		})
	}
}

// TestRenderLocalHistory: the step's rendered-history cache (history_cache_size, on by default)
// answers a conversation's next turn, with the ids of a step without it; 0 turns it off.
func TestRenderLocalHistory(t *testing.T) {
	dir := localModel(t)
	long := strings.Repeat("a message long enough to keep ", 20)
	turns := []string{
		`{"model":"m","messages":[{"role":"user","content":"` + long + `1"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"` + long + `1"},{"role":"assistant","content":"ok"},{"role":"user","content":"and 2?"}]}`,
	}
	run := func(own map[string]any) ([][]int, uint64) {
		s, err := newLocalRender(t, own, builder.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		var ids [][]int
		for _, b := range turns {
			rc, _ := newRC(t, "/v1/chat/completions", b, http.Header{})
			if err := s.Execute(context.Background(), rc); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, rc.TokenIDs())
		}
		hits, _, _, _ := s.(*renderStep).model.HistoryStats()
		return ids, hits
	}
	want, offHits := run(map[string]any{"tokenizer": dir, "cache_size": 0, "history_cache_size": 0})
	got, hits := run(map[string]any{"tokenizer": dir})
	if offHits != 0 || hits != 1 {
		t.Fatalf("history hits: %d with the cache (want 1: the second turn), %d without (want 0)", hits, offHits)
	}
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Fatalf("turn %d: ids %v, want %v", i+1, got[i], want[i])
		}
	}
}

// TestRenderLocalRequestHeaders: the in-process render forwards nothing anywhere (no render
// service configured, no leg sent), whatever the client's headers say.
func TestRenderLocalRequestHeaders(t *testing.T) {
	s, err := newLocalRender(t, map[string]any{"tokenizer": localModel(t)}, builder.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	rc, _ := newRC(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, http.Header{"Authorization": {"Bearer k"}})
	if err := s.Execute(context.Background(), rc); err != nil || rc.TokenCount() == 0 {
		t.Fatalf("err %v, %d tokens", err, rc.TokenCount())
	}
}

// TestRenderLocalRevision: a tokenizer_revision that is a fingerprint is checked against the
// files; one that does not match is an error a reload retries (the files are not updated yet);
// any other value is an opaque mark.
func TestRenderLocalRevision(t *testing.T) {
	dir := localModel(t)
	files := map[string][]byte{}
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		files[name] = b
	}
	for _, rev := range []string{render.Revision(files), "v7", ""} {
		if _, err := newLocalRender(t, map[string]any{"tokenizer": dir, "tokenizer_revision": rev}, builder.Deps{}); err != nil {
			t.Fatalf("revision %q: %v", rev, err)
		}
	}
	files["tokenizer_config.json"] = []byte("{}")
	_, err := newLocalRender(t, map[string]any{"tokenizer": dir, "tokenizer_revision": render.Revision(files)}, builder.Deps{})
	var fe *config.FieldError
	if !errors.As(err, &fe) || !fe.Retry || fe.Key != "params.tokenizer_revision" || !strings.Contains(fe.Reason, "waiting for them") {
		t.Fatalf("err %v, want a retryable error naming params.tokenizer_revision", err)
	}
}

// TestRenderLocalLimits: each bound of the in-process render refuses with a 400 naming its key,
// a client that left stops the render with its context's error, and token ids outside the
// vocabulary are refused.
func TestRenderLocalLimits(t *testing.T) {
	own := map[string]any{"tokenizer": localModel(t), "max_input_size": 1, "max_word_size": 1, "max_template_values": 50, "max_total_tokens": 100_000}
	s, err := newLocalRender(t, own, builder.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	chatOf := func(content string) string {
		b, _ := json.Marshal(map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": content}}})
		return string(b)
	}
	enum, _ := json.Marshal(slices.Repeat([]string{"a"}, 60))
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for name, tc := range map[string]struct {
		ctx        context.Context
		path, body string
		status     int
		msg        string // in the message; "" for the context's error
	}{
		"a chat over max_input_size":        {path: "/v1/chat/completions", body: chatOf(strings.Repeat("ab ", 400_000)), status: 400, msg: "params.max_input_size"},
		"a prompt over max_input_size":      {path: "/v1/completions", body: `{"model":"m","prompt":"` + strings.Repeat("ab ", 400_000) + `"}`, status: 400, msg: "params.max_input_size"},
		"a word over max_word_size":         {path: "/v1/chat/completions", body: chatOf("hi " + strings.Repeat("z", 2000)), status: 400, msg: "params.max_word_size"},
		"spaces over max_word_size":         {path: "/v1/completions", body: `{"model":"m","prompt":"a` + strings.Repeat(" ", 2000) + `b"}`, status: 400, msg: "params.max_word_size"},
		"tools over max_template_values":    {path: "/v1/chat/completions", body: `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","enum":` + string(enum) + `}}]}`, status: 400, msg: "params.max_template_values"},
		"tokens over max_total_tokens":      {path: "/v1/completions", body: `{"model":"m","prompt":"` + strings.Repeat("word ", 120_000) + `"}`, status: 400, msg: "params.max_total_tokens"},
		"a token id outside the vocabulary": {path: "/v1/completions", body: `{"model":"m","prompt":[1, 2, 99999]}`, status: 400, msg: "outside the model's vocabulary"},
		"a token id that is a float":        {path: "/v1/completions", body: `{"model":"m","prompt":[1, 1e3]}`, status: 400, msg: "written as integers"},
		"a client that left":                {ctx: cancelled, path: "/v1/chat/completions", body: chatOf(strings.Repeat("ab ", 100_000))},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			rc, _ := newRC(t, tc.path, tc.body, nil)
			err := s.Execute(ctx, rc)
			if tc.msg == "" {
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("err %v, want the context's", err)
				}
				return
			}
			e := apierror.From(err)
			if err == nil || e.Status != tc.status || !strings.Contains(e.Message, tc.msg) {
				t.Fatalf("err = %v -> %d %q, want %d %q", err, e.Status, e.Message, tc.status, tc.msg)
			}
		})
	}
}

// TestRenderBudget: an in-process render reserves its peak of the process's budget before it
// starts, refuses with a 429 naming max_inflight_render_size when the budget cannot hold it,
// keeps only its ids' share after it, and gives that back when the request ends.
func TestRenderBudget(t *testing.T) {
	var b budget.Bytes
	own := map[string]any{"tokenizer": localModel(t), "max_input_size": 1, "max_inflight_render_size": 28}
	s, err := newLocalRender(t, own, builder.Deps{Shared: builder.Shared{Render: &b}})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("ab ", 100_000) + `"}]}`

	ctx, end := context.WithCancel(context.Background())
	rc, _ := newRC(t, "/v1/chat/completions", body, nil)
	if err := s.Execute(ctx, rc); err != nil {
		t.Fatal(err)
	}
	if got, want := b.Held(), int64(tokenCost*rc.TokenCount()); got != want {
		t.Fatalf("held %d after the render, want its ids' %d", got, want)
	}
	end()
	for deadline := time.Now().Add(5 * time.Second); b.Held() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("held %d after the request ended", b.Held())
		}
		runtime.Gosched() // context.AfterFunc runs on its own goroutine
	}

	// Other requests hold all but 1 MiB: a render of 300 kB (8.4 MB at its peak) is refused.
	other := int64(27 << 20)
	b.Reserve(other, 28<<20)
	rc, _ = newRC(t, "/v1/chat/completions", body, nil)
	e := apierror.From(s.Execute(context.Background(), rc))
	if e.Status != http.StatusTooManyRequests || e.RetryAfter <= 0 || !strings.Contains(e.Message, "params.max_inflight_render_size") {
		t.Fatalf("got %d %q (Retry-After %v), want 429 naming the key with a Retry-After", e.Status, e.Message, e.RetryAfter)
	}
	if b.Held() != other {
		t.Fatalf("held %d after a refusal, want the others' %d", b.Held(), other)
	}

	if _, err := newLocalRender(t, map[string]any{"tokenizer": localModel(t), "max_input_size": 8, "max_inflight_render_size": 100}, builder.Deps{}); err == nil ||
		!strings.Contains(err.Error(), "params.max_inflight_render_size") || !strings.Contains(err.Error(), "224 MiB") {
		t.Fatalf("err %v, want one naming max_inflight_render_size and the 224 MiB one render may hold", err)
	}
}

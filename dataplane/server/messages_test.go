package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/server"
)

const messagesBody = `{"model":"m","max_tokens":4,"system":"be brief","messages":[{"role":"user","content":[{"type":"text","text":"hi there"}]}]}`

// anthropicError decodes an Anthropic error body, checking its shape and the request id.
func anthropicError(t *testing.T, resp *http.Response, b []byte) (typ, message string) {
	t.Helper()
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
		RequestID string `json:"request_id"`
	}
	if err := json.Unmarshal(b, &e); err != nil || e.Type != "error" || e.Error.Type == "" || e.Error.Message == "" {
		t.Fatalf("not an Anthropic error body (%v): %s", err, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("error content type %q", ct)
	}
	if id := resp.Header.Get("X-Request-Id"); id == "" || e.RequestID != id {
		t.Fatalf("error body does not carry the request id %q: %s", id, b)
	}
	return e.Error.Type, e.Error.Message
}

// TestMessages: /v1/messages runs as a chat request on the decode leg and its answer comes back
// as a message, streamed or not.
func TestMessages(t *testing.T) {
	h := start(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Stream") != "" {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, `data: {"id":"chatcmpl-1","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`+"\n\n"+
				`data: {"id":"chatcmpl-1","model":"m","choices":[{"index":0,"delta":{"content":"hello"},"finish_reason":"length"}]}`+"\n\n"+
				`data: {"id":"chatcmpl-1","model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1}}`+"\n\ndata: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"chatcmpl-1","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`)
	}, nil)

	resp, b := do(t, http.MethodPost, h.url+"/v1/messages", messagesBody, map[string]string{"Content-Type": "application/json"})
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("HTTP %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	var m struct {
		ID         string `json:"id"`
		Type       string `json:"type"`
		StopReason string `json:"stop_reason"`
		Content    []struct{ Type, Text string }
		Usage      struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		}
	}
	if err := json.Unmarshal(b, &m); err != nil || m.ID != "msg_1" || m.Type != "message" || m.StopReason != "max_tokens" ||
		len(m.Content) != 1 || m.Content[0].Text != "hello" || m.Usage.InputTokens != 5 || m.Usage.OutputTokens != 1 {
		t.Fatalf("%v: %s", err, b)
	}
	leg, legBody := h.up.last(t)
	if leg.URL.Path != "/v1/chat/completions" || leg.Header.Get("EPP-Profile") != "decode" {
		t.Errorf("leg %s with profile %q", leg.URL.Path, leg.Header.Get("EPP-Profile"))
	}
	var chat map[string]any
	if err := json.Unmarshal([]byte(legBody), &chat); err != nil {
		t.Fatal(err)
	}
	if got, _ := json.Marshal(chat["messages"]); string(got) != `[{"content":"be brief","role":"system"},{"content":[{"text":"hi there","type":"text"}],"role":"user"}]` ||
		chat["max_tokens"] != 4.0 || chat["model"] != "m" {
		t.Errorf("chat leg %s", legBody)
	}

	resp, b = do(t, http.MethodPost, h.url+"/v1/messages", strings.Replace(messagesBody, `"max_tokens":4`, `"max_tokens":4,"stream":true`, 1), map[string]string{"X-Stream": "1"})
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("HTTP %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	var names []string
	for _, ev := range strings.Split(strings.TrimSpace(string(b)), "\n\n") {
		name, _, _ := strings.Cut(ev, "\n")
		names = append(names, strings.TrimPrefix(name, "event: "))
	}
	if got := strings.Join(names, ","); got != "message_start,ping,content_block_start,content_block_delta,content_block_stop,message_delta,message_stop" {
		t.Errorf("events %s:\n%s", got, b)
	}
	if !strings.Contains(string(b), `"usage":{"input_tokens":5,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}`) {
		t.Errorf("no usage in message_delta:\n%s", b)
	}
	_, legBody = h.up.last(t)
	if !strings.Contains(legBody, `"stream":true,"stream_options":{"include_usage":true}`) {
		t.Errorf("stream leg %s", legBody)
	}
}

// TestMessagesErrors: every error of a /v1/messages request is in Anthropic's shape, with the
// coordinator's status.
func TestMessagesErrors(t *testing.T) {
	h := start(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.Header.Get("X-Answer") {
		case "503":
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error":{"message":"busy"}}`)
		case "400":
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"This model's maximum context length is 8 tokens","type":"BadRequestError","param":"messages"}}`)
		case "garbage":
			_, _ = io.WriteString(w, `{"choices":[]}`)
		}
	}, func(c *config.Config) {
		c.Server.MaxRequestBodySize = 1
		c.Gateway.Retry.MaxAttempts = 1
	})
	big := `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("x", 1<<20) + `"}]}`
	tests := map[string]struct {
		method, path, body, answer string
		status                     int
		typ, says                  string
	}{
		"invalid JSON":          {body: `{"model":`, status: 400, typ: "invalid_request_error", says: "invalid JSON"},
		"a wrong type":          {body: `{"model":"m","max_tokens":"4","messages":[{"role":"user","content":"x"}]}`, status: 400, typ: "invalid_request_error", says: "max_tokens: must be a positive integer"},
		"thinking":              {body: `{"model":"m","max_tokens":4,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"x"}]}`, status: 400, typ: "invalid_request_error", says: "thinking: extended thinking"},
		"too large":             {body: big, status: 413, typ: "request_too_large", says: "too large"},
		"the worker's 400":      {body: messagesBody, answer: "400", status: 400, typ: "invalid_request_error", says: "maximum context length is 8 tokens"},
		"the pool's 503":        {body: messagesBody, answer: "503", status: 503, typ: "overloaded_error", says: "decode: no endpoint served the request"},
		"an untranslatable 200": {body: messagesBody, answer: "garbage", status: 502, typ: "api_error", says: "cannot be translated"},
		"a remote image without a media guard": {body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://169.254.169.254/"}}]}]}`,
			status: 400, typ: "invalid_request_error", says: "messages[0].content[0].source.url: remote URLs are refused"},
		"GET":          {method: http.MethodGet, status: 405, typ: "invalid_request_error", says: "method not allowed"},
		"count_tokens": {path: "/v1/messages/count_tokens", body: `{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://169.254.169.254/"}}]}]}`, status: 400, typ: "invalid_request_error", says: "remote URLs are refused"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			method, path := tc.method, tc.path
			if method == "" {
				method = http.MethodPost
			}
			if path == "" {
				path = "/v1/messages"
			}
			before := h.up.count()
			resp, b := do(t, method, h.url+path, tc.body, map[string]string{"Content-Type": "application/json", "X-Answer": tc.answer})
			if resp.StatusCode != tc.status {
				t.Fatalf("HTTP %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			typ, msg := anthropicError(t, resp, b)
			if typ != tc.typ || !strings.Contains(msg, tc.says) {
				t.Errorf("%s %q, want %s saying %q", typ, msg, tc.typ, tc.says)
			}
			if tc.answer == "" && h.up.count() != before {
				t.Error("a refused request reached the gateway")
			}
			if tc.answer == "503" && resp.Header.Get("Retry-After") != "7" {
				t.Errorf("Retry-After %q", resp.Header.Get("Retry-After"))
			}
		})
	}
	// Other routes keep OpenAI's errors.
	resp, b := do(t, http.MethodPost, h.url+"/v1/chat/completions", `{"messages":`, nil)
	if e := decodeError(t, resp, b); e.Error.Code != "invalid_json" {
		t.Errorf("chat error %s", b)
	}
}

// TestMessagesWithoutPipeline: before a pipeline loads, the 503 is Anthropic's overloaded_error.
func TestMessagesWithoutPipeline(t *testing.T) {
	srv := httptest.NewServer(server.New(server.Options{Pipelines: &pipeline.Holder{}, Log: logr.Discard()}).Handler())
	t.Cleanup(srv.Close)
	for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens"} {
		resp, b := do(t, http.MethodPost, srv.URL+path, messagesBody, nil)
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s: HTTP %d: %s", path, resp.StatusCode, b)
		}
		if typ, msg := anthropicError(t, resp, b); typ != "overloaded_error" || msg != "no pipeline is loaded" {
			t.Errorf("%s: %s %q", path, typ, msg)
		}
	}
}

// TestCountTokens: with render, count_tokens runs render alone and answers its token count;
// without, it is passed through to a decode worker.
func TestCountTokens(t *testing.T) {
	var rendered []string
	render := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rendered = append(rendered, r.URL.Path+" "+string(b))
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(string(b), `"image_url"`) { // one image: its placeholder
			_, _ = io.WriteString(w, `{"token_ids":[1,5,9,4],"features":{"mm_hashes":{"image":["h1"]},"mm_placeholders":{"image":[{"offset":1,"length":2}]}}}`)
			return
		}
		_, _ = io.WriteString(w, `{"token_ids":[1,5,9,4]}`)
	}))
	t.Cleanup(render.Close)
	h := start(t, jsonAnswer, func(c *config.Config) {
		c.Pipeline.Steps = []config.Step{{Type: "render", Params: map[string]any{"address": render.URL}}, {Type: "decode"}}
	})
	resp, b := do(t, http.MethodPost, h.url+"/v1/messages/count_tokens", `{"model":"m","system":"s","messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(b)) != `{"input_tokens":4}` {
		t.Fatalf("HTTP %d: %s", resp.StatusCode, b)
	}
	if len(rendered) != 1 || !strings.HasPrefix(rendered[0], "/v1/chat/completions/render ") ||
		!strings.Contains(rendered[0], `"messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}]`) {
		t.Errorf("render got %q", rendered)
	}
	if h.up.count() != 0 {
		t.Errorf("%d gateway legs for a count", h.up.count())
	}

	bare := start(t, jsonAnswer, nil)
	resp, b = do(t, http.MethodPost, bare.url+"/v1/messages/count_tokens", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, map[string]string{"Content-Type": "application/json"})
	leg, legBody := bare.up.last(t)
	if resp.StatusCode != http.StatusOK || string(b) != `{"id":"ok"}` || leg.URL.Path != "/v1/messages/count_tokens" || leg.Header.Get("EPP-Profile") != "decode" ||
		legBody != `{"model":"m","messages":[{"role":"user","content":"hi"}]}` {
		t.Errorf("HTTP %d %s; leg %s %s", resp.StatusCode, b, leg.URL.Path, legBody)
	}
	// Without a Content-Type the passthrough still reads the body as JSON (the leg is labelled
	// JSON) and refuses a remote URL in it.
	before := bare.up.count()
	resp, b = do(t, http.MethodPost, bare.url+"/v1/messages/count_tokens",
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://169.254.169.254/"}}]}]}`, nil)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "remote URLs are refused") || bare.up.count() != before {
		t.Errorf("a remote URL without a Content-Type: HTTP %d %s, %d legs", resp.StatusCode, b, bare.up.count()-before)
	}

	// With a media guard the count's images meet its limits before render runs.
	rendered = nil
	guarded := start(t, jsonAnswer, func(c *config.Config) {
		c.Pipeline.Steps = []config.Step{{Type: "replace-media-urls", Params: map[string]any{"max_multimodal_entries": 1}},
			{Type: "render", Params: map[string]any{"address": render.URL}}, {Type: "decode"}}
	})
	img := `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgoAAAAN"}}`
	resp, b = do(t, http.MethodPost, guarded.url+"/v1/messages/count_tokens",
		`{"model":"m","messages":[{"role":"user","content":[`+img+`,`+img+`]}]}`, nil)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "too many") || len(rendered) != 0 {
		t.Errorf("two images past max_multimodal_entries 1: HTTP %d %s, %d renders", resp.StatusCode, b, len(rendered))
	}
	resp, b = do(t, http.MethodPost, guarded.url+"/v1/messages/count_tokens", `{"model":"m","messages":[{"role":"user","content":[`+img+`]}]}`, nil)
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(b)) != `{"input_tokens":4}` || len(rendered) != 1 {
		t.Errorf("one image: HTTP %d %s, %d renders", resp.StatusCode, b, len(rendered))
	}
}

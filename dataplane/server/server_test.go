package server_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/broker/redisbroker"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/server"
	_ "github.com/epd-dev/coordinator/dataplane/steps"
)

// upstream is a minimal gateway for server tests: it records legs and answers with answer.
type upstream struct {
	srv    *httptest.Server
	mu     sync.Mutex
	legs   []*http.Request
	bodies []string
	answer http.HandlerFunc
}

func newUpstream(t *testing.T, answer http.HandlerFunc) *upstream {
	u := &upstream{answer: answer}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.legs = append(u.legs, r.Clone(r.Context()))
		u.bodies = append(u.bodies, string(b))
		u.mu.Unlock()
		u.answer(w, r)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) last(t *testing.T) (*http.Request, string) {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.legs) == 0 {
		t.Fatal("no leg reached the gateway")
	}
	return u.legs[len(u.legs)-1], u.bodies[len(u.bodies)-1]
}

func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.legs)
}

type harness struct {
	url    string
	addr   string
	holder *pipeline.Holder
	srv    *server.Server
	up     *upstream
}

func start(t *testing.T, answer http.HandlerFunc, mutate func(*config.Config)) *harness {
	t.Helper()
	return startTLS(t, answer, mutate, nil)
}

// startTLS is start serving HTTPS with tc (plain HTTP when nil); the harness URL is https then.
func startTLS(t *testing.T, answer http.HandlerFunc, mutate func(*config.Config), tc *tls.Config) *harness {
	t.Helper()
	up := newUpstream(t, answer)
	cfg := config.Default()
	cfg.Gateway.Address = up.srv.URL
	cfg.Pipeline.Steps = []config.Step{{Type: "decode"}}
	if mutate != nil {
		mutate(&cfg)
	}
	h := &harness{holder: &pipeline.Holder{}, up: up}
	if len(cfg.Pipeline.Steps) > 0 {
		// The async broker's runtime, as the coordinator hands it its pipelines.
		p, err := builder.Build(cfg, builder.Options{Shared: builder.Shared{Broker: redisbroker.Runtime(redisbroker.Options{})}})
		if err != nil {
			t.Fatal(err)
		}
		h.holder.Swap(p)
	}
	h.srv = server.New(server.Options{Server: cfg.Server, Pipelines: h.holder, Log: logr.Discard(), TLS: tc})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = h.srv.Serve(l) }()
	t.Cleanup(func() { _ = h.srv.Close() })
	h.addr = l.Addr().String()
	h.url = "http://" + h.addr
	if tc != nil {
		h.url = "https://" + h.addr
	}
	return h
}

func jsonAnswer(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"ok"}`)
}

type apiError struct {
	Error struct {
		Message   string  `json:"message"`
		Type      string  `json:"type"`
		Code      string  `json:"code"`
		Param     *string `json:"param"`
		RequestID string  `json:"request_id"`
	} `json:"error"`
}

func do(t *testing.T, method, url, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func decodeError(t *testing.T, resp *http.Response, b []byte) apiError {
	t.Helper()
	var e apiError
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == "" {
		t.Fatalf("not an OpenAI error body (%v): %s", err, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("error content type %q", ct)
	}
	id := resp.Header.Get("X-Request-Id")
	if id == "" || e.Error.RequestID != id || !strings.Contains(e.Error.Message, id) {
		t.Fatalf("error body does not carry the request id %q: %s", id, b)
	}
	return e
}

func TestBadInput(t *testing.T) {
	h := start(t, jsonAnswer, func(c *config.Config) { c.Server.MaxRequestBodySize = 1 })
	big := `{"messages":[],"pad":"` + strings.Repeat("x", 1<<20) + `"}`
	tests := map[string]struct {
		method, path, body string
		chunked            bool
		status             int
		code, param        string
	}{
		"invalid JSON":          {path: "/v1/chat/completions", body: `{"messages":`, status: 400, code: "invalid_json"},
		"null body":             {path: "/v1/chat/completions", body: `null`, status: 400, code: "invalid_body"},
		"array body":            {path: "/v1/completions", body: `[{"prompt":"x"}]`, status: 400, code: "invalid_body"},
		"empty body":            {path: "/v1/chat/completions", body: ``, status: 400, code: "invalid_json"},
		"model not a string":    {path: "/v1/chat/completions", body: `{"model":1,"messages":[]}`, status: 400, param: "model"},
		"stream not a bool":     {path: "/v1/chat/completions", body: `{"stream":"yes","messages":[]}`, status: 400, param: "stream"},
		"max_tokens fraction":   {path: "/v1/chat/completions", body: `{"max_tokens":1.5,"messages":[]}`, status: 400, param: "max_tokens"},
		"min_tokens string":     {path: "/v1/completions", body: `{"min_tokens":"2","prompt":"x"}`, status: 400, param: "min_tokens"},
		"stream_options array":  {path: "/v1/chat/completions", body: `{"stream_options":[],"messages":[]}`, status: 400, param: "stream_options"},
		"messages missing":      {path: "/v1/chat/completions", body: `{"model":"m"}`, status: 400, param: "messages"},
		"messages not an array": {path: "/v1/chat/completions", body: `{"messages":"hi"}`, status: 400, param: "messages"},
		"prompt missing":        {path: "/v1/completions", body: `{"model":"m"}`, status: 400, param: "prompt"},
		"prompt wrong type":     {path: "/v1/completions", body: `{"prompt":{}}`, status: 400, param: "prompt"},
		"token_ids missing":     {path: "/inference/v1/generate", body: `{"model":"m"}`, status: 400, param: "token_ids"},
		"sampling_params array": {path: "/inference/v1/generate", body: `{"token_ids":[1],"sampling_params":[]}`, status: 400, param: "sampling_params"},
		"too large":             {path: "/v1/chat/completions", body: big, status: 413, code: "request_too_large"},
		"too large chunked":     {path: "/v1/chat/completions", body: big, chunked: true, status: 413, code: "request_too_large"},
		"wrong method":          {method: "GET", path: "/v1/chat/completions", status: 405, code: "method_not_allowed"},
		"unknown path":          {path: "/nope", body: "{}", status: 404, code: "not_found"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			var rd io.Reader = strings.NewReader(tc.body)
			if tc.chunked {
				rd = io.MultiReader(strings.NewReader(tc.body)) // unknown length: sent chunked
			}
			req, _ := http.NewRequest(method, h.url+tc.path, rd)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			e := decodeError(t, resp, b)
			if tc.code != "" && e.Error.Code != tc.code {
				t.Fatalf("code %q, want %q", e.Error.Code, tc.code)
			}
			if tc.param != "" && (e.Error.Param == nil || *e.Error.Param != tc.param || !strings.Contains(e.Error.Message, tc.param)) {
				t.Fatalf("param/message do not name %q: %s", tc.param, b)
			}
		})
	}
	if h.up.count() != 0 {
		t.Fatalf("%d bad requests reached the gateway", h.up.count())
	}
}

func TestRequestID(t *testing.T) {
	h := start(t, jsonAnswer, nil)
	tests := map[string]struct {
		client string
		keep   bool
	}{
		"valid kept":       {client: "abc-DEF-123", keep: true},
		"max length kept":  {client: strings.Repeat("a", 128), keep: true},
		"too long":         {client: strings.Repeat("a", 129)},
		"injection":        {client: "x\"; drop"},
		"underscore":       {client: "a_b"},
		"absent generated": {},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			hdr := map[string]string{}
			if tc.client != "" {
				hdr["X-Request-Id"] = tc.client
			}
			resp, _ := do(t, "POST", h.url+"/v1/chat/completions", `{"messages":[]}`, hdr)
			got := resp.Header.Get("X-Request-Id")
			leg, _ := h.up.last(t)
			if leg.Header.Get("X-Request-Id") != got || got == "" {
				t.Fatalf("leg id %q, response id %q", leg.Header.Get("X-Request-Id"), got)
			}
			if tc.keep != (got == tc.client) {
				t.Fatalf("client %q -> %q", tc.client, got)
			}
			if !tc.keep && len(got) != 36 {
				t.Fatalf("generated id %q is not a UUID", got)
			}
		})
	}
}

func TestUpstreamErrorMapping(t *testing.T) {
	tests := map[string]struct {
		status int
		want   int
	}{
		"prefill 4xx forwarded":       {status: 422, want: 422},
		"prefill 500 is 502":          {status: 500, want: 502},
		"a pool's 503 stays 503":      {status: 503, want: 503},
		"a pool's 429 stays 429":      {status: 429, want: 429},
		"a gateway timeout stays 504": {status: 504, want: 504},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := start(t, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, `{"error":"secret internal detail"}`)
			}, func(c *config.Config) {
				c.Pipeline.Steps = []config.Step{{Type: "prefill"}, {Type: "decode"}}
			})
			resp, b := do(t, "POST", h.url+"/v1/chat/completions", `{"messages":[]}`, nil)
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			decodeError(t, resp, b)
			if bytes.Contains(b, []byte("secret")) {
				t.Fatalf("upstream body echoed: %s", b)
			}
		})
	}
}

func TestReadiness(t *testing.T) {
	h := start(t, jsonAnswer, func(c *config.Config) { c.Pipeline.Steps = nil })
	if resp, _ := do(t, "GET", h.url+"/readyz", "", nil); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("ready without a pipeline: %d", resp.StatusCode)
	}
	if resp, _ := do(t, "GET", h.url+"/healthz", "", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz %d", resp.StatusCode)
	}
	resp, b := do(t, "POST", h.url+"/v1/chat/completions", `{"messages":[]}`, nil)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("request without pipeline: %d %s", resp.StatusCode, b)
	}

	h = start(t, jsonAnswer, nil)
	if resp, b := do(t, "GET", h.url+"/readyz", "", nil); resp.StatusCode != http.StatusOK || string(b) != "ok" {
		t.Fatalf("readyz %d %s", resp.StatusCode, b)
	}
}

// Drain fails readiness at once and keeps serving, every answer closing its connection (the
// kept-alive ones included), while liveness stays up; Shutdown then refuses new connections.
func TestDrain(t *testing.T) {
	h := start(t, jsonAnswer, nil)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	get := func(path string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, h.url+path, nil)
		if strings.HasPrefix(path, "/v1/") {
			req, err = http.NewRequest(http.MethodPost, h.url+path, strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		}
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	if resp, _ := get("/v1/chat/completions"); resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("before the drain: %d, close %v", resp.StatusCode, resp.Close)
	}
	h.srv.Drain()
	if !h.srv.Draining() {
		t.Fatal("Draining() is false after Drain")
	}
	tests := []struct {
		path   string
		status int
		body   string
	}{
		{path: "/readyz", status: http.StatusServiceUnavailable, body: "draining"},
		{path: "/healthz", status: http.StatusOK, body: "ok"},
		{path: "/v1/chat/completions", status: http.StatusOK, body: `{"id":"ok"}`},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			resp, body := get(tc.path)
			if resp.StatusCode != tc.status || body != tc.body {
				t.Fatalf("%d %q, want %d %q", resp.StatusCode, body, tc.status, tc.body)
			}
			if !resp.Close { // Go's client reads Connection: close into Close (and drops the header)
				t.Fatalf("answered without Connection: close while draining (%v)", resp.Header)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("tcp", h.addr); err == nil {
		c.Close()
		t.Fatal("a new connection was accepted after Shutdown")
	}
}

func TestPassthrough(t *testing.T) {
	h := start(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m"}]}`)
	}, nil)
	resp, b := do(t, "GET", h.url+"/v1/models?x=1", "", map[string]string{"EPP-Profile": "prefill", "Authorization": "Bearer k"})
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"id":"m"`) {
		t.Fatalf("passthrough %d %s", resp.StatusCode, b)
	}
	leg, _ := h.up.last(t)
	if leg.Method != http.MethodGet || leg.URL.RequestURI() != "/v1/models?x=1" || leg.Header.Get("EPP-Profile") != "decode" ||
		leg.Header.Get("Authorization") != "Bearer k" || leg.Header.Get("X-Request-Id") != resp.Header.Get("X-Request-Id") {
		t.Fatalf("leg %s %s %v", leg.Method, leg.URL, leg.Header)
	}
	resp, b = do(t, "POST", h.url+"/v1/embeddings", `{"input":"x"}`, map[string]string{"Content-Type": "application/json"})
	_, legBody := h.up.last(t)
	if resp.StatusCode != http.StatusOK || legBody != `{"input":"x"}` {
		t.Fatalf("post passthrough %d %s / %s", resp.StatusCode, b, legBody)
	}
}

func TestPassthroughBodyLimit(t *testing.T) {
	h := start(t, jsonAnswer, func(c *config.Config) { c.Server.MaxRequestBodySize = 1 })
	resp, b := do(t, "POST", h.url+"/v1/embeddings", strings.Repeat("x", 2<<20), nil)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d %s", resp.StatusCode, b)
	}
	decodeError(t, resp, b)
}

func TestStreamOutlivesWriteTimeout(t *testing.T) {
	h := start(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 4; i++ {
			_, _ = io.WriteString(w, "data: {}\n\n")
			w.(http.Flusher).Flush()
			time.Sleep(150 * time.Millisecond)
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}, func(c *config.Config) { c.Server.WriteTimeout = config.Duration(200 * time.Millisecond) })
	resp, b := do(t, "POST", h.url+"/v1/chat/completions", `{"messages":[],"stream":true}`, nil)
	if resp.StatusCode != http.StatusOK || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Fatalf("stream cut: %d %q", resp.StatusCode, b)
	}
}

// A worker's rejection reaches the client with the worker's own message (tools detect "maximum
// context length" errors by it), and nothing else of its body; the whole body is logged.
func TestUpstreamBodiesAreLoggedNotEchoed(t *testing.T) {
	var logs bytes.Buffer
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"message":"prompt too long for model","secret":"`+strings.Repeat("s", 80)+`"}}`)
	})
	cfg := config.Default()
	cfg.Gateway.Address = up.srv.URL
	cfg.Pipeline.Steps = []config.Step{{Type: "prefill"}, {Type: "decode"}}
	p, err := builder.Build(cfg, builder.Options{})
	if err != nil {
		t.Fatal(err)
	}
	holder := &pipeline.Holder{}
	holder.Swap(p)
	srv := server.New(server.Options{Server: cfg.Server, Pipelines: holder, Log: logging.New(logging.Warn, &logs)})
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"messages":[]}`)))
	if rec.Code != 400 || !strings.Contains(rec.Body.String(), `"message":"prompt too long for model (request_id: `) ||
		strings.Contains(rec.Body.String(), "sss") {
		t.Fatalf("client got %d %s", rec.Code, rec.Body)
	}
	line := logs.String()
	if !strings.Contains(line, "prompt too long for model") || strings.Contains(line, strings.Repeat("s", 80)) || !strings.Contains(line, `"upstream_status":400`) {
		t.Fatalf("log line: %s", line)
	}
}

// TestStaleGatewayConnections: pooled connections the gateway closed while idle must not fail the
// next requests.
func TestStaleGatewayConnections(t *testing.T) {
	var idle sync.Map
	gw := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		jsonAnswer(w, r)
	}))
	gw.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateIdle {
			idle.Store(c, true)
		}
	}
	gw.Start()
	defer gw.Close()
	cfg := config.Default()
	cfg.Gateway.Address = gw.URL
	cfg.Pipeline.Steps = []config.Step{{Type: "prefill"}, {Type: "decode"}}
	p, err := builder.Build(cfg, builder.Options{})
	if err != nil {
		t.Fatal(err)
	}
	holder := &pipeline.Holder{}
	holder.Swap(p)
	h := server.New(server.Options{Server: cfg.Server, Pipelines: holder, Log: logr.Discard()}).Handler()
	for i := 0; i < 5; i++ {
		// Close every idle gateway connection behind the coordinator's back.
		idle.Range(func(k, _ any) bool {
			_ = k.(net.Conn).Close()
			idle.Delete(k)
			return true
		})
		time.Sleep(10 * time.Millisecond) // the close reaches the client side
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"messages":[{"role":"user","content":"x"}]}`)))
		if rec.Code != 200 {
			t.Fatalf("request %d over stale connections: %d %s", i, rec.Code, rec.Body)
		}
	}
}

// pipeline.forward_response_headers: the revision a phase's answer carries is sent on every
// later leg; the client's own value never reaches a leg; an empty list disables it.
func TestForwardResponseHeaders(t *testing.T) {
	tests := map[string]struct {
		names      []string // nil: the default
		wantDecode string   // the decode leg's x-llm-d-disagg-revision
	}{
		"default: the prefill's revision follows": {wantDecode: "rev-2"},
		"disabled":       {names: []string{}, wantDecode: "client"},
		"another header": {names: []string{"x-other"}, wantDecode: "client"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := start(t, func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Epp-Profile") == "prefill" {
					w.Header().Set("X-Llm-D-Disagg-Revision", "rev-2")
					w.Header().Set("X-Other", "o-1")
				}
				_, _ = io.WriteString(w, `{}`)
			}, func(c *config.Config) {
				c.Pipeline.Steps = []config.Step{{Type: "prefill"}, {Type: "decode"}}
				if tc.names != nil {
					c.Pipeline.ForwardResponseHeaders = tc.names
				}
			})
			resp, b := do(t, "POST", h.url+"/v1/chat/completions", `{"messages":[]}`,
				map[string]string{"X-Llm-D-Disagg-Revision": "client", "X-Other": "client"})
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("HTTP %d %s", resp.StatusCode, b)
			}
			h.up.mu.Lock()
			legs := append([]*http.Request(nil), h.up.legs...)
			h.up.mu.Unlock()
			if len(legs) != 2 {
				t.Fatalf("%d legs", len(legs))
			}
			prefill, decode := legs[0].Header, legs[1].Header
			forwarded := tc.names == nil || len(tc.names) > 0
			if wantPrefill := map[bool]string{true: "", false: "client"}[forwarded && tc.names == nil]; prefill.Get("X-Llm-D-Disagg-Revision") != wantPrefill {
				t.Errorf("prefill leg revision %q, want %q", prefill.Get("X-Llm-D-Disagg-Revision"), wantPrefill)
			}
			if got := decode.Values("X-Llm-D-Disagg-Revision"); len(got) != 1 || got[0] != tc.wantDecode {
				t.Errorf("decode leg revision %q, want %q", got, tc.wantDecode)
			}
			if len(tc.names) == 1 && decode.Get("X-Other") != "o-1" {
				t.Errorf("decode leg X-Other %q, want the prefill's o-1", decode.Get("X-Other"))
			}
		})
	}
}

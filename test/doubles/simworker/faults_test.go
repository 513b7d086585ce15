package simworker

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// waitCtx bounds a wait on something the test observes.
func waitCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// served waits until the worker has finished n requests and returns them.
func served(t *testing.T, w *Worker, n int) []Request {
	t.Helper()
	reqs, err := w.AwaitRequests(waitCtx(t), func(rs []Request) bool {
		return len(rs) >= n && !slices.ContainsFunc(rs, func(r Request) bool { return r.Status == 0 })
	})
	if err != nil {
		t.Fatalf("%d requests served: %+v", len(reqs), reqs)
	}
	return reqs
}

// arrived waits until the worker has received n requests.
func arrived(t *testing.T, w *Worker, n int) {
	t.Helper()
	if reqs, err := w.AwaitRequests(waitCtx(t), func(rs []Request) bool { return len(rs) >= n }); err != nil {
		t.Fatalf("%d requests arrived", len(reqs))
	}
}

// open sends a POST with ctx and returns the response with its body unread (closed at the end
// of the test).
func open(ctx context.Context, t *testing.T, url string, body any) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(mustJSON(t, body))))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := testClient.Do(req)
	if err == nil {
		t.Cleanup(func() { resp.Body.Close() })
	}
	return resp, err
}

// isReset reports whether err is a TCP reset seen by the peer.
func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

func TestFaultValidate(t *testing.T) {
	tests := []struct {
		name    string
		fault   Fault
		wantErr string
	}{
		{"status", Fault{Kind: FaultStatus, Status: 503, RetryAfter: 2}, ""},
		{"status 200", Fault{Kind: FaultStatus, Status: 200}, ""},
		{"status without status", Fault{Kind: FaultStatus}, "status 0 is not between 200 and 599"},
		{"status 600", Fault{Kind: FaultStatus, Status: 600}, "not between"},
		{"die", Fault{Kind: FaultDieMidStream, AfterTokens: 3, Count: 2}, ""},
		{"hang after", Fault{Kind: FaultHangAfterHeaders}, ""},
		{"reset", Fault{Kind: FaultResetBeforeHeaders}, ""},
		{"hang before", Fault{Kind: FaultHangBeforeHeaders}, ""},
		{"unknown kind", Fault{Kind: "explode"}, `unknown fault kind "explode"`},
		{"no kind", Fault{}, `unknown fault kind ""`},
		{"negative count", Fault{Kind: FaultResetBeforeHeaders, Count: -1}, "must not be negative"},
		{"negative tokens", Fault{Kind: FaultDieMidStream, AfterTokens: -1}, "must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.fault.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate = %v, want %q", err, tt.wantErr)
			}
			if err := New(Config{}).InjectFault(tt.fault); err == nil {
				t.Error("InjectFault accepted it")
			}
		})
	}
}

func TestFaultQueue(t *testing.T) {
	w := startWorker(t, Config{})
	for _, f := range []Fault{{Kind: FaultStatus, Status: 500, Count: 2}, {Kind: FaultStatus, Status: 429, RetryAfter: 7, Body: "slow down"}} {
		if err := w.InjectFault(f); err != nil {
			t.Fatal(err)
		}
	}
	if got := w.Faults(); !slices.Equal(got, []Fault{{Kind: FaultStatus, Status: 500, Count: 2}, {Kind: FaultStatus, Status: 429, Count: 1, RetryAfter: 7, Body: "slow down"}}) {
		t.Fatalf("Faults = %+v", got)
	}
	chat := userChat("hi", obj{"max_tokens": 1})
	steps := []struct {
		method, path string
		status       int
		retryAfter   string
		fault        FaultKind
	}{
		{http.MethodPost, PathChatCompletions, 500, "", FaultStatus},
		{http.MethodGet, PathHealth, 200, "", ""}, // not faultable
		{http.MethodPost, "/nope", 404, "", ""},   // not an inference or render endpoint
		{http.MethodPost, PathChatRender, 500, "", FaultStatus},
		{http.MethodPost, PathCompletions, 429, "7", FaultStatus},
		{http.MethodPost, PathChatCompletions, 200, "", ""},
	}
	for i, s := range steps {
		body := any(nil)
		if s.method == http.MethodPost {
			body = chat
			if s.path == PathCompletions {
				body = completion("hi", obj{"max_tokens": 1})
			}
		}
		r := do(t, s.method, w.URL()+s.path, body, nil)
		if r.status != s.status || r.header.Get("Retry-After") != s.retryAfter {
			t.Errorf("step %d: status %d Retry-After %q, want %d %q", i, r.status, r.header.Get("Retry-After"), s.status, s.retryAfter)
		}
		if got := w.Requests()[i]; got.Fault != s.fault || got.Status != s.status {
			t.Errorf("step %d recorded fault %q status %d", i, got.Fault, got.Status)
		}
	}
	if got := w.Faults(); len(got) != 0 {
		t.Errorf("Faults after use = %+v", got)
	}
	if err := w.InjectFault(Fault{Kind: FaultResetBeforeHeaders, Count: 3}); err != nil {
		t.Fatal(err)
	}
	w.FailNext(1, 503, "")
	if got := w.Faults(); !slices.Equal(got, []Fault{{Kind: FaultStatus, Status: 503, Count: 1}}) {
		t.Errorf("FailNext left %+v", got)
	}
	w.ClearFaults()
	if got := w.Faults(); len(got) != 0 {
		t.Errorf("Faults after ClearFaults = %+v", got)
	}
}

// A fault with Match strikes only requests whose body contains it, and the others neither use
// it up nor reach the faults queued behind it.
func TestFaultMatch(t *testing.T) {
	w := startWorker(t, Config{})
	for _, f := range []Fault{{Kind: FaultStatus, Status: 503, Count: 2, Match: `"input_audio"`}, {Kind: FaultStatus, Status: 500}} {
		if err := w.InjectFault(f); err != nil {
			t.Fatal(err)
		}
	}
	audio := obj{"model": DefaultModelName, "max_tokens": 1, "messages": []obj{{"role": "user", "content": []obj{inputAudioPart([]byte("clip"))}}}}
	text := userChat("no audio here", obj{"max_tokens": 1})
	for i, s := range []struct {
		body   obj
		status int
		fault  FaultKind
	}{
		{text, 200, ""},
		{audio, 503, FaultStatus},
		{text, 200, ""},
		{audio, 503, FaultStatus},
		{text, 500, FaultStatus}, // the next fault matches every request
		{audio, 200, ""},
	} {
		if r := post(t, w, PathChatCompletions, s.body); r.status != s.status {
			t.Errorf("step %d: status %d, want %d: %s", i, r.status, s.status, r.body)
		}
		if got := w.Requests()[i]; got.Fault != s.fault {
			t.Errorf("step %d recorded fault %q, want %q", i, got.Fault, s.fault)
		}
	}
	if got := w.Faults(); len(got) != 0 {
		t.Errorf("Faults after use = %+v", got)
	}
}

func TestFaultsBeforeHeaders(t *testing.T) {
	tests := []struct {
		name  string
		kind  FaultKind
		end   string // how a hang ends: "client" cancels, "close" closes the worker
		reset bool   // the client sees a reset
	}{
		{"reset before headers", FaultResetBeforeHeaders, "", true},
		{"hang until the client leaves", FaultHangBeforeHeaders, "client", false},
		{"hang until the worker closes", FaultHangBeforeHeaders, "close", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := startWorker(t, Config{})
			if err := w.InjectFault(Fault{Kind: tt.kind}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() {
				_, err := open(ctx, t, w.URL()+PathCompletions, completion("a", obj{"max_tokens": 1}))
				errc <- err
			}()
			arrived(t, w, 1)
			switch tt.end {
			case "client":
				cancel()
			case "close":
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
			}
			err := <-errc
			if err == nil || isReset(err) != tt.reset {
				t.Errorf("client error %v, want a reset: %v", err, tt.reset)
			}
			if got := served(t, w, 1)[0]; got.Status != StatusNoAnswer || got.Fault != tt.kind {
				t.Errorf("recorded %+v", got)
			}
			if tt.end != "close" { // the next request is served
				mustStatus(t, post(t, w, PathCompletions, completion("a", obj{"max_tokens": 1})), 200)
			}
		})
	}
}

// readEvents reads SSE lines until n token events (events with choices) are read.
func readEvents(t *testing.T, br *bufio.Reader, n int) {
	t.Helper()
	for got := 0; got < n; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d token events: %v", got, err)
		}
		if strings.HasPrefix(line, "data: {") && !strings.Contains(line, `"choices":[]`) && !strings.Contains(line, `"role":"assistant"`) {
			got++
		}
	}
}

// tokenEvents counts the token events of a (partial) SSE body: data events with a choice,
// other than the chat role event.
func tokenEvents(body string) int {
	n := 0
	for line := range strings.SplitSeq(body, "\n") {
		if strings.HasPrefix(line, "data: {") && !strings.Contains(line, `"choices":[]`) && !strings.Contains(line, `"role":"assistant"`) {
			n++
		}
	}
	return n
}

func TestFaultDieMidStream(t *testing.T) {
	tests := []struct {
		name        string
		path        string
		body        obj
		afterTokens int
		wantEvents  int
	}{
		{"right after the headers", PathCompletions, completion("a b", obj{"max_tokens": 4, "stream": true}), 0, 0},
		{"after one token", PathCompletions, completion("a b", obj{"max_tokens": 4, "stream": true}), 1, 1},
		{"after three tokens", PathCompletions, completion("a b", obj{"max_tokens": 4, "stream": true}), 3, 3},
		{"before [DONE]", PathCompletions, completion("a b", obj{"max_tokens": 4, "stream": true}), 9, 4},
		{"chat after two tokens", PathChatCompletions, userChat("a b", obj{"max_tokens": 4, "stream": true}), 2, 2},
		{"generate after two tokens", PathGenerate, generate([]int{1, 7, 8}, obj{"max_tokens": 4}, obj{"stream": true}), 2, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := startWorker(t, Config{})
			if err := w.InjectFault(Fault{Kind: FaultDieMidStream, AfterTokens: tt.afterTokens}); err != nil {
				t.Fatal(err)
			}
			resp, err := open(context.Background(), t, w.URL()+tt.path, tt.body)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || !isReset(err) {
				t.Fatalf("status %d, read error %v: want 200 and a reset", resp.StatusCode, err)
			}
			if n := tokenEvents(string(body)); n != tt.wantEvents || strings.Contains(string(body), "[DONE]") {
				t.Errorf("%d token events, want %d: %q", n, tt.wantEvents, body)
			}
			if got := served(t, w, 1)[0]; got.Status != 200 || got.Fault != FaultDieMidStream {
				t.Errorf("recorded %+v", got)
			}
			mustStatus(t, post(t, w, tt.path, tt.body), 200) // the fault is used up
		})
	}
}

func TestFaultNonStreamed(t *testing.T) {
	tests := []struct {
		name string
		kind FaultKind
		path string
		body obj
	}{
		{"die in a completion", FaultDieMidStream, PathCompletions, completion("a b c", obj{"max_tokens": 8})},
		{"die in a render", FaultDieMidStream, PathChatRender, userChat("a b c", nil)},
		{"die in an error answer", FaultDieMidStream, PathCompletions, completion("a", obj{"model": "other"})},
		{"hang after the headers", FaultHangAfterHeaders, PathChatCompletions, userChat("a b c", obj{"max_tokens": 8})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := startWorker(t, Config{})
			full := post(t, w, tt.path, tt.body)
			w.ClearCache() // the faulted answer is the first one's, not a prefix-cache hit's (cached_tokens)
			if err := w.InjectFault(Fault{Kind: tt.kind}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp, err := open(ctx, t, w.URL()+tt.path, tt.body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != full.status || resp.ContentLength != int64(len(full.body)) || resp.Header.Get("Content-Type") != full.header.Get("Content-Type") {
				t.Fatalf("headers %d %d %q, want those of %d %d %q", resp.StatusCode, resp.ContentLength, resp.Header.Get("Content-Type"),
					full.status, len(full.body), full.header.Get("Content-Type"))
			}
			if tt.kind == FaultHangAfterHeaders {
				cancel() // nothing follows the headers until the client leaves
			}
			body, err := io.ReadAll(resp.Body)
			want := len(full.body) / 2
			if tt.kind == FaultHangAfterHeaders {
				want = 0
			}
			// (The answers differ in their ids, not in their length.)
			if err == nil || len(body) != want || (want > 0 && body[0] != '{') {
				t.Errorf("read %q, %v: want the first %d bytes, then an error", body, err, want)
			}
			if got := served(t, w, 2)[1]; got.Status != full.status || got.Fault != tt.kind {
				t.Errorf("recorded %+v", got)
			}
		})
	}
}

func TestFaultHangAfterHeadersStream(t *testing.T) {
	tests := []struct {
		name        string
		afterTokens int
		end         string // "client" cancels, "close" closes the worker
	}{
		{"headers only, client leaves", 0, "client"},
		{"two tokens, client leaves", 2, "client"},
		{"every token, worker closes", 5, "close"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := startWorker(t, Config{})
			if err := w.InjectFault(Fault{Kind: FaultHangAfterHeaders, AfterTokens: tt.afterTokens}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp, err := open(ctx, t, w.URL()+PathChatCompletions, userChat("a b", obj{"max_tokens": 3, "stream": true}))
			if err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(resp.Body)
			readEvents(t, br, min(tt.afterTokens, 3))
			if got := w.Requests()[0]; got.Status != 0 {
				t.Fatalf("the hung request ended: %+v", got)
			}
			switch tt.end {
			case "client":
				cancel()
			case "close":
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
			}
			rest, err := io.ReadAll(br)
			if err == nil || tokenEvents(string(rest)) != 0 || strings.Contains(string(rest), "[DONE]") {
				t.Errorf("after the hang: %q, %v", rest, err)
			}
			if tt.end == "close" && !isReset(err) {
				t.Errorf("closing worker: client error %v, want a reset", err)
			}
			if got := served(t, w, 1)[0]; got.Status != 200 || got.Fault != FaultHangAfterHeaders {
				t.Errorf("recorded %+v", got)
			}
		})
	}
}

func TestKill(t *testing.T) {
	w, err := Start(Config{ITL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := open(context.Background(), t, w.URL()+PathCompletions, completion("a b", obj{"max_tokens": 3, "stream": true}))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	readEvents(t, br, 1)
	w.Kill()
	// Kill returns once nothing is served any more.
	if got := w.Requests()[0]; got.Status != 200 {
		t.Errorf("recorded %+v after Kill", got)
	}
	if _, err := io.ReadAll(br); !isReset(err) {
		t.Errorf("stream read error %v, want a reset", err)
	}
	addr := strings.TrimPrefix(w.URL(), "http://")
	if _, err := net.Dial("tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial after Kill: %v, want connection refused", err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("Close after Kill: %v", err)
	}
	w.Kill() // again: nothing happens

	// A worker started on the same address takes its place, empty.
	again := startWorker(t, Config{Addr: addr})
	if again.URL() != w.URL() || again.CacheLen() != 0 {
		t.Fatalf("restarted at %s with %d cached prompts", again.URL(), again.CacheLen())
	}
	mustStatus(t, post(t, again, PathCompletions, completion("a", obj{"max_tokens": 1})), 200)
}

func TestFaultControl(t *testing.T) {
	w := startWorker(t, Config{FaultControl: true})
	type faults struct {
		Faults []Fault `json:"faults"`
	}
	steps := []struct {
		name   string
		method string
		body   string
		status int
		want   []Fault
		errMsg string
	}{
		{"list empty", http.MethodGet, "", 200, []Fault{}, ""},
		{"queue a status", http.MethodPost, `{"kind":"status","status":503,"retry_after":2,"count":2}`, 200,
			[]Fault{{Kind: FaultStatus, Status: 503, RetryAfter: 2, Count: 2}}, ""},
		{"queue a death", http.MethodPost, `{"kind":"die-mid-stream","after_tokens":3}`, 200,
			[]Fault{{Kind: FaultStatus, Status: 503, RetryAfter: 2, Count: 2}, {Kind: FaultDieMidStream, AfterTokens: 3, Count: 1}}, ""},
		{"unknown kind", http.MethodPost, `{"kind":"explode"}`, 400, nil, `unknown fault kind "explode"`},
		{"unknown field", http.MethodPost, `{"kind":"status","status":500,"afterTokens":1}`, 400, nil, `unknown field "afterTokens"`},
		{"not JSON", http.MethodPost, `kind=status`, 400, nil, "invalid fault"},
		{"wrong method", http.MethodPut, "", 405, nil, "method not allowed"},
		{"list", http.MethodGet, "", 200,
			[]Fault{{Kind: FaultStatus, Status: 503, RetryAfter: 2, Count: 2}, {Kind: FaultDieMidStream, AfterTokens: 3, Count: 1}}, ""},
		{"clear", http.MethodDelete, "", 200, []Fault{}, ""},
		{"queue again", http.MethodPost, `{"kind":"status","status":503,"retry_after":2}`, 200,
			[]Fault{{Kind: FaultStatus, Status: 503, RetryAfter: 2, Count: 1}}, ""},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			var body any
			if s.body != "" {
				body = s.body
			}
			r := do(t, s.method, w.URL()+PathFaults, body, nil)
			mustStatus(t, r, s.status)
			if s.errMsg != "" {
				if !strings.Contains(errorMessage(t, r), s.errMsg) {
					t.Errorf("message %q, want %q", errorMessage(t, r), s.errMsg)
				}
				return
			}
			if got := decode[faults](t, r.body).Faults; !slices.Equal(got, s.want) {
				t.Errorf("faults %+v, want %+v", got, s.want)
			}
		})
	}
	// The queued fault applies; the control requests are not recorded.
	r := post(t, w, PathChatCompletions, userChat("a", obj{"max_tokens": 1}))
	if r.status != 503 || r.header.Get("Retry-After") != "2" || !strings.Contains(errorMessage(t, r), "injected failure (503)") {
		t.Errorf("answer %d %q %s", r.status, r.header.Get("Retry-After"), r.body)
	}
	if reqs := w.Requests(); len(reqs) != 1 || reqs[0].Fault != FaultStatus {
		t.Errorf("recorded %+v", reqs)
	}
}

func TestFaultControlDisabled(t *testing.T) {
	w := startWorker(t, Config{})
	w.FailNext(1, 500, "")
	r := do(t, http.MethodPost, w.URL()+PathFaults, `{"kind":"status","status":503}`, nil)
	mustStatus(t, r, 404)
	if got := w.Faults(); len(got) != 1 || got[0].Status != 500 {
		t.Errorf("Faults = %+v", got)
	}
	if reqs := w.Requests(); len(reqs) != 1 || reqs[0].Path != PathFaults || reqs[0].Fault != "" {
		t.Errorf("recorded %+v", reqs)
	}
}

// streamEvent is the part of a streamed event of any format TestStreamTokenEvents reads.
type streamEvent struct {
	Choices []struct {
		Text     *string `json:"text"`      // completions
		TokenIDs []int   `json:"token_ids"` // generate
		Delta    struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"` // chat
	} `json:"choices"`
	Usage *Usage `json:"usage"`
}

func TestStreamTokenEvents(t *testing.T) {
	w := startWorker(t, Config{})
	usage := obj{"include_usage": true}
	tests := []struct {
		name string
		path string
		body obj
	}{
		{"chat", PathChatCompletions, userChat("one two three", obj{"max_tokens": 5, "stream": true, "stream_options": usage})},
		{"completions", PathCompletions, completion("one two three", obj{"max_tokens": 5, "stream": true, "stream_options": usage})},
		{"generate", PathGenerate, generate([]int{1, 7, 8, 9}, obj{"max_tokens": 5}, obj{"stream": true, "stream_options": usage})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := open(context.Background(), t, w.URL()+tt.path, tt.body)
			if err != nil {
				t.Fatal(err)
			}
			tokens := 0
			for _, ev := range sseEvents(t, resp.Body) {
				if ev == "[DONE]" {
					continue
				}
				e := decode[streamEvent](t, []byte(ev))
				if len(e.Choices) == 0 { // the usage event
					if e.Usage == nil || e.Usage.CompletionTokens != tokens {
						t.Errorf("usage %+v after %d token events", e.Usage, tokens)
					}
					continue
				}
				c := e.Choices[0]
				switch {
				case c.Delta.Role == "assistant": // the chat role event carries no token
					if c.Delta.Content == nil || *c.Delta.Content != "" {
						t.Errorf("role event %s", ev)
					}
					continue
				case c.Text != nil && len(strings.Fields(*c.Text)) != 1,
					c.Delta.Content != nil && len(strings.Fields(*c.Delta.Content)) != 1,
					c.Text == nil && c.Delta.Content == nil && len(c.TokenIDs) != 1:
					t.Errorf("event %s does not carry exactly one token", ev)
				}
				tokens++
			}
			if tokens != 5 {
				t.Errorf("%d token events, want max_tokens 5", tokens)
			}
		})
	}
}

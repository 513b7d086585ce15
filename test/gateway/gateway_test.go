package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/epd-dev/coordinator/test/internal/loopback"
	"github.com/epd-dev/coordinator/test/simworker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testClient never keeps idle connections, so nothing outlives a test.
var testClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// echoed is what an echo backend answers.
type echoed struct {
	Name   string
	Method string
	Path   string
	Query  string
	Header http.Header
	Body   string
}

// echoBackend starts a backend that answers the request it received.
func echoBackend(t *testing.T, name string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rw.Header().Set("Content-Type", "application/json")
		rw.Header().Set("X-Backend", name)
		_ = json.NewEncoder(rw).Encode(echoed{name, r.Method, r.URL.Path, r.URL.RawQuery, r.Header, string(b)})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// startGateway starts a gateway closed at the end of the test.
func startGateway(t *testing.T, pools map[string][]string) *Gateway {
	t.Helper()
	g, err := Start(Config{Pools: pools})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	return g
}

// send issues one request through the gateway.
func send(t *testing.T, g *Gateway, method, path, body string, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, g.URL()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	return loopback.Fetch(t, testClient, req)
}

func TestRouting(t *testing.T) {
	enc, pre1, pre2 := echoBackend(t, "enc"), echoBackend(t, "pre1"), echoBackend(t, "pre2")
	g := startGateway(t, map[string][]string{"encode": {enc.URL}, "Prefill": {pre1.URL, pre2.URL}})
	tests := []struct {
		name   string
		header []string
		want   string
	}{
		{"epp-profile", []string{"EPP-Profile", "encode"}, "enc"},
		{"lower-case header name", []string{"epp-profile", "encode"}, "enc"},
		{"llm-d header", []string{"x-llm-d-epp-profile", "encode"}, "enc"},
		{"case-insensitive value", []string{"EPP-Profile", "PREFILL"}, "pre1"},
		{"round robin", []string{"EPP-Profile", "prefill"}, "pre2"},
		{"round robin wraps", []string{"EPP-Profile", "prefill"}, "pre1"},
		{"EPP-Profile wins", []string{"EPP-Profile", "encode", "x-llm-d-epp-profile", "prefill"}, "enc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := send(t, g, http.MethodPost, "/v1/chat/completions?a=1&b=two", `{"x":1}`,
				append([]string{"X-Request-Id", "r-1", "Authorization", "Bearer k", "Prefer", "if-available"}, tt.header...)...)
			if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Backend") != tt.want {
				t.Fatalf("status %d backend %q, want %q: %s", resp.StatusCode, resp.Header.Get("X-Backend"), tt.want, b)
			}
			var e echoed
			if err := json.Unmarshal(b, &e); err != nil {
				t.Fatal(err)
			}
			if e.Method != http.MethodPost || e.Path != "/v1/chat/completions" || e.Query != "a=1&b=two" || e.Body != `{"x":1}` ||
				e.Header.Get("Authorization") != "Bearer k" || e.Header.Get("Prefer") != "if-available" ||
				e.Header.Get("X-Request-Id") != "r-1" || e.Header.Get(DestinationHeader) == "" {
				t.Errorf("backend saw %+v", e)
			}
		})
	}
	legs := g.Legs()
	if len(legs) != len(tests) {
		t.Fatalf("%d legs, want %d", len(legs), len(tests))
	}
	l := legs[1]
	if l.Profile != "encode" || l.Backend != enc.URL || l.Method != http.MethodPost || l.Path != "/v1/chat/completions" ||
		l.RequestID != "r-1" || l.Status != 200 || l.Start.IsZero() || l.Duration <= 0 {
		t.Errorf("leg = %+v", l)
	}
	g.Reset()
	if len(g.Legs()) != 0 {
		t.Error("Reset kept legs")
	}
}

func TestNoPool(t *testing.T) {
	b := echoBackend(t, "b")
	g := startGateway(t, map[string][]string{"decode": {b.URL}})
	tests := []struct {
		name    string
		header  []string
		profile string
	}{
		{"missing header", nil, ""},
		{"unknown profile", []string{"EPP-Profile", "x"}, "x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := send(t, g, http.MethodPost, "/v1/completions", "{}", tt.header...)
			want := fmt.Sprintf(`{"error":{"message":"no InferencePool for profile \"%s\"","type":"service_unavailable","code":503}}`, tt.profile)
			if resp.StatusCode != http.StatusServiceUnavailable || string(body) != want || resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("status %d body %s, want 503 %s", resp.StatusCode, body, want)
			}
		})
	}
	if legs := g.Legs(); len(legs) != 2 || legs[1].Status != 503 || legs[1].Backend != "" || legs[1].Profile != "x" {
		t.Errorf("legs = %+v", legs)
	}
}

func TestSetPool(t *testing.T) {
	a, b := echoBackend(t, "a"), echoBackend(t, "b")
	g := startGateway(t, nil)
	if resp, _ := send(t, g, "GET", "/", "", "EPP-Profile", "decode"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d before SetPool", resp.StatusCode)
	}
	if err := g.SetPool("decode", []string{a.URL}); err != nil {
		t.Fatal(err)
	}
	if resp, _ := send(t, g, "GET", "/", "", "EPP-Profile", "decode"); resp.Header.Get("X-Backend") != "a" {
		t.Fatal("not routed to a")
	}
	if err := g.SetPool("DECODE", []string{b.URL}); err != nil {
		t.Fatal(err)
	}
	if resp, _ := send(t, g, "GET", "/", "", "EPP-Profile", "decode"); resp.Header.Get("X-Backend") != "b" {
		t.Fatal("not routed to b after replacement")
	}
	if got := g.Pools(); len(got) != 1 || got["decode"][0] != b.URL {
		t.Errorf("Pools = %v", got)
	}
	if err := g.SetPool("decode", nil); err != nil {
		t.Fatal(err)
	}
	if resp, _ := send(t, g, "GET", "/", "", "EPP-Profile", "decode"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d after removal", resp.StatusCode)
	}
	for _, bad := range []string{"not a url", "ftp://x", "http://", "://x"} {
		if err := g.SetPool("p", []string{bad}); err == nil {
			t.Errorf("SetPool accepted %q", bad)
		}
	}
	if _, err := New(Config{Pools: map[string][]string{"p": {"127.0.0.1:80"}}}); err == nil {
		t.Error("New accepted a URL without scheme")
	}
}

func TestBackendDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	g := startGateway(t, map[string][]string{"prefill": {dead}})
	resp, body := send(t, g, "POST", "/v1/completions", "{}", "EPP-Profile", "prefill")
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), `"type":"bad_gateway"`) {
		t.Errorf("status %d body %s", resp.StatusCode, body)
	}
	if l := g.Legs()[0]; l.Status != 502 || l.Backend != dead {
		t.Errorf("leg %+v", l)
	}
}

func TestStreamsUnbuffered(t *testing.T) {
	release := make(chan struct{})
	backend := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(rw, "data: one\n\n")
		rw.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(rw, "data: two\n\ndata: [DONE]\n\n")
	}))
	defer backend.Close()
	g := startGateway(t, map[string][]string{"decode": {backend.URL}})
	req, _ := http.NewRequest(http.MethodPost, g.URL()+"/v1/chat/completions", strings.NewReader("{}"))
	req.Header.Set("EPP-Profile", "decode")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first := make(chan string, 1)
	go func() {
		line, _ := br.ReadString('\n')
		first <- line
	}()
	select {
	case line := <-first:
		if line != "data: one\n" {
			t.Fatalf("first line %q", line)
		}
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("first event was buffered by the gateway")
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if string(rest) != "\ndata: two\n\ndata: [DONE]\n\n" {
		t.Errorf("rest %q", rest)
	}
}

func TestClientDisconnectCancelsBackend(t *testing.T) {
	cancelled := make(chan struct{})
	backend := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.WriteHeader(http.StatusOK)
		rw.(http.Flusher).Flush()
		<-r.Context().Done()
		close(cancelled)
	}))
	defer backend.Close()
	g := startGateway(t, map[string][]string{"decode": {backend.URL}})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.URL()+"/x", strings.NewReader("{}"))
	req.Header.Set("EPP-Profile", "decode")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("backend request not cancelled")
	}
}

func TestPrefillDecodeThroughGateway(t *testing.T) {
	p, err := simworker.Start(simworker.Config{Role: simworker.RolePrefill})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	d, err := simworker.Start(simworker.Config{Role: simworker.RoleDecode})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	g := startGateway(t, map[string][]string{"prefill": {p.URL()}, "decode": {d.URL()}})

	_, body := send(t, g, "POST", simworker.PathCompletions,
		`{"prompt":"hello gateway","max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`, "EPP-Profile", "prefill")
	var pr struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(body, &pr); err != nil || len(pr.KV) == 0 {
		t.Fatalf("prefill answer %s", body)
	}
	resp, body := send(t, g, "POST", simworker.PathCompletions,
		`{"prompt":"hello gateway","max_tokens":3,"stream":true,"kv_transfer_params":`+string(pr.KV)+`}`, "EPP-Profile", "decode")
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"text":" gateway"`) || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("decode status %d body %s", resp.StatusCode, body)
	}
	legs := g.Legs()
	if len(legs) != 2 || legs[0].Profile != "prefill" || legs[1].Profile != "decode" || legs[1].Backend != d.URL() {
		t.Errorf("legs %+v", legs)
	}
	if n := len(d.Requests()); n != 1 {
		t.Errorf("decode worker saw %d requests", n)
	}
}

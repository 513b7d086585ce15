package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/internal/loopback"
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

// settled returns g's legs once none is in flight: the client has read its answer a moment
// before the gateway records how the leg ended.
func settled(t *testing.T, g *Gateway) []Leg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	legs := g.Settled(ctx)
	if ctx.Err() != nil {
		t.Fatalf("legs still in flight: %+v", legs)
	}
	return legs
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
	legs := settled(t, g)
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
	if legs := settled(t, g); len(legs) != 2 || legs[1].Status != 503 || legs[1].Backend != "" || legs[1].Profile != "x" {
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
	legs := settled(t, g)
	if len(legs) != 2 || legs[0].Profile != "prefill" || legs[1].Profile != "decode" || legs[1].Backend != d.URL() {
		t.Errorf("legs %+v", legs)
	}
	if n := len(d.Requests()); n != 1 {
		t.Errorf("decode worker saw %d requests", n)
	}
}

// startGatewayWith starts a gateway on cfg closed at the end of the test.
func startGatewayWith(t *testing.T, cfg Config) *Gateway {
	t.Helper()
	g, err := Start(cfg)
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

// oneShotBackend starts an echo backend that closes every connection after one answer, so
// that the gateway keeps no idle connection to it: once closed, it refuses dials.
func oneShotBackend(t *testing.T, name string) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rw.Header().Set("X-Backend", name)
		_ = json.NewEncoder(rw).Encode(echoed{name, r.Method, r.URL.Path, r.URL.RawQuery, r.Header, string(b)})
	}))
	srv.Config.SetKeepAlivesEnabled(false)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// deadURL returns the URL of a port nothing listens on (dials are refused).
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + ln.Addr().String()
	ln.Close()
	return u
}

// wantPlain fails the test unless the answer is status with Envoy's text/plain body.
func wantPlain(t *testing.T, resp *http.Response, body []byte, status int, text string) {
	t.Helper()
	if resp.StatusCode != status || resp.Header.Get("Content-Type") != "text/plain" || string(body) != text {
		t.Errorf("answer %d %q %q, want %d text/plain %q", resp.StatusCode, resp.Header.Get("Content-Type"), body, status, text)
	}
}

// startWorker starts a simworker closed at the end of the test.
func startWorker(t *testing.T, cfg simworker.Config) *simworker.Worker {
	t.Helper()
	w, err := simworker.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return w
}

func TestRoundRobinThree(t *testing.T) {
	a, b, c := echoBackend(t, "a"), echoBackend(t, "b"), echoBackend(t, "c")
	g := startGateway(t, map[string][]string{"decode": {a.URL, b.URL, c.URL}})
	var got []string
	for range 7 {
		resp, _ := send(t, g, http.MethodPost, "/v1/completions", "{}", "EPP-Profile", "decode")
		got = append(got, resp.Header.Get("X-Backend"))
	}
	if want := []string{"a", "b", "c", "a", "b", "c", "a"}; !slices.Equal(got, want) {
		t.Errorf("backends %v, want %v", got, want)
	}
	if picks := g.Picks("DECODE"); !maps.Equal(picks, map[string]int{a.URL: 3, b.URL: 2, c.URL: 2}) {
		t.Errorf("Picks = %v", picks)
	}
}

func TestEjection(t *testing.T) {
	a, b, c := oneShotBackend(t, "a"), oneShotBackend(t, "b"), oneShotBackend(t, "c")
	g := startGatewayWith(t, Config{Pools: map[string][]string{"prefill": {a.URL, b.URL, c.URL}}})
	var clock atomic.Int64 // the gateway's time, in Unix nanoseconds
	clock.Store(time.Now().UnixNano())
	g.now = func() time.Time { return time.Unix(0, clock.Load()) }
	post := func() (*http.Response, []byte) {
		return send(t, g, http.MethodPost, "/v1/completions", "{}", "EPP-Profile", "prefill")
	}
	for range 3 {
		if resp, body := post(); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d %s", resp.StatusCode, body)
		}
	}
	b.Close() // killed: its port refuses connections
	// The next pick is a, then b fails and is ejected.
	if resp, _ := post(); resp.Header.Get("X-Backend") != "a" {
		t.Fatalf("4th leg went to %q", resp.Header.Get("X-Backend"))
	}
	resp, body := post()
	wantPlain(t, resp, body, http.StatusServiceUnavailable, BodyConnectFailure)
	legs := settled(t, g)
	if l := legs[len(legs)-1]; l.Backend != b.URL || l.Status != 503 || l.Failure != FailureConnect || !l.Ejected || l.Aborted {
		t.Errorf("failed leg %+v", l)
	}
	if ej := g.Ejected(); !maps.EqualFunc(ej, map[string][]string{"prefill": {b.URL}}, slices.Equal) {
		t.Errorf("Ejected = %v", ej)
	}
	// The living backends take every leg, in turn.
	g.Reset()
	for range 4 {
		if resp, body := post(); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d %s after the ejection", resp.StatusCode, body)
		}
	}
	if picks := g.Picks("prefill"); !maps.Equal(picks, map[string]int{a.URL: 2, c.URL: 2}) {
		t.Errorf("Picks after the ejection = %v", picks)
	}
	// The ejection ends after EjectFor.
	clock.Add(int64(DefaultEjectFor - time.Nanosecond))
	if len(g.Ejected()) != 1 {
		t.Error("ejection ended early")
	}
	clock.Add(1)
	if ej := g.Ejected(); len(ej) != 0 {
		t.Errorf("Ejected after EjectFor = %v", ej)
	}
}

func TestEjectionSettings(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		// want is, per request to a pool of two dead backends, the body and whether the leg ejected.
		want    []Failure
		ejected []bool
	}{
		{"default ejects at once, but at most one of two", Config{},
			[]Failure{FailureConnect, FailureConnect, FailureConnect, FailureConnect}, []bool{true, false, false, false}},
		{"all ejected: no healthy upstream", Config{MaxEjectionPercent: 100},
			[]Failure{FailureConnect, FailureConnect, FailureNoHealthy, FailureNoHealthy}, []bool{true, true, false, false}},
		{"eject after two failures", Config{EjectAfter: 2, MaxEjectionPercent: 100},
			[]Failure{FailureConnect, FailureConnect, FailureConnect, FailureConnect, FailureNoHealthy}, []bool{false, false, true, true, false}},
		{"ejection disabled", Config{EjectFor: -1},
			[]Failure{FailureConnect, FailureConnect, FailureConnect}, []bool{false, false, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Pools = map[string][]string{"decode": {deadURL(t), deadURL(t)}}
			g := startGatewayWith(t, tt.cfg)
			for i, want := range tt.want {
				resp, body := send(t, g, http.MethodPost, "/v1/chat/completions", "{}", "EPP-Profile", "decode")
				text := BodyConnectFailure
				if want == FailureNoHealthy {
					text = BodyNoHealthyUpstream
				}
				wantPlain(t, resp, body, http.StatusServiceUnavailable, text)
				l := settled(t, g)[i]
				if l.Failure != want || l.Ejected != tt.ejected[i] || l.Status != 503 || (l.Backend == "") != (want == FailureNoHealthy) {
					t.Errorf("leg %d = %+v, want failure %q ejected %v", i, l, want, tt.ejected[i])
				}
			}
			g.ClearEjections()
			if ej := g.Ejected(); len(ej) != 0 {
				t.Errorf("Ejected after ClearEjections = %v", ej)
			}
		})
	}
}

// resetBeforeHeaders starts a backend that reads the request, then closes the connection with
// a reset (linger) or a plain FIN, without answering.
func resetBeforeHeaders(t *testing.T, reset bool) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		conn, _, err := http.NewResponseController(rw).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		if tc, ok := conn.(*net.TCPConn); ok && reset {
			_ = tc.SetLinger(0)
		}
		conn.Close()
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestUpstreamFailuresBeforeHeaders(t *testing.T) {
	faulty := startWorker(t, simworker.Config{Role: simworker.RoleDecode})
	tests := []struct {
		name    string
		backend func(t *testing.T) string
		want    Failure
		body    string
	}{
		{"dial refused", deadURL, FailureConnect, BodyConnectFailure},
		{"reset before headers", func(t *testing.T) string { return resetBeforeHeaders(t, true) }, FailureTermination, BodyConnectTermination},
		{"EOF before headers", func(t *testing.T) string { return resetBeforeHeaders(t, false) }, FailureTermination, BodyConnectTermination},
		{"simworker reset fault", func(t *testing.T) string {
			if err := faulty.InjectFault(simworker.Fault{Kind: simworker.FaultResetBeforeHeaders}); err != nil {
				t.Fatal(err)
			}
			return faulty.URL()
		}, FailureTermination, BodyConnectTermination},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := tt.backend(t)
			g := startGatewayWith(t, Config{Pools: map[string][]string{"decode": {u}}})
			resp, body := send(t, g, http.MethodPost, simworker.PathCompletions, `{"prompt":"a","max_tokens":1}`, "EPP-Profile", "decode")
			wantPlain(t, resp, body, http.StatusServiceUnavailable, tt.body)
			if l := settled(t, g)[0]; l.Backend != u || l.Status != 503 || l.Failure != tt.want || !l.Ejected || l.Aborted {
				t.Errorf("leg %+v", l)
			}
		})
	}
}

func TestBackendDiesMidStream(t *testing.T) {
	dying, healthy := startWorker(t, simworker.Config{Name: "dying"}), startWorker(t, simworker.Config{Name: "healthy"})
	if err := dying.InjectFault(simworker.Fault{Kind: simworker.FaultDieMidStream, AfterTokens: 2}); err != nil {
		t.Fatal(err)
	}
	g := startGatewayWith(t, Config{Pools: map[string][]string{"decode": {dying.URL(), healthy.URL()}}})
	req, err := http.NewRequest(http.MethodPost, g.URL()+simworker.PathCompletions,
		strings.NewReader(`{"prompt":"a b c d","max_tokens":4,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("EPP-Profile", "decode")
	req.Header.Set("X-Request-Id", "dies")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || err == nil || strings.Count(string(body), "data: {") != 2 || strings.Contains(string(body), "[DONE]") {
		t.Fatalf("status %d, read error %v, body %q: want 200 and two events cut off", resp.StatusCode, err, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	legs := g.SettledLegs(ctx, "dies")
	if len(legs) != 1 || legs[0].Status != 200 || legs[0].Failure != FailureTermination || !legs[0].Ejected || legs[0].Aborted {
		t.Fatalf("legs %+v", legs)
	}
	// Every later leg goes to the healthy worker.
	for range 3 {
		resp, body := send(t, g, http.MethodPost, simworker.PathCompletions, `{"prompt":"a","max_tokens":1}`, "EPP-Profile", "decode")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d %s", resp.StatusCode, body)
		}
	}
	if picks := g.Picks("decode"); !maps.Equal(picks, map[string]int{dying.URL(): 1, healthy.URL(): 3}) {
		t.Errorf("Picks = %v", picks)
	}
	if reqs := dying.Requests(); len(reqs) != 1 || reqs[0].Fault != simworker.FaultDieMidStream {
		t.Errorf("dying worker saw %+v", reqs)
	}
}

func TestRouteTimeout(t *testing.T) {
	release, entered, cancelled := make(chan struct{}), make(chan struct{}, 1), make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // net/http watches for the peer closing once the body is read
		entered <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
			close(cancelled)
		}
	}))
	t.Cleanup(hang.Close)
	t.Cleanup(func() { close(release) })
	const timeout = 200 * time.Millisecond
	g := startGatewayWith(t, Config{Pools: map[string][]string{"decode": {hang.URL}}, RouteTimeout: timeout})
	start := time.Now()
	resp, body := send(t, g, http.MethodPost, "/v1/chat/completions", "{}", "EPP-Profile", "decode")
	took := time.Since(start)
	wantPlain(t, resp, body, http.StatusGatewayTimeout, BodyRouteTimeout)
	if took < timeout || took > 5*time.Second {
		t.Errorf("answered after %v, want about %v", took, timeout)
	}
	select {
	case <-entered:
	default:
		t.Error("the backend never got the request")
	}
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream request was not cancelled")
	}
	if l := settled(t, g)[0]; l.Status != 504 || l.Failure != FailureTimeout || !l.Ejected || l.Backend != hang.URL {
		t.Errorf("leg %+v", l)
	}
}

func TestShedding(t *testing.T) {
	tests := []struct {
		name       string
		retryAfter time.Duration
		want       string
	}{
		{"default Retry-After", 0, "1"},
		{"rounded up to seconds", 2500 * time.Millisecond, "3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			release, entered := make(chan struct{}), make(chan struct{}, 1)
			slow := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
				entered <- struct{}{}
				select {
				case <-release:
				case <-r.Context().Done():
				}
			}))
			t.Cleanup(slow.Close)
			g := startGatewayWith(t, Config{Pools: map[string][]string{"prefill": {slow.URL}}, MaxInFlight: 1, RetryAfter: tt.retryAfter})
			first := make(chan int, 1)
			go func() {
				req, _ := http.NewRequest(http.MethodPost, g.URL()+"/v1/completions", strings.NewReader("{}"))
				req.Header.Set("EPP-Profile", "prefill")
				req.Header.Set("X-Request-Id", "first")
				resp, err := testClient.Do(req)
				if err != nil {
					first <- 0
					return
				}
				resp.Body.Close()
				first <- resp.StatusCode
			}()
			<-entered
			resp, body := send(t, g, http.MethodPost, "/v1/completions", "{}", "EPP-Profile", "prefill", "X-Request-Id", "shed")
			want := `{"error":{"message":"` + ShedMessage + `","type":"InferencePoolResourceExhausted","code":429}}`
			if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != tt.want ||
				resp.Header.Get("Content-Type") != "application/json" || string(body) != want {
				t.Errorf("shed answer %d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if legs := g.SettledLegs(ctx, "shed"); len(legs) != 1 || legs[0].Status != 429 || legs[0].Failure != FailureShed || legs[0].Backend != "" {
				t.Errorf("shed legs %+v", legs)
			}
			close(release)
			if status := <-first; status != http.StatusOK {
				t.Fatalf("first request: status %d", status)
			}
			if legs := g.SettledLegs(ctx, "first"); len(legs) != 1 || legs[0].Status != 200 {
				t.Fatalf("first legs %+v", legs)
			}
			// The slot is free again.
			if resp, _ := send(t, g, http.MethodPost, "/v1/completions", "{}", "EPP-Profile", "prefill"); resp.StatusCode != http.StatusOK {
				t.Errorf("status %d once the first request ended", resp.StatusCode)
			}
		})
	}
}

func TestMaxRequestBodyBytes(t *testing.T) {
	b := echoBackend(t, "b")
	g := startGatewayWith(t, Config{Pools: map[string][]string{"decode": {b.URL}}, MaxRequestBodyBytes: 8})
	tests := []struct {
		name    string
		body    io.Reader
		tooLong bool
	}{
		{"at the limit", strings.NewReader("12345678"), false},
		{"over the limit", strings.NewReader("123456789"), true},
		{"chunked at the limit", io.MultiReader(strings.NewReader("1234"), strings.NewReader("5678")), false},
		{"chunked over the limit", io.MultiReader(strings.NewReader("12345"), strings.NewReader("6789")), true},
		{"empty", strings.NewReader(""), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g.Reset()
			req, err := http.NewRequest(http.MethodPost, g.URL()+"/v1/completions", tt.body)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("EPP-Profile", "decode")
			resp, body := loopback.Fetch(t, testClient, req)
			l := settled(t, g)[0]
			if tt.tooLong {
				wantPlain(t, resp, body, http.StatusRequestEntityTooLarge, BodyPayloadTooLarge)
				if l.Backend != "" || l.Status != 413 || l.Failure != FailureTooLarge {
					t.Errorf("leg %+v", l)
				}
				return
			}
			var e echoed
			if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != http.StatusOK || len(e.Body) > 8 || l.Backend != b.URL {
				t.Errorf("status %d body %s leg %+v", resp.StatusCode, body, l)
			}
		})
	}
}

func TestEPPConditionalDecode(t *testing.T) {
	w0 := startWorker(t, simworker.Config{Name: "w0", Role: simworker.RoleDecode})
	w1 := startWorker(t, simworker.Config{Name: "w1", Role: simworker.RoleDecode})
	pre := startWorker(t, simworker.Config{Name: "p", Role: simworker.RoleBoth})
	g := startGatewayWith(t, Config{
		Pools:                map[string][]string{"decode": {w0.URL(), w1.URL()}, "prefill": {pre.URL()}},
		EPPConditionalDecode: true,
	})
	chat := func(text, model string) string {
		return `{"model":"` + model + `","messages":[{"role":"user","content":"` + text + `"}],"max_tokens":2}`
	}
	tests := []struct {
		name    string
		profile string
		body    string
		prefer  bool
		status  int
		backend *simworker.Worker // nil: none
		failure Failure
	}{
		{"plain request served round-robin: w0 holds A", "decode", chat("alpha", "sim-model"), false, 200, w0, FailureNone},
		{"w1 holds B", "decode", chat("beta", "sim-model"), false, 200, w1, FailureNone},
		{"an error answer records nothing", "decode", chat("delta", "other-model"), false, 404, w0, FailureNone},
		{"conditional A goes to its holder", "decode", chat("alpha", "sim-model"), true, 200, w0, FailureNone},
		{"conditional A again", "decode", chat("alpha", "sim-model"), true, 200, w0, FailureNone},
		{"conditional B goes to its holder", "decode", chat("beta", "sim-model"), true, 200, w1, FailureNone},
		{"nobody holds C: 412 from the picker", "decode", chat("gamma", "sim-model"), true, 412, nil, FailureNotHeld},
		{"nobody holds D", "decode", chat("delta", "sim-model"), true, 412, nil, FailureNotHeld},
		{"not an inference request", "decode", `{}`, true, 412, nil, FailureNotHeld},
		{"other profiles are untouched: the worker answers", "prefill", chat("gamma", "sim-model"), true, 412, pre, FailureNone},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := map[*simworker.Worker]int{w0: len(w0.Requests()), w1: len(w1.Requests()), pre: len(pre.Requests())}
			header := []string{"EPP-Profile", tt.profile}
			if tt.prefer {
				header = append(header, "Prefer", "if-available")
			}
			resp, body := send(t, g, http.MethodPost, simworker.PathChatCompletions, tt.body, header...)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d %s, want %d", resp.StatusCode, body, tt.status)
			}
			l := settled(t, g)[i]
			for w, n := range before {
				got := w.Requests()
				if w != tt.backend {
					if len(got) != n {
						t.Errorf("%s was contacted", w.Name())
					}
					continue
				}
				if len(got) != n+1 || l.Backend != w.URL() {
					t.Fatalf("leg %+v, %s saw %d requests", l, w.Name(), len(got)-n)
				}
				if prefer := got[n].Header.Get("Prefer"); (prefer != "") != (tt.prefer && tt.profile != "decode") {
					t.Errorf("%s saw Prefer %q", w.Name(), prefer)
				}
			}
			if l.Failure != tt.failure || (tt.backend == nil && l.Backend != "") {
				t.Errorf("leg %+v", l)
			}
			if tt.failure == FailureNotHeld && (!strings.Contains(string(body), `"type":"precondition_failed","code":412`) ||
				resp.Header.Get("Content-Type") != "application/json") {
				t.Errorf("412 body %s", body)
			}
		})
	}

	// A holder that dies is ejected and forgets its keys.
	w0.Kill()
	resp, body := send(t, g, http.MethodPost, simworker.PathChatCompletions, chat("alpha", "sim-model"), "EPP-Profile", "decode", "Prefer", "if-available")
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.HasPrefix(string(body), "upstream connect error or disconnect/reset before headers") {
		t.Fatalf("status %d %s from a killed holder", resp.StatusCode, body)
	}
	if legs := settled(t, g); !legs[len(legs)-1].Ejected {
		t.Fatalf("leg %+v", legs[len(legs)-1])
	}
	if resp, _ := send(t, g, http.MethodPost, simworker.PathChatCompletions, chat("alpha", "sim-model"), "EPP-Profile", "decode", "Prefer", "if-available"); resp.StatusCode != http.StatusPreconditionFailed {
		t.Errorf("status %d once the holder is ejected", resp.StatusCode)
	}
}

// fleet is a set of named echo backends that count the requests they get.
type fleet struct {
	srv  map[string]*httptest.Server
	hits map[string]*atomic.Int32
}

// newFleet starts an echo backend per name, closed at the end of the test.
func newFleet(t *testing.T, names ...string) *fleet {
	t.Helper()
	f := &fleet{srv: map[string]*httptest.Server{}, hits: map[string]*atomic.Int32{}}
	for _, name := range names {
		hits := &atomic.Int32{}
		srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			b, _ := io.ReadAll(r.Body)
			rw.Header().Set("Content-Type", "application/json")
			rw.Header().Set("X-Backend", name)
			_ = json.NewEncoder(rw).Encode(echoed{name, r.Method, r.URL.Path, r.URL.RawQuery, r.Header, string(b)})
		}))
		t.Cleanup(srv.Close)
		f.srv[name], f.hits[name] = srv, hits
	}
	return f
}

// url returns the base URL of the backend name.
func (f *fleet) url(name string) string { return f.srv[name].URL }

// host returns the ip:port of the backend name.
func (f *fleet) host(name string) string { return f.srv[name].Listener.Addr().String() }

// counts returns the requests each backend got so far.
func (f *fleet) counts() map[string]int {
	out := map[string]int{}
	for name, h := range f.hits {
		out[name] = int(h.Load())
	}
	return out
}

// contacted returns, sorted, the backends that got requests since before (a counts result).
func (f *fleet) contacted(before map[string]int) []string {
	var out []string
	for name, n := range f.counts() {
		if n != before[name] {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// wantError fails the test unless the answer is status with the gateway's JSON error of typ
// and message.
func wantError(t *testing.T, resp *http.Response, body []byte, status int, typ, message string) {
	t.Helper()
	var e errorBody
	if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != status || resp.Header.Get("Content-Type") != "application/json" ||
		e.Error.Type != typ || e.Error.Message != message || e.Error.Code != status {
		t.Errorf("answer %d %q %s, want %d %s %q", resp.StatusCode, resp.Header.Get("Content-Type"), body, status, typ, message)
	}
}

// pinRejected is the message of a 503 for the pin value.
func pinRejected(pin string) string {
	return fmt.Sprintf("endpoint pin %q: no candidate endpoint matches (rejected-no-endpoints)", pin)
}

// chatBody is a chat completion request for text.
func chatBody(text string) string {
	return `{"model":"sim-model","messages":[{"role":"user","content":"` + text + `"}],"max_tokens":1}`
}

func TestEndpointPin(t *testing.T) {
	f := newFleet(t, "a", "b", "c")
	dead := deadURL(t)
	deadHost := strings.TrimPrefix(dead, "http://")
	g := startGatewayWith(t, Config{Pools: map[string][]string{"prefill": {f.url("a"), f.url("b"), dead}, "decode": {f.url("c")}}})
	_, aPort, _ := net.SplitHostPort(f.host("a"))
	tests := []struct {
		name    string
		pin     string
		want    string  // the backend that serves it, "" for none
		failure Failure // the leg's
	}{
		{"pinned to b", f.host("b"), "b", FailureNone},
		{"pinned to b again: round-robin does not move it", f.host("b"), "b", FailureNone},
		{"pinned to a", f.host("a"), "a", FailureNone},
		{"a host name does not parse", "localhost:" + aPort, "", FailurePinRejected},
		{"no port", "127.0.0.1", "", FailurePinRejected},
		{"garbage", "not an endpoint", "", FailurePinRejected},
		{"a backend of another pool", f.host("c"), "", FailurePinRejected},
		{"no backend there", "127.0.0.1:1", "", FailurePinRejected},
		{"pinned to a dead backend: it fails and is ejected", deadHost, "", FailureConnect},
		{"pinned to an ejected backend: no fallback", deadHost, "", FailurePinRejected},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := f.counts()
			resp, body := send(t, g, http.MethodPost, simworker.PathCompletions, "{}", "EPP-Profile", "prefill", PinHeader, tt.pin)
			l := settled(t, g)[i]
			if got := f.contacted(before); tt.want == "" && len(got) != 0 || tt.want != "" && !slices.Equal(got, []string{tt.want}) {
				t.Fatalf("contacted %v, want %q", got, tt.want)
			}
			if l.Pin != tt.pin || l.Failure != tt.failure {
				t.Errorf("leg %+v", l)
			}
			switch tt.failure {
			case FailureNone:
				var e echoed
				if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != http.StatusOK || l.Backend != f.url(tt.want) {
					t.Fatalf("status %d %s leg %+v", resp.StatusCode, body, l)
				}
				if _, ok := e.Header[PinHeader]; ok {
					t.Errorf("the backend saw the pin: %v", e.Header)
				}
			case FailureConnect:
				wantPlain(t, resp, body, http.StatusServiceUnavailable, BodyConnectFailure)
				if !l.Ejected || l.Backend != dead {
					t.Errorf("leg %+v", l)
				}
			case FailurePinRejected:
				wantError(t, resp, body, http.StatusServiceUnavailable, "service_unavailable", pinRejected(tt.pin))
				if l.Backend != "" || l.Status != 503 {
					t.Errorf("leg %+v", l)
				}
			}
		})
	}
	// Unpinned requests go on round-robin over the live backends.
	before := f.counts()
	for range 2 {
		if resp, body := send(t, g, http.MethodPost, simworker.PathCompletions, "{}", "EPP-Profile", "prefill"); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d %s", resp.StatusCode, body)
		}
	}
	if got := f.contacted(before); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("unpinned requests went to %v", got)
	}
}

func TestEndpointPinConditionalDecode(t *testing.T) {
	f := newFleet(t, "d0", "d1")
	g := startGatewayWith(t, Config{Pools: map[string][]string{"decode": {f.url("d0"), f.url("d1")}}, EPPConditionalDecode: true})
	tests := []struct {
		name    string
		pin     string
		prefer  bool
		status  int
		want    string // the backend that serves it, "" for none
		failure Failure
	}{
		{"plain, pinned to d1: d1 holds the prompt", f.host("d1"), false, 200, "d1", FailureNone},
		{"conditional, pinned to d0 that does not hold it", f.host("d0"), true, 412, "", FailureNotHeld},
		{"conditional, pinned to its holder", f.host("d1"), true, 200, "d1", FailureNone},
		{"conditional, unpinned: its holder", "", true, 200, "d1", FailureNone},
		{"conditional with a bad pin: the pin decides first", "127.0.0.1:1", true, 503, "", FailurePinRejected},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			header := []string{"EPP-Profile", "decode", PinHeader, tt.pin}
			if tt.prefer {
				header = append(header, "Prefer", "if-available")
			}
			before := f.counts()
			resp, body := send(t, g, http.MethodPost, simworker.PathChatCompletions, chatBody("alpha"), header...)
			l := settled(t, g)[i]
			if resp.StatusCode != tt.status || l.Failure != tt.failure {
				t.Fatalf("status %d %s leg %+v, want %d %q", resp.StatusCode, body, l, tt.status, tt.failure)
			}
			if got := f.contacted(before); tt.want == "" && len(got) != 0 || tt.want != "" && !slices.Equal(got, []string{tt.want}) {
				t.Fatalf("contacted %v, want %q", got, tt.want)
			}
			if tt.want == "" {
				return
			}
			var e echoed
			if err := json.Unmarshal(body, &e); err != nil || l.Backend != f.url(tt.want) {
				t.Fatalf("body %s leg %+v", body, l)
			}
			if e.Header.Get("Prefer") != "" || e.Header.Get(PinHeader) != "" {
				t.Errorf("the backend saw %v", e.Header)
			}
		})
	}
}

func TestHasPreference(t *testing.T) {
	tests := []struct {
		name   string
		values []string
		want   bool
	}{
		{"absent", nil, false},
		{"alone", []string{"reserve-endpoint"}, true},
		{"any case", []string{"Reserve-Endpoint"}, true},
		{"among others", []string{"respond-async, reserve-endpoint ,wait=5"}, true},
		{"with a value and parameters", []string{`reserve-endpoint="x"; a=1;b`}, true},
		{"in a second header", []string{"wait=5", "reserve-endpoint"}, true},
		{"a longer token", []string{"reserve-endpoints"}, false},
		{"a prefixed token", []string{"x-reserve-endpoint"}, false},
		{"only as a value", []string{"hint=reserve-endpoint"}, false},
		{"only as a parameter", []string{"wait=1; reserve-endpoint"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range tt.values {
				h.Add("Prefer", v)
			}
			if got := hasPreference(h, PreferReserveEndpoint); got != tt.want {
				t.Errorf("hasPreference(%q) = %v, want %v", tt.values, got, tt.want)
			}
		})
	}
}

func TestReserveEndpoint(t *testing.T) {
	f := newFleet(t, "a", "b")
	g := startGatewayWith(t, Config{Pools: map[string][]string{"prefill": {f.url("a"), f.url("b")}}})
	tests := []struct {
		name     string
		body     string
		header   []string
		reserved string // the backend reserved, "" for none
		status   int
	}{
		{"reserved round-robin: a", "{}", []string{"Prefer", "reserve-endpoint"}, "a", 204},
		{"then b", "{}", []string{"Prefer", "reserve-endpoint"}, "b", 204},
		{"among other preferences, any case, value and parameters", "{}", []string{"Prefer", "respond-async, Reserve-Endpoint=1; x=y"}, "a", 204},
		{"in a second Prefer header", "{}", []string{"Prefer", "wait=5", "Prefer", "reserve-endpoint"}, "b", 204},
		{"pinned", "{}", []string{"Prefer", "reserve-endpoint", PinHeader, f.host("b")}, "b", 204},
		{"pinned elsewhere: rejected", "{}", []string{"Prefer", "reserve-endpoint", PinHeader, "127.0.0.1:1"}, "", 503},
		{"without a body", "", []string{"Prefer", "reserve-endpoint"}, "", 400},
		{"not the preference: forwarded", "{}", []string{"Prefer", "reserve-endpoints, x-reserve-endpoint"}, "", 200},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := f.counts()
			resp, body := send(t, g, http.MethodPost, simworker.PathCompletions, tt.body, append([]string{"EPP-Profile", "prefill"}, tt.header...)...)
			l := settled(t, g)[i]
			contacted := f.contacted(before)
			if resp.StatusCode != tt.status || l.Status != tt.status {
				t.Fatalf("status %d %s leg %+v, want %d", resp.StatusCode, body, l, tt.status)
			}
			switch tt.status {
			case 204:
				if len(contacted) != 0 || len(body) != 0 || !l.Reserved || l.Backend != f.url(tt.reserved) || l.Failure != FailureNone ||
					resp.Header.Get(ReservedHeader) != f.host(tt.reserved) || resp.Header.Get("Preference-Applied") != PreferReserveEndpoint {
					t.Errorf("contacted %v, answer %v %q, leg %+v", contacted, resp.Header, body, l)
				}
			case 503:
				wantError(t, resp, body, 503, "service_unavailable", pinRejected("127.0.0.1:1"))
				if len(contacted) != 0 || l.Reserved || l.Backend != "" || l.Failure != FailurePinRejected {
					t.Errorf("contacted %v, leg %+v", contacted, l)
				}
			case 400:
				wantError(t, resp, body, 400, "invalid_request_error", "a reservation needs the request body to schedule it")
				if len(contacted) != 0 || l.Reserved || l.Backend != "" || l.Failure != FailureEmptyReservation {
					t.Errorf("contacted %v, leg %+v", contacted, l)
				}
			case 200:
				if len(contacted) != 1 || l.Reserved || l.Backend != f.url(contacted[0]) || resp.Header.Get(ReservedHeader) != "" {
					t.Errorf("contacted %v, leg %+v", contacted, l)
				}
			}
		})
	}
	if picks := g.Picks("prefill"); picks[f.url("a")]+picks[f.url("b")] != 6 {
		t.Errorf("Picks = %v, want the 5 reservations and the forwarded request", picks)
	}
}

func TestReserveAnswer(t *testing.T) {
	tests := []struct {
		name    string
		legacy  bool
		status  int
		header  string // carrying the reserved ip:port
		absent  string // a header the answer must not carry
		applied string // Preference-Applied
	}{
		{"reserve-endpoint", false, http.StatusNoContent, ReservedHeader, LegacyReservedHeader, PreferReserveEndpoint},
		{"legacy", true, http.StatusOK, LegacyReservedHeader, ReservedHeader, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFleet(t, "a")
			g := startGatewayWith(t, Config{Pools: map[string][]string{"prefill": {f.url("a")}}, LegacyReserve: tt.legacy})
			resp, body := send(t, g, http.MethodPost, simworker.PathCompletions, chatBody("x"), "EPP-Profile", "prefill", "Prefer", "reserve-endpoint")
			if resp.StatusCode != tt.status || resp.Header.Get(tt.header) != f.host("a") || resp.Header.Get(tt.absent) != "" ||
				resp.Header.Get("Preference-Applied") != tt.applied || len(body) != 0 || resp.ContentLength > 0 {
				t.Errorf("answer %d %v %q", resp.StatusCode, resp.Header, body)
			}
			if l := settled(t, g)[0]; !l.Reserved || l.Backend != f.url("a") || l.Status != tt.status {
				t.Errorf("leg %+v", l)
			}
			if n := f.counts()["a"]; n != 0 {
				t.Errorf("the backend got %d requests", n)
			}
		})
	}
}

func TestReservationRecordsNoKey(t *testing.T) {
	f := newFleet(t, "d0", "p0", "p1")
	g := startGatewayWith(t, Config{
		Pools:                map[string][]string{"decode": {f.url("d0")}, "prefill": {f.url("p0"), f.url("p1")}},
		EPPConditionalDecode: true,
		Hints:                true,
	})
	reserve := func(profile string, header ...string) {
		t.Helper()
		resp, body := send(t, g, http.MethodPost, simworker.PathChatCompletions, chatBody("alpha"),
			append([]string{"EPP-Profile", profile, "Prefer", "reserve-endpoint"}, header...)...)
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("reservation: status %d %s", resp.StatusCode, body)
		}
	}
	reserve("decode")
	reserve("prefill", PinHeader, f.host("p1"))
	resp, body := send(t, g, http.MethodPost, simworker.PathChatCompletions, chatBody("alpha"), "EPP-Profile", "decode", "Prefer", "if-available")
	if resp.StatusCode != http.StatusPreconditionFailed {
		t.Fatalf("status %d %s: the decode reservation recorded the prompt", resp.StatusCode, body)
	}
	if got, want := resp.Header.Get(HintHeader("prefill")), f.host("p0")+","+f.host("p1"); got != want {
		t.Errorf("prefill hint %q, want %q: the prefill reservation recorded the prompt", got, want)
	}
	// A conditional reservation needs the prompt held too.
	resp, body = send(t, g, http.MethodPost, simworker.PathChatCompletions, chatBody("alpha"),
		"EPP-Profile", "decode", "Prefer", "if-available, reserve-endpoint")
	if l := settled(t, g)[3]; resp.StatusCode != http.StatusPreconditionFailed || l.Reserved || l.Failure != FailureNotHeld {
		t.Errorf("status %d %s leg %+v", resp.StatusCode, body, l)
	}
	if n := f.counts(); n["d0"]+n["p0"]+n["p1"] != 0 {
		t.Errorf("backends contacted: %v", n)
	}
}

func TestHintHeader(t *testing.T) {
	for profile, want := range map[string]string{"prefill": "X-Prefill-Host-Port", "Encode": "X-Encode-Host-Port", "decode": "X-Decode-Host-Port"} {
		if got := HintHeader(profile); got != want {
			t.Errorf("HintHeader(%q) = %q, want %q", profile, got, want)
		}
	}
	if HintHeader("prefill") != LegacyReservedHeader {
		t.Error("the legacy reservation header is not the prefill hint")
	}
}

func TestHints(t *testing.T) {
	f := newFleet(t, "d0", "p0", "p1", "e0", "e1")
	p2 := oneShotBackend(t, "p2")
	p2Host := p2.Listener.Addr().String()
	dead := deadURL(t)
	g := startGatewayWith(t, Config{
		Pools: map[string][]string{
			"decode":  {f.url("d0")},
			"prefill": {f.url("p0"), f.url("p1"), p2.URL},
			"encode":  {f.url("e0"), f.url("e1")},
			"embed":   {dead},
		},
		EPPConditionalDecode: true,
		Hints:                true,
	})
	post := func(profile, body string, header ...string) (*http.Response, []byte, Leg) {
		t.Helper()
		resp, b := send(t, g, http.MethodPost, simworker.PathChatCompletions, body, append([]string{"EPP-Profile", profile}, header...)...)
		legs := settled(t, g)
		return resp, b, legs[len(legs)-1]
	}
	// Prefill and encode backends answer prompts: alpha on p0 and p2, beta on p1, alpha on e0.
	for _, tt := range []struct{ profile, text, backend string }{
		{"prefill", "alpha", f.url("p0")}, {"prefill", "beta", f.url("p1")}, {"prefill", "alpha", p2.URL}, {"encode", "alpha", f.url("e0")},
	} {
		if resp, body, l := post(tt.profile, chatBody(tt.text)); resp.StatusCode != http.StatusOK || l.Backend != tt.backend {
			t.Fatalf("%s %s: status %d %s leg %+v", tt.profile, tt.text, resp.StatusCode, body, l)
		}
	}
	// The only embed backend fails and is ejected: that pool has no live backend.
	if _, _, l := post("embed", chatBody("alpha")); !l.Ejected {
		t.Fatalf("embed leg %+v", l)
	}
	hosts := func(names ...string) string {
		out := make([]string, len(names))
		for i, n := range names {
			out[i] = p2Host
			if n != "p2" {
				out[i] = f.host(n)
			}
		}
		return strings.Join(out, ",")
	}
	tests := []struct {
		name string
		body string
		want map[string]string // by profile
	}{
		{"alpha: its holders first", chatBody("alpha"), map[string]string{"prefill": hosts("p0", "p2", "p1"), "encode": hosts("e0", "e1")}},
		{"beta", chatBody("beta"), map[string]string{"prefill": hosts("p1", "p0", "p2"), "encode": hosts("e0", "e1")}},
		{"nobody holds gamma: pool order", chatBody("gamma"), map[string]string{"prefill": hosts("p0", "p1", "p2"), "encode": hosts("e0", "e1")}},
		{"not an inference request: pool order", `{}`, map[string]string{"prefill": hosts("p0", "p1", "p2"), "encode": hosts("e0", "e1")}},
	}
	check := func(t *testing.T, body string, want map[string]string) {
		t.Helper()
		before := f.counts()
		resp, b, l := post("decode", body, "Prefer", "if-available")
		if resp.StatusCode != http.StatusPreconditionFailed || l.Failure != FailureNotHeld || !maps.Equal(l.Hints, want) {
			t.Fatalf("status %d %s leg %+v, want hints %v", resp.StatusCode, b, l, want)
		}
		for _, profile := range []string{"prefill", "encode", "decode", "embed"} {
			if got := resp.Header.Values(HintHeader(profile)); len(got) > 1 || want[profile] != "" && got[0] != want[profile] ||
				want[profile] == "" && len(got) != 0 {
				t.Errorf("%s: %q, want %q", HintHeader(profile), got, want[profile])
			}
		}
		if got := f.contacted(before); len(got) != 0 {
			t.Errorf("contacted %v", got)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { check(t, tt.body, tt.want) })
	}
	t.Run("an ejected backend is no hint", func(t *testing.T) {
		p2.Close()
		if _, _, l := post("prefill", chatBody("x"), PinHeader, p2Host); l.Failure != FailureConnect || !l.Ejected {
			t.Fatalf("leg %+v", l)
		}
		check(t, chatBody("alpha"), map[string]string{"prefill": hosts("p0", "p1"), "encode": hosts("e0", "e1")})
	})
	t.Run("a decode served carries no hints", func(t *testing.T) {
		if resp, body, _ := post("decode", chatBody("alpha")); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d %s", resp.StatusCode, body)
		}
		resp, body, l := post("decode", chatBody("alpha"), "Prefer", "if-available")
		if resp.StatusCode != http.StatusOK || l.Hints != nil || resp.Header.Get(HintHeader("prefill")) != "" {
			t.Errorf("status %d %s leg %+v", resp.StatusCode, body, l)
		}
	})
}

func TestHintsOff(t *testing.T) {
	tests := []struct {
		name   string
		cfg    Config
		status int // of a conditional decode nobody holds
	}{
		{"conditional decode without hints", Config{EPPConditionalDecode: true}, http.StatusPreconditionFailed},
		{"hints without conditional decode: the worker decides", Config{Hints: true}, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFleet(t, "d0", "p0")
			tt.cfg.Pools = map[string][]string{"decode": {f.url("d0")}, "prefill": {f.url("p0")}}
			g := startGatewayWith(t, tt.cfg)
			if resp, body := send(t, g, http.MethodPost, simworker.PathChatCompletions, chatBody("alpha"), "EPP-Profile", "prefill"); resp.StatusCode != http.StatusOK {
				t.Fatalf("prefill status %d %s", resp.StatusCode, body)
			}
			resp, body := send(t, g, http.MethodPost, simworker.PathChatCompletions, chatBody("alpha"), "EPP-Profile", "decode", "Prefer", "if-available")
			if l := settled(t, g)[1]; resp.StatusCode != tt.status || resp.Header.Get(HintHeader("prefill")) != "" || l.Hints != nil {
				t.Errorf("status %d %v %s leg %+v", resp.StatusCode, resp.Header, body, l)
			}
		})
	}
}

// TestPrefixAffinity: as llm-d's EPP, a prompt goes back to the backend it was picked for, dead
// or not, until the pool changes (its readiness flips); with fallbacks, a connection that fails
// before headers is tried on the pick's next endpoint, as Envoy's override_host does.
func TestPrefixAffinity(t *testing.T) {
	chat := func(prompt string) string {
		return `{"model":"m","messages":[{"role":"user","content":"` + prompt + `"}]}`
	}
	for _, tc := range []struct {
		name      string
		fallbacks int
		// want is the status each of three sends of a prompt first picked for the dead backend
		// gets, and tried the endpoints each leg tried before the one that answered.
		want  int
		tried int
	}{
		{name: "without fallbacks: every retry goes to the dead backend", fallbacks: 0, want: http.StatusServiceUnavailable, tried: 0},
		{name: "with a fallback: the next endpoint answers", fallbacks: 1, want: http.StatusOK, tried: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := echoBackend(t, "a"), echoBackend(t, "b")
			g := startGatewayWith(t, Config{Pools: map[string][]string{"decode": {a.URL, b.URL}}, PrefixAffinity: true, Fallbacks: tc.fallbacks})
			post := func(prompt string) (*http.Response, []byte) {
				return send(t, g, http.MethodPost, "/v1/chat/completions", chat(prompt), "EPP-Profile", "decode")
			}
			// p1 is picked for a, p2 for b (round-robin), and each goes back to its backend.
			for _, step := range []struct{ prompt, backend string }{{"p1", "a"}, {"p2", "b"}, {"p1", "a"}, {"p2", "b"}} {
				if resp, body := post(step.prompt); resp.StatusCode != http.StatusOK || resp.Header.Get("X-Backend") != step.backend {
					t.Fatalf("%s: %d from %q %s, want %s", step.prompt, resp.StatusCode, resp.Header.Get("X-Backend"), body, step.backend)
				}
			}
			b.Close() // its process dies; its pod stays Ready
			g.Reset()
			for range 3 {
				resp, body := post("p2")
				if resp.StatusCode != tc.want {
					t.Fatalf("p2 after b died: %d %s, want %d", resp.StatusCode, body, tc.want)
				}
			}
			for _, l := range settled(t, g) {
				if len(l.Tried) != tc.tried || l.Ejected || (tc.tried == 1 && (l.Tried[0] != b.URL || l.Backend != a.URL)) {
					t.Fatalf("leg %+v: want %d endpoints tried before the answer and no ejection", l, tc.tried)
				}
			}
			// Its readiness flips: the pool no longer has it, and p2 is picked afresh.
			if err := g.SetPool("decode", []string{a.URL}); err != nil {
				t.Fatal(err)
			}
			if resp, body := post("p2"); resp.StatusCode != http.StatusOK || resp.Header.Get("X-Backend") != "a" {
				t.Fatalf("p2 after the pool changed: %d %s", resp.StatusCode, body)
			}
		})
	}
}

package steps

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/pipeline/registry"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/dataplane/wire"
)

// captured is one request the fake gateway received.
type captured struct {
	Method, Path string
	Header       http.Header
	Body         map[string]any
	Raw          []byte
}

// fakeGateway is an httptest server standing in for the gateway in step unit tests; answer
// decides each response.
type fakeGateway struct {
	t      *testing.T
	srv    *httptest.Server
	mu     sync.Mutex
	reqs   []captured
	answer func(w http.ResponseWriter, c captured, r *http.Request)
	// tune, when set, changes the gateway settings of the steps' client.
	tune func(*config.Gateway)
}

func newFakeGateway(t *testing.T, answer func(w http.ResponseWriter, c captured)) *fakeGateway {
	return newFakeGatewayReq(t, func(w http.ResponseWriter, c captured, _ *http.Request) { answer(w, c) })
}

// newFakeGatewayReq is newFakeGateway for answers that need the request (its context).
func newFakeGatewayReq(t *testing.T, answer func(w http.ResponseWriter, c captured, r *http.Request)) *fakeGateway {
	g := &fakeGateway{t: t, answer: answer}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		c := captured{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Raw: raw}
		if len(raw) > 0 {
			if err := json.Unmarshal(raw, &c.Body); err != nil {
				t.Errorf("leg body is not a JSON object: %v: %s", err, raw)
			}
		}
		g.mu.Lock()
		g.reqs = append(g.reqs, c)
		g.mu.Unlock()
		g.answer(w, c, r)
	}))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *fakeGateway) client() *gateway.Client {
	// The handlers take g.mu before they answer: taking it here orders what a test set up before
	// building its steps (the answer functions) before every request those steps send. The
	// connection between them is no synchronisation the race detector sees.
	g.mu.Lock()
	g.mu.Unlock() //nolint:staticcheck // an empty critical section: the ordering is the point
	cfg := config.Default().Gateway
	cfg.Address, cfg.MaxIdleConnsPerHost = g.srv.URL, 4
	cfg.Retry.InitialBackoff, cfg.Retry.MaxBackoff = config.Duration(time.Millisecond), config.Duration(2*time.Millisecond)
	if g.tune != nil {
		g.tune(&cfg)
	}
	c, err := gateway.New(cfg, observe.Telemetry{}, nil)
	if err != nil {
		g.t.Fatal(err)
	}
	return c
}

func (g *fakeGateway) requests() []captured {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]captured(nil), g.reqs...)
}

func (g *fakeGateway) only() captured {
	g.t.Helper()
	r := g.requests()
	if len(r) != 1 {
		g.t.Fatalf("gateway got %d requests, want 1", len(r))
	}
	return r[0]
}

// newStep builds a registered step from params with the fake gateway.
func newStep(t *testing.T, typ string, gw *fakeGateway, own map[string]any) pipeline.Step {
	t.Helper()
	f := map[string]registry.Factory[builder.Deps]{
		DecodeStep: newDecode, PrefillStep: newPrefill, ConditionalDecodeStep: newConditionalDecode, PrefillDecodeStep: newPrefillDecode,
	}[typ]
	if f == nil {
		t.Fatalf("no factory %s", typ)
	}
	deps := builder.Deps{Log: logr.Discard(), Getenv: func(string) string { return "" }}
	if gw != nil {
		deps.Gateway = gw.client()
	}
	p := params.New("params", own, map[string]any{"kv_connector": "kv-shared-storage", "ec_connector": "ec-shared-storage", "use_openai_format": true})
	s, err := f(deps, p)
	if err == nil {
		err = p.Err()
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newRC parses a client body for path like the server does.
func newRC(t *testing.T, path, raw string, hdr http.Header) (*request.Context, *httptest.ResponseRecorder) {
	t.Helper()
	obj, err := body.Parse([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	model, _, _ := obj.String("model")
	stream, _, _ := obj.Bool("stream")
	if hdr == nil {
		hdr = http.Header{}
	}
	rec := httptest.NewRecorder()
	return &request.Context{
		ID: "req-1", API: wire.ForPath(path).API(), Path: path, Header: hdr, Forwarded: gateway.Forwarded(hdr),
		Body: obj, Model: model, Stream: stream, Writer: rec, Log: logr.Discard(),
	}, rec
}

// jsonEq compares a decoded leg value with the JSON text want.
func jsonEq(t *testing.T, what string, got any, want string) {
	t.Helper()
	var w any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad want %s: %v", want, err)
	}
	if !reflect.DeepEqual(got, w) {
		g, _ := json.Marshal(got)
		t.Fatalf("%s =\n  %s\nwant\n  %s", what, g, want)
	}
}

func okJSON(body string) func(http.ResponseWriter, captured) {
	return func(w http.ResponseWriter, _ captured) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, body)
	}
}

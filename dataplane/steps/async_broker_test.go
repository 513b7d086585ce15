package steps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/broker"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/wire"
)

// fakeBroker records what the step hands over.
type fakeBroker struct {
	class  string // what Classify answers
	calls  []string
	closed bool
}

func (f *fakeBroker) Classify(_ context.Context, _ logr.Logger, tenant string) string {
	f.calls = append(f.calls, "classify "+tenant)
	return f.class
}

func (f *fakeBroker) Queue(_ context.Context, _ *request.Context, tenant, mode string, timeout time.Duration) error {
	f.calls = append(f.calls, fmt.Sprintf("queue %s %s %s", tenant, mode, timeout))
	return nil
}

func (f *fakeBroker) ServeResult(w http.ResponseWriter, _ *http.Request, tenant, id string) {
	f.calls = append(f.calls, "get "+tenant+" "+id)
	w.WriteHeader(http.StatusOK)
}

func (f *fakeBroker) ServeDelete(w http.ResponseWriter, _ *http.Request, tenant, id string) {
	f.calls = append(f.calls, "delete "+tenant+" "+id)
	w.WriteHeader(http.StatusNoContent)
}

func (f *fakeBroker) Close() { f.closed = true }

// stepWith builds the step from own params with the fake broker as its runtime.
func stepWith(t *testing.T, own map[string]any, fb *fakeBroker) *asyncBroker {
	t.Helper()
	return brokerStep(t, own, func(*broker.Settings, logr.Logger, func(string) string) (broker.Broker, error) { return fb, nil })
}

// brokerStep builds the step from own params with the runtime rt (nil: none, as the operator).
func brokerStep(t *testing.T, own map[string]any, rt broker.Runtime) *asyncBroker {
	t.Helper()
	p := params.New("params", own, nil)
	s, err := newAsyncBroker(builder.Deps{Shared: builder.Shared{Broker: rt}}, p)
	if err == nil {
		err = p.Err()
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.(*asyncBroker).Close)
	return s.(*asyncBroker)
}

// chatRequest is a request context for a chat body with headers (name, value pairs).
func chatRequest(t *testing.T, body string, kv ...string) *request.Context {
	t.Helper()
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	var m struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatal(err)
	}
	return &request.Context{ID: "rid", Path: wire.Chat.Path(), Header: h, Forwarded: http.Header{},
		Model: m.Model, Stream: m.Stream, Writer: httptest.NewRecorder(), Log: logr.Discard()}
}

const (
	chatBody   = `{"model":"m1","messages":[]}`
	chatStream = `{"model":"m1","messages":[],"stream":true}`
)

// The step validates every request itself and hands the broker only valid ones, with the tenant,
// mode and time budget it computed.
func TestExecuteDelegates(t *testing.T) {
	own := map[string]any{
		"redis_url":  "redis://127.0.0.1:6379",
		"timeouts":   map[string]any{"enqueue": map[string]any{"default_seconds": 300, "max_seconds": 600}},
		"objectives": map[string]any{"default": map[string]any{"reserved": "std-r", "overflow": "std-o"}},
		"quota":      map[string]any{"limits": map[string]any{"teamA": 1}},
	}
	for _, tc := range []struct {
		name  string
		body  string
		hdr   []string
		class string // the fake broker's quota answer
		// want: the broker calls, or the 400's message and param
		calls      []string
		msg, param string
		objective  string // stamped in passthrough
	}{
		{name: "no mode header", body: chatBody, hdr: []string{"X-Team", "teamA"}},
		{name: "enqueue default", body: chatBody, hdr: []string{"X-AP-Mode", "enqueue"}, calls: []string{"queue default enqueue 5m0s"}},
		{name: "enqueue clamped", body: chatBody, hdr: []string{"X-AP-Mode", "Enqueue", "X-Team", "teamB", "X-Request-Timeout-Seconds", "7200"}, calls: []string{"queue teamB enqueue 10m0s"}},
		{name: "wait default", body: chatBody, hdr: []string{"X-AP-Mode", "wait"}, calls: []string{"queue default wait 1m0s"}},
		{name: "wait header", body: chatBody, hdr: []string{"X-AP-Mode", "wait", "X-Request-Timeout-Seconds", "5"}, calls: []string{"queue default wait 5s"}},
		{name: "wait clamped", body: chatBody, hdr: []string{"X-AP-Mode", "wait", "X-Request-Timeout-Seconds", "7200"}, calls: []string{"queue default wait 1h0m0s"}},
		{name: "passthrough unlimited", body: chatBody, hdr: []string{"X-AP-Mode", "passthrough", "X-Team", "teamB"}, objective: "std-r"},
		{name: "passthrough reserved", body: chatBody, hdr: []string{"X-AP-Mode", "passthrough", "X-Team", "teamA"}, class: broker.ClassReserved, calls: []string{"classify teamA"}, objective: "std-r"},
		{name: "passthrough overflow", body: chatBody, hdr: []string{"X-AP-Mode", "passthrough", "X-Team", "teamA"}, class: broker.ClassOverflow, calls: []string{"classify teamA"}, objective: "std-o"},
		{name: "unknown mode", body: chatBody, hdr: []string{"X-AP-Mode", "later"}, msg: "unknown X-AP-Mode"},
		{name: "stream enqueue", body: chatStream, hdr: []string{"X-AP-Mode", "enqueue"}, msg: "stream is only supported in passthrough mode", param: "stream"},
		{name: "stream wait", body: chatStream, hdr: []string{"X-AP-Mode", "wait"}, msg: "stream is only supported in passthrough mode", param: "stream"},
		{name: "tenant with colon", body: chatBody, hdr: []string{"X-AP-Mode", "enqueue", "X-Team", "a:b"}, msg: "must not contain ':'"},
		{name: "tenant with colon passthrough", body: chatBody, hdr: []string{"X-AP-Mode", "passthrough", "X-Team", "a:b"}, msg: "must not contain ':'"},
		{name: "tenant too long", body: chatBody, hdr: []string{"X-AP-Mode", "enqueue", "X-Team", strings.Repeat("t", 257)}, msg: "longer than 256 bytes"},
		{name: "missing model", body: `{"messages":[]}`, hdr: []string{"X-AP-Mode", "enqueue"}, msg: "model is required", param: "model"},
		{name: "bad timeout", body: chatBody, hdr: []string{"X-AP-Mode", "wait", "X-Request-Timeout-Seconds", "soon"}, msg: "positive whole number"},
		{name: "zero timeout", body: chatBody, hdr: []string{"X-AP-Mode", "enqueue", "X-Request-Timeout-Seconds", "0"}, msg: "positive whole number"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fb := &fakeBroker{class: tc.class}
			s := stepWith(t, own, fb)
			rc := chatRequest(t, tc.body, tc.hdr...)
			err := s.Execute(context.Background(), rc)
			if tc.msg != "" {
				var e *apierror.Error
				if !errors.As(err, &e) || e.Status != http.StatusBadRequest || e.Code != "INVALID_REQUEST" || e.Type != apierror.TypeInvalidRequest {
					t.Fatalf("Execute = %v, want a 400 INVALID_REQUEST", err)
				}
				if !strings.Contains(e.Message, tc.msg) || e.Param != tc.param {
					t.Fatalf("error message %q param %q, want %q and %q", e.Message, e.Param, tc.msg, tc.param)
				}
			} else if queued := len(tc.calls) > 0 && strings.HasPrefix(tc.calls[0], "queue"); queued != errors.Is(err, pipeline.ErrDone) ||
				!queued && err != nil {
				t.Fatalf("Execute = %v (a queued request is answered by the broker: pipeline.ErrDone)", err)
			}
			if strings.Join(fb.calls, "; ") != strings.Join(tc.calls, "; ") {
				t.Fatalf("broker calls = %q, want %q", fb.calls, tc.calls)
			}
			if got := rc.Forwarded.Get(broker.DefaultObjectiveHeader); got != tc.objective {
				t.Fatalf("objective header = %q, want %q", got, tc.objective)
			}
		})
	}
}

// The routes validate the id and tenant before the broker answers.
func TestRoutesDelegate(t *testing.T) {
	for _, tc := range []struct {
		method, path, tenant string
		status               int
		call                 string
	}{
		{http.MethodGet, "/v1/requests/abc-1", "", http.StatusOK, "get default abc-1"},
		{http.MethodGet, "/v1/requests/abc-1", "teamA", http.StatusOK, "get teamA abc-1"},
		{http.MethodDelete, "/v1/requests/abc-1", "teamA", http.StatusNoContent, "delete teamA abc-1"},
		{http.MethodGet, "/v1/requests/no_such!", "", http.StatusBadRequest, ""},
		{http.MethodDelete, "/v1/requests/" + strings.Repeat("a", 129), "", http.StatusBadRequest, ""},
		{http.MethodGet, "/v1/requests/abc", "a:b", http.StatusBadRequest, ""},
	} {
		t.Run(tc.method+" "+tc.path+" "+tc.tenant, func(t *testing.T) {
			fb := &fakeBroker{}
			s := stepWith(t, map[string]any{"redis_url": "redis://127.0.0.1:6379"}, fb)
			w := serveRoute(t, s, tc.method, tc.path, tc.tenant)
			if w.Code != tc.status {
				t.Fatalf("status = %d, want %d: %s", w.Code, tc.status, w.Body)
			}
			if strings.Join(fb.calls, "; ") != tc.call {
				t.Fatalf("broker calls = %q, want %q", fb.calls, tc.call)
			}
			s.Close()
			if !fb.closed {
				t.Fatal("Close did not close the broker")
			}
		})
	}
}

// serveRoute serves a request with the step's routes.
func serveRoute(t *testing.T, s *asyncBroker, method, path, tenant string) *httptest.ResponseRecorder {
	t.Helper()
	mux := http.NewServeMux()
	for _, r := range s.Routes() {
		mux.Handle(r.Pattern, r.Handler)
	}
	req := httptest.NewRequest(method, path, nil)
	if tenant != "" {
		req.Header.Set(broker.DefaultTenantHeader, tenant)
	}
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, req)
	return w
}

// A process that builds the step without its runtime (the operator) validates pipelines; serving
// a request that needs the broker answers a clear 500.
func TestWithoutRuntime(t *testing.T) {
	s := brokerStep(t, map[string]any{"redis_url": "redis://127.0.0.1:6379"}, nil)
	for _, tc := range []struct {
		name   string
		hdr    []string
		status int // 0: the request continues
	}{
		{"no mode header", nil, 0},
		{"passthrough", []string{"X-AP-Mode", "passthrough"}, http.StatusInternalServerError},
		{"enqueue", []string{"X-AP-Mode", "enqueue"}, http.StatusInternalServerError},
		{"wait", []string{"X-AP-Mode", "wait"}, http.StatusInternalServerError},
		{"invalid still 400", []string{"X-AP-Mode", "later"}, http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.Execute(context.Background(), chatRequest(t, chatBody, tc.hdr...))
			if tc.status == 0 {
				if err != nil {
					t.Fatalf("Execute = %v", err)
				}
				return
			}
			var e *apierror.Error
			if !errors.As(err, &e) || e.Status != tc.status {
				t.Fatalf("Execute = %v, want status %d", err, tc.status)
			}
			if tc.status == http.StatusInternalServerError &&
				(e.Code != "BROKER_NOT_LINKED" || !errors.Is(err, errNotLinked) || !strings.Contains(err.Error(), broker.RuntimePackage)) {
				t.Fatalf("Execute = %v (code %s), want BROKER_NOT_LINKED naming %s", err, e.Code, broker.RuntimePackage)
			}
		})
	}
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		w := serveRoute(t, s, method, "/v1/requests/abc", "")
		var body struct{ Error struct{ Code string } }
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || w.Code != http.StatusInternalServerError || body.Error.Code != "BROKER_NOT_LINKED" {
			t.Fatalf("%s without the runtime = %d %s", method, w.Code, w.Body)
		}
	}
}

// A runtime that rejects the settings fails the build at redis_url.
func TestRuntimeError(t *testing.T) {
	p := params.New("pipeline.steps[0].params", map[string]any{"redis_url": "redis://127.0.0.1:6379"}, nil)
	_, err := newAsyncBroker(builder.Deps{Shared: builder.Shared{Broker: func(*broker.Settings, logr.Logger, func(string) string) (broker.Broker, error) {
		return nil, errors.New("no good")
	}}}, p)
	if config.KeyOf(err) != "pipeline.steps[0].params.redis_url" || !strings.Contains(err.Error(), "no good") {
		t.Fatalf("newAsyncBroker = %v (key %q)", err, config.KeyOf(err))
	}
}

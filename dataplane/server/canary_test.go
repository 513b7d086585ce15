package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/server"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
)

// canaryStack is a coordinator serving a stable decode-only pipeline and a canary that
// prefills, with metrics, its admin endpoints and a gateway double recording every leg by the
// request it belongs to.
type canaryStack struct {
	url, admin     string
	reg            *prometheus.Registry
	stable, canary string // pipeline revisions

	mu   sync.Mutex
	legs map[string][]http.Header // by x-request-id
}

func startCanary(t *testing.T, weight int, answer http.HandlerFunc, mutate func(*config.Config)) *canaryStack {
	t.Helper()
	cs := &canaryStack{legs: map[string][]http.Header{}, reg: prometheus.NewRegistry()}
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		cs.mu.Lock()
		id := r.Header.Get("X-Coordinator-Request-Id") // the client request the leg is part of
		cs.legs[id] = append(cs.legs[id], r.Header.Clone())
		cs.mu.Unlock()
		answer(w, r)
	})
	cfg := config.Default()
	cfg.Gateway.Address = up.srv.URL
	cfg.Gateway.Retry.InitialBackoff, cfg.Gateway.Retry.MaxBackoff = config.Duration(time.Millisecond), config.Duration(time.Millisecond)
	cfg.Pipeline.Steps = []config.Step{{Type: "decode"}}
	cfg.Canary = config.NewCanary()
	cfg.Canary.WeightPercent = weight
	cfg.Canary.Pipeline.OnPoolFailure = config.OnPoolFailureFail
	cfg.Canary.Pipeline.Steps = []config.Step{{Type: "prefill"}, {Type: "decode"}}
	if mutate != nil {
		mutate(&cfg)
	}
	tel := observe.Telemetry{Metrics: observe.NewMetrics(cs.reg)}
	p, err := builder.Build(cfg, builder.Options{Telemetry: tel})
	if err != nil {
		t.Fatal(err)
	}
	holder := &pipeline.Holder{}
	holder.Swap(p)
	tel.Metrics.Loaded(p.Revision(), p.Tracks()...)
	cs.stable, cs.canary = cfg.Pipeline.Revision(), cfg.Canary.Pipeline.Revision()
	srv := server.New(server.Options{Server: cfg.Server, Pipelines: holder, Log: logr.Discard(), Telemetry: tel})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	cs.url = "http://" + l.Addr().String()
	cs.admin = startAdmin(t, holder, nil, nil)
	return cs
}

// tracks returns GET /debug/pipeline's pipelines by track.
func (cs *canaryStack) tracks(t *testing.T) map[string]server.PipelineTrack {
	t.Helper()
	resp, b := do(t, "GET", cs.admin+"/debug/pipeline", "", nil)
	var st server.PipelineStatus
	if err := json.Unmarshal(b, &st); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTP %d %v: %s", resp.StatusCode, err, b)
	}
	out := map[string]server.PipelineTrack{}
	for _, p := range st.Pipelines {
		out[p.Track] = p
	}
	return out
}

func (cs *canaryStack) requests(t *testing.T, track, revision, outcome string) float64 {
	return sample(t, cs.reg, "coordinator_pipeline_requests_total", map[string]string{"track": track, "revision": revision, "outcome": outcome})
}

// sample is the value of the series of name with exactly labels in reg; the test fails when there
// is no such series (a value of 0 is only meaningful for a series that exists).
func sample(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	m := find(t, reg, name, labels)
	if m == nil {
		t.Fatalf("no series %s%v", name, labels)
	}
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}

// find returns the series of name with exactly labels in reg, nil when there is none.
func find(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue series
				}
			}
			return m
		}
	}
	return nil
}

// Each request runs wholly on one pipeline: 5 of 20 on the 25% canary, whose legs (prefill and
// decode) all carry its revision, the stable requests' single decode leg the stable one. A
// client's forged revision header reaches no leg, and no client header picks the canary.
func TestCanarySplitsWholeRequests(t *testing.T) {
	cs := startCanary(t, 25, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, `{"id":"ok"}`) }, nil)
	for i := range 20 {
		resp, b := do(t, "POST", cs.url+"/v1/chat/completions", `{"model":"m","messages":[]}`, map[string]string{
			"X-Request-Id": fmt.Sprintf("req-%d", i), gateway.PipelineRevisionHeader: cs.canary, "X-Coordinator-Track": "canary"})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("HTTP %d %s", resp.StatusCode, b)
		}
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	onCanary := 0
	for id, legs := range cs.legs {
		rev := legs[0].Get(gateway.PipelineRevisionHeader)
		var profiles []string
		for _, h := range legs {
			if got := h.Values(gateway.PipelineRevisionHeader); len(got) != 1 || got[0] != rev {
				t.Fatalf("%s: legs carry revisions %q and %q: a request must stay on one pipeline", id, rev, got)
			}
			profiles = append(profiles, h.Get(gateway.ProfileHeader))
		}
		switch got := strings.Join(profiles, ","); {
		case rev == cs.canary && got == "prefill,decode":
			onCanary++
		case rev == cs.stable && got == "decode":
		default:
			t.Fatalf("%s: revision %q ran legs %s (stable %s, canary %s)", id, rev, got, cs.stable, cs.canary)
		}
	}
	if onCanary != 5 || len(cs.legs) != 20 {
		t.Fatalf("%d of %d requests on the canary, want 5 of 20", onCanary, len(cs.legs))
	}
	if got := cs.requests(t, config.TrackCanary, cs.canary, observe.OutcomeSuccess); got != 5 {
		t.Errorf("canary successes %v, want 5", got)
	}
	if got := cs.requests(t, config.TrackStable, cs.stable, observe.OutcomeSuccess); got != 15 {
		t.Errorf("stable successes %v, want 15", got)
	}
	if got := sample(t, cs.reg, "coordinator_pipeline_weight_percent", map[string]string{"track": "canary", "revision": cs.canary}); got != 25 {
		t.Errorf("canary weight gauge %v, want 25", got)
	}
}

// A bad canary is caught on its share of the traffic: each fault of its workers (refusing,
// dying mid-stream, hanging after the headers) fails only canary requests, and only the canary
// counts the errors. The stable requests, on healthy decode workers, all succeed.
func TestCanaryFaultsAreCountedOnTheCanary(t *testing.T) {
	tests := map[string]struct {
		stream bool
		// canaryLeg answers the canary's legs (the stable ones get a healthy answer).
		canaryLeg http.HandlerFunc
		// wantStatus is the canary requests' status; wantCut that the response started, then broke.
		wantStatus int
		wantCut    bool
	}{
		"prefill pool refusing (503, on_pool_failure: fail)": {
			canaryLeg: func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get(gateway.ProfileHeader) == gateway.ProfilePrefill {
					http.Error(w, "no capacity", http.StatusServiceUnavailable)
					return
				}
				_, _ = io.WriteString(w, `{"id":"ok"}`)
			},
			wantStatus: http.StatusServiceUnavailable,
		},
		"decode dying mid-stream on every pick": {
			stream: true,
			canaryLeg: func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get(gateway.ProfileHeader) == gateway.ProfilePrefill {
					_, _ = io.WriteString(w, `{}`)
					return
				}
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n")
				w.(http.Flusher).Flush()
				conn, _, _ := http.NewResponseController(w).Hijack()
				_ = conn.Close()
			},
			wantStatus: http.StatusOK, wantCut: true,
		},
		"decode hanging after its headers, on every pick (502 once retries are spent)": {
			canaryLeg: func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get(gateway.ProfileHeader) == gateway.ProfilePrefill {
					_, _ = io.WriteString(w, `{}`)
					return
				}
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			},
			wantStatus: http.StatusBadGateway,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var cs *canaryStack
			cs = startCanary(t, 20, func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get(gateway.PipelineRevisionHeader) == cs.canary {
					tc.canaryLeg(w, r)
					return
				}
				if tc.stream {
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
					return
				}
				_, _ = io.WriteString(w, `{"id":"ok"}`)
			}, func(c *config.Config) { c.Gateway.IdleTimeout = config.Duration(300 * time.Millisecond) })
			body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
			if tc.stream {
				body = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
			}
			statuses := map[int]int{}
			cut := 0
			for range 10 {
				resp, b := do(t, "POST", cs.url+"/v1/chat/completions", body, nil)
				statuses[resp.StatusCode]++
				if tc.stream && resp.StatusCode == http.StatusOK && !strings.Contains(string(b), "[DONE]") {
					cut++
					if !strings.Contains(string(b), `"error"`) {
						t.Fatalf("a broken stream must end with an error event: %q", b)
					}
				}
			}
			wantCanary := 2
			if tc.wantStatus == http.StatusOK {
				if statuses[http.StatusOK] != 10 || cut != wantCanary {
					t.Fatalf("statuses %v, %d cut streams; want 10 OK with %d cut", statuses, cut, wantCanary)
				}
			} else if statuses[tc.wantStatus] != wantCanary || statuses[http.StatusOK] != 10-wantCanary {
				t.Fatalf("statuses %v: want %d × %d (the canary's) and the rest 200", statuses, wantCanary, tc.wantStatus)
			}
			tracks := cs.tracks(t)
			if c := tracks[config.TrackCanary]; c.Requests != 2 || c.Errors != 2 || c.Revision != cs.canary || c.WeightPercent != 20 || len(c.Steps) != 2 {
				t.Errorf("canary track %+v: want 2 requests, 2 errors, weight 20, its 2 steps", c)
			}
			if s := tracks[config.TrackStable]; s.Requests != 8 || s.Errors != 0 || s.Revision != cs.stable || s.WeightPercent != 80 {
				t.Errorf("stable track %+v: want 8 requests, no errors, weight 80", s)
			}
			if got := cs.requests(t, config.TrackCanary, cs.canary, observe.OutcomeError); got != 2 {
				t.Errorf("canary error series %v, want 2", got)
			}
			if got := cs.requests(t, config.TrackStable, cs.stable, observe.OutcomeError); got != 0 {
				t.Errorf("stable error series %v, want 0", got)
			}
		})
	}
}

// A client error is the client's, not the canary's: it counts as client_error, never as an
// error; a request that fails before it parses runs on no pipeline at all.
func TestCanaryClientErrorsAreNotPipelineErrors(t *testing.T) {
	cs := startCanary(t, 100, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":{"message":"bad sampling"}}`, http.StatusBadRequest)
	}, nil)
	if resp, _ := do(t, "POST", cs.url+"/v1/chat/completions", `{"messages":`, nil); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("invalid JSON: HTTP %d", resp.StatusCode)
	}
	if resp, _ := do(t, "POST", cs.url+"/v1/chat/completions", `{"model":"m","messages":[]}`, nil); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("worker 400: HTTP %d", resp.StatusCode)
	}
	c := cs.tracks(t)[config.TrackCanary]
	if c.Requests != 1 || c.Errors != 0 {
		t.Fatalf("canary %+v: want the one parsed request, not an error", c)
	}
	if got := cs.requests(t, config.TrackCanary, cs.canary, observe.OutcomeClientError); got != 1 {
		t.Fatalf("client_error series %v, want 1", got)
	}
}

// server.metrics_tenant_header labels each request's tenant series with the header's value,
// bounded (an unserved value is other); without the header configured there are none.
func TestTenantSeries(t *testing.T) {
	off := startCanary(t, 0, jsonAnswer, nil)
	if resp, _ := do(t, "POST", off.url+"/v1/chat/completions", `{"model":"m","messages":[]}`, map[string]string{"X-Team": "alpha"}); resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTP %d", resp.StatusCode)
	}
	if m := find(t, off.reg, "coordinator_tenant_requests_total", map[string]string{"tenant": "alpha", "route": "chat", "outcome": "success"}); m != nil {
		t.Fatal("tenant series without metrics_tenant_header")
	}

	cs := startCanary(t, 0, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"id":"ok","model":"m","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}}`)
	}, func(c *config.Config) { c.Server.MetricsTenantHeader = "X-Team" })
	for _, team := range []string{"alpha", "alpha", "beta"} {
		if resp, b := do(t, "POST", cs.url+"/v1/chat/completions", `{"model":"m","messages":[]}`, map[string]string{"X-Team": team}); resp.StatusCode != http.StatusOK {
			t.Fatalf("HTTP %d %s", resp.StatusCode, b)
		}
	}
	if resp, _ := do(t, "POST", cs.url+"/v1/chat/completions", `{"messages":`, map[string]string{"X-Team": "gamma"}); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("invalid JSON: HTTP %d", resp.StatusCode)
	}
	for _, tc := range []struct {
		tenant, outcome string
		want            float64
	}{{"alpha", "success", 2}, {"beta", "success", 1}, {"other", "client_error", 1}} {
		if got := sample(t, cs.reg, "coordinator_tenant_requests_total", map[string]string{"tenant": tc.tenant, "route": "chat", "outcome": tc.outcome}); got != tc.want {
			t.Errorf("tenant %s %s: %v, want %v", tc.tenant, tc.outcome, got, tc.want)
		}
	}
	if got := sample(t, cs.reg, "coordinator_tenant_tokens_total", map[string]string{"tenant": "alpha", "kind": "prompt"}); got != 8 {
		t.Errorf("alpha's prompt tokens %v, want 8", got)
	}
}

// A client that goes away mid-stream is not the pipeline's failure: the request counts, as
// neither success nor error of the canary.
func TestClientGoneIsNotAPipelineError(t *testing.T) {
	release := make(chan struct{})
	cs := startCanary(t, 100, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(gateway.ProfileHeader) == gateway.ProfilePrefill {
			_, _ = io.WriteString(w, `{}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n")
		w.(http.Flusher).Flush()
		select { // more tokens only once the client is gone
		case <-release:
		case <-r.Context().Done():
			return
		}
		for range 100 {
			if _, err := io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\n"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}, nil)
	req, err := http.NewRequest(http.MethodPost, cs.url+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 16)
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // the client leaves mid-stream
	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for cs.tracks(t)[config.TrackCanary].Requests == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the request never ended")
		}
		time.Sleep(10 * time.Millisecond) // polling for the server to finish the request
	}
	if c := cs.tracks(t)[config.TrackCanary]; c.Errors != 0 {
		t.Fatalf("canary %+v: a client leaving counted as the pipeline's error", c)
	}
	if got := cs.requests(t, config.TrackCanary, cs.canary, observe.OutcomeError); got != 0 {
		t.Fatalf("error series %v, want 0", got)
	}
}

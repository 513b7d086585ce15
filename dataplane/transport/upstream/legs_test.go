package upstream

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/epd-dev/coordinator/dataplane/base/observe"
)

// phaseMetric is the series of family name for phase in reg (nil when there is none).
func phaseMetric(t *testing.T, reg *prometheus.Registry, name, phase string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "phase" && l.GetValue() == phase {
					return m
				}
			}
		}
	}
	return nil
}

func legsInFlight(t *testing.T, reg *prometheus.Registry, phase string) float64 {
	return phaseMetric(t, reg, "coordinator_upstream_legs_in_flight", phase).GetGauge().GetValue()
}

func firstBytes(t *testing.T, reg *prometheus.Registry, phase string) (uint64, float64) {
	h := phaseMetric(t, reg, "coordinator_upstream_first_byte_seconds", phase).GetHistogram()
	return h.GetSampleCount(), h.GetSampleSum()
}

// A leg is in flight from its send to the end of its answer's body, per phase; the time to its
// answer's headers is observed once they arrive, and a leg that gets no answer leaves the gauge
// as it found it, observing nothing.
func TestLegMetrics(t *testing.T) {
	const hold = 30 * time.Millisecond
	headers, body := make(chan struct{}), make(chan struct{})
	c, reg := limitsServer(t, func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
		time.Sleep(hold) // the worker's queue: what the first-byte time measures
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		close(headers)
		select {
		case <-body:
		case <-release:
		}
		_, _ = io.WriteString(w, "done")
	})
	ctx := context.Background()
	type result struct {
		resp *http.Response
		err  error
	}
	answered := make(chan result, 1)
	go func() {
		resp, err := c.Do(ctx, Request{Path: "/v1/chat/completions", Phase: "prefill", Body: http.NoBody})
		answered <- result{resp, err}
	}()
	waitSignal(t, headers, "the headers")
	res := <-answered
	if res.err != nil {
		t.Fatal(res.err)
	}
	if got := legsInFlight(t, reg, "prefill"); got != 1 {
		t.Fatalf("prefill legs in flight while its body is read: %v, want 1", got)
	}
	if n, sum := firstBytes(t, reg, "prefill"); n != 1 || sum < hold.Seconds() {
		t.Fatalf("first byte: %d samples, %.3fs; want 1 of at least %s", n, sum, hold)
	}
	close(body)
	if b, err := io.ReadAll(res.resp.Body); err != nil || string(b) != "done" {
		t.Fatalf("body %q, %v", b, err)
	}
	res.resp.Body.Close()
	if got := legsInFlight(t, reg, "prefill"); got != 0 {
		t.Fatalf("prefill legs in flight after its body: %v, want 0", got)
	}

	// No answer at all: nothing stays in flight, no first byte.
	deadReg := prometheus.NewRegistry()
	dead, err := NewClient("http://127.0.0.1:1", TransportOptions{}, 0, observe.Telemetry{Metrics: observe.NewMetrics(deadReg)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dead.Close)
	if _, err := dead.Do(ctx, Request{Path: "/", Phase: "decode", Body: http.NoBody}); err == nil {
		t.Fatal("a call to a closed port succeeded")
	}
	if got := legsInFlight(t, deadReg, "decode"); got != 0 {
		t.Fatalf("decode legs in flight after a refused dial: %v, want 0", got)
	}
	if n, _ := firstBytes(t, deadReg, "decode"); n != 0 {
		t.Fatalf("first byte of a refused dial: %d samples", n)
	}
	if upstreamCalls(t, deadReg, "decode", "error") != 1 {
		t.Fatal("the refused dial is not counted as an upstream error")
	}
}

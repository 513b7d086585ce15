package observe

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
)

// recordAll drives every hook that records an llm-d series.
func recordAll(m *Metrics) {
	r := m.StartRequest("chat")
	r.Model("m")
	r.Done(RequestEnd{Model: "m", Status: 200, RequestBytes: 100, ResponseBytes: 1000, Ran: true, Stream: true,
		InputTokens: 42, Path: PathPrefillDecode, Images: 1, Overhead: time.Millisecond})
	r = m.StartRequest("completions")
	r.Model("m")
	r.Done(RequestEnd{Model: "m", Status: 400, ErrorCode: ErrBadRequest})
	done := m.StepStarted("prefill")
	done("error", time.Second, &apierror.UpstreamError{Phase: "prefill", Status: 503})
	m.Upstream("prefill", 200, time.Second)
	m.Upstream("media", 0, time.Second)
	m.ConditionalDecode(CondFellBack)
	m.ConditionalDecode(CondTransportError)
	m.EncodeFanout(2)
	m.MediaDownload(context.Background(), nil, time.Second)
}

func TestLLMDSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	recordAll(m)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "llm_d_coordinator_") {
			continue
		}
		var names []string
		if ms := mf.GetMetric(); len(ms) > 0 {
			for _, lp := range ms[0].GetLabel() {
				names = append(names, lp.GetName())
			}
		}
		sort.Strings(names)
		got[strings.TrimPrefix(mf.GetName(), "llm_d_coordinator_")+" "+mf.GetType().String()] = names
	}
	want := []struct {
		name, typ string
		labels    []string
	}{
		{"request_total", "COUNTER", []string{"model_name"}},
		{"request_error_total", "COUNTER", []string{"error_code", "model_name"}},
		{"request_duration_seconds", "HISTOGRAM", []string{"model_name"}},
		{"request_size_bytes", "HISTOGRAM", []string{"model_name"}},
		{"request_input_tokens", "HISTOGRAM", []string{"model_name"}},
		{"request_running", "GAUGE", []string{"model_name"}},
		{"step_duration_seconds", "HISTOGRAM", []string{"step"}},
		{"step_errors_total", "COUNTER", []string{"error_code", "step"}},
		{"step_running", "GAUGE", []string{"step"}},
		{"upstream_request_total", "COUNTER", []string{"upstream"}},
		{"upstream_request_duration_seconds", "HISTOGRAM", []string{"upstream"}},
		{"execution_path_total", "COUNTER", []string{"model_name", "path"}},
		{"conditional_decode_probes_total", "COUNTER", []string{"result"}},
		{"encode_subrequests", "HISTOGRAM", nil},
		{"orchestration_overhead_seconds", "HISTOGRAM", []string{"route"}},
		{"media_items", "HISTOGRAM", []string{"media_type"}},
		{"media_download_duration_seconds", "HISTOGRAM", []string{"result"}},
		{"response_size_bytes", "HISTOGRAM", []string{"stream"}},
	}
	for _, w := range want {
		t.Run(w.name, func(t *testing.T) {
			labels, ok := got[w.name+" "+w.typ]
			if !ok {
				t.Fatalf("no %s llm_d_coordinator_%s in %v", w.typ, w.name, got)
			}
			if fmt.Sprint(labels) != fmt.Sprint(w.labels) {
				t.Fatalf("labels %v, want %v", labels, w.labels)
			}
		})
	}
	if len(got) != len(want) {
		t.Fatalf("%d llm-d families, want %d: %v", len(got), len(want), got)
	}

	l := m.llmd
	for _, c := range []struct {
		name string
		c    prometheus.Collector
		want float64
	}{
		{"request_total", l.requests.WithLabelValues("m"), 2}, // admitted by the 200, so the 400 is m too
		{"request_error_total", l.requestErrors.WithLabelValues("m", ErrBadRequest), 1},
		{"request_running", l.running.WithLabelValues(LabelOther), 0},
		{"step_running", l.stepRunning.WithLabelValues("prefill"), 0},
		{"step_errors_total", l.stepErrors.WithLabelValues("prefill", ErrUpstream5xx), 1},
		{"upstream media-fetch", l.upstreamRequests.WithLabelValues("media-fetch"), 1},
		{"probe deferred", l.probes.WithLabelValues("deferred"), 1},
		{"probe transport_error", l.probes.WithLabelValues("transport_error"), 1},
		{"ours: transport error is error", m.conditionalDecode.WithLabelValues(CondError), 1},
		{"execution path", l.executionPath.WithLabelValues("m", PathPrefillDecode), 1},
	} {
		if got := testutil.ToFloat64(c.c); got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
	// Passthrough records only the coordinator_* series.
	m.StartRequest("passthrough").Done(RequestEnd{Status: 200})
	if n := testutil.CollectAndCount(l.requests); n != 1 {
		t.Fatalf("%d request_total series after a passthrough", n)
	}
}

// TestLLMDModelLabelBounded: hostile model names grow no llm-d series either.
func TestLLMDModelLabelBounded(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	for i := 0; i < 500; i++ {
		r := m.StartRequest("chat")
		name := fmt.Sprintf("junk-%d", i)
		r.Model(name)
		r.Done(RequestEnd{Model: name, Status: http.StatusNotFound, ErrorCode: ErrUpstream4xx, Ran: true, InputTokens: 3, Path: PathDecodeOnly})
	}
	r := m.StartRequest("chat")
	r.Model("\xff")
	r.Done(RequestEnd{Model: "\xff", Status: 400, ErrorCode: ErrBadRequest})
	for name, c := range map[string]prometheus.Collector{"request_total": m.llmd.requests, "request_error_total": m.llmd.requestErrors,
		"request_running": m.llmd.running, "request_input_tokens": m.llmd.inputTokens, "execution_path_total": m.llmd.executionPath} {
		if n := testutil.CollectAndCount(c); n > 2 {
			t.Errorf("%s: %d series", name, n)
		}
	}
}

func TestErrorCode(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
		want   string
	}{
		{nil, 200, ""},
		{nil, 202, ""},
		{nil, 404, ErrUpstream4xx}, // a worker's answer relayed as is
		{nil, 500, ErrUpstream5xx},
		{&apierror.UpstreamError{Phase: "decode"}, 502, ErrUpstreamTransport},
		{fmt.Errorf("prefill: %w", &apierror.UpstreamError{Phase: "prefill", Status: 429}), 429, ErrUpstream4xx},
		{&apierror.UpstreamError{Phase: "prefill", Status: 503}, 503, ErrUpstream5xx},
		{&apierror.UpstreamError{Phase: "render", Status: 200, Err: errors.New("bad answer")}, 502, ErrUpstream5xx},
		{apierror.InvalidField("messages", "bad"), 0, ErrBadRequest},
		{apierror.InvalidField("messages", "bad"), 400, ErrBadRequest},
		{errors.New("boom"), 500, ErrInternal},
		{errors.New("boom"), 0, ErrInternal},
		{fmt.Errorf("x: %w", context.Canceled), 499, ErrBadRequest},
	} {
		if got := ErrorCode(c.err, c.status); got != c.want {
			t.Errorf("ErrorCode(%v, %d) = %q, want %q", c.err, c.status, got, c.want)
		}
	}
}

func TestMediaDownloadResult(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	ctx, cancel := context.WithCancel(context.Background())
	m.MediaDownload(ctx, nil, time.Millisecond)
	m.MediaDownload(ctx, errors.New("404"), time.Millisecond)
	cancel()
	m.MediaDownload(ctx, errors.New("cancelled"), time.Millisecond)
	if n := testutil.CollectAndCount(m.llmd.mediaDownload); n != 3 {
		t.Fatalf("%d result series", n)
	}
	for _, r := range []string{MediaSuccess, MediaError, MediaCancelled} {
		if n := testutil.CollectAndCount(m.llmd.mediaDownload.WithLabelValues(r).(prometheus.Histogram)); n != 1 {
			t.Errorf("%s: %d", r, n)
		}
	}
}

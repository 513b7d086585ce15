package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/test/doubles/mediaserver"
	"github.com/epd-dev/coordinator/test/harness/stack"
)

const (
	clientTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientTrace   = "00-" + clientTraceID + "-00f067aa0ba902b7-01"
)

// startObserved runs the full multimodal pipeline with metrics, an in-memory span exporter and
// Server-Timing on.
func startObserved(t *testing.T, tracing bool) (*system, *prometheus.Registry, *tracetest.InMemoryExporter) {
	t.Helper()
	st, err := stack.Start(stack.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	doc := fmt.Sprintf("server: {server_timing: true}\ngateway: {address: %s}\npipeline:\n  kv_connector: kv-nixl\n  ec_connector: ec-nixl\n  steps:\n%s",
		st.Gateway.URL(), strings.ReplaceAll(fullPipeline, "{{render}}", st.Render.URL()))
	cfg, err := config.Parse([]byte(doc), nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	tel := observe.Telemetry{Metrics: observe.NewMetrics(reg)}
	exp := tracetest.NewInMemoryExporter()
	if tracing {
		tp := observe.NewTracerProviderWith(sdktrace.NewSimpleSpanProcessor(exp), "coordinator-test", 1)
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		tel.Tracer = tp.Tracer(observe.TracerName)
	}
	coord, err := stack.StartCoordinatorWith(cfg, stack.CoordinatorOptions{Overrides: stack.LoopbackMedia, Telemetry: tel})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coord.Close)
	s := &system{t: t, stack: st, coord: coord}
	s.client = clientFor(coord.URL())
	return s, reg, exp
}

func TestTracingSpansAndPropagation(t *testing.T) {
	s, _, exp := startObserved(t, true)
	media := startMedia(t)
	var resp *http.Response
	_, err := s.client.Chat.Completions.New(context.Background(), imageChat("trace me", 2, media.URL()+"/img/tr.png"),
		option.WithHeader("traceparent", clientTrace), option.WithHeader("X-Request-Id", "traced-1"), option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	names := map[string]int{}
	for _, sp := range spans {
		if sp.SpanContext.TraceID().String() != clientTraceID {
			t.Fatalf("span %q is not in the client's trace", sp.Name)
		}
		names[sp.Name]++
	}
	for _, want := range []string{"POST /v1/chat/completions", "step replace-media-urls", "step render", "step conditional-decode",
		"step encode", "step prefill", "step decode", "upstream render", "upstream conditional-decode", "upstream encode",
		"upstream prefill", "upstream decode"} {
		if names[want] != 1 {
			t.Fatalf("want one %q span, got %v", want, names)
		}
	}
	for _, sp := range spans {
		if sp.Name == "POST /v1/chat/completions" {
			if sp.Parent.SpanID().String() != "00f067aa0ba902b7" || !hasAttr(sp, "coordinator.request_id", "traced-1") {
				t.Fatalf("server span %+v", sp)
			}
		}
		if strings.HasPrefix(sp.Name, "upstream ") && !hasAttr(sp, "coordinator.phase", strings.TrimPrefix(sp.Name, "upstream ")) {
			t.Fatalf("upstream span without phase: %+v", sp.Attributes)
		}
	}
	// Every worker leg carried the trace, parented by its upstream span.
	for _, w := range append(s.stack.Workers(), s.stack.Render) {
		for _, r := range w.Requests() {
			if r.Method != http.MethodPost {
				continue // side-channel lookups between workers
			}
			tp := r.Header.Get("traceparent")
			if !strings.HasPrefix(tp, "00-"+clientTraceID+"-") || tp == clientTrace {
				t.Fatalf("%s got traceparent %q", w.Name(), tp)
			}
		}
	}
	if st := resp.Header.Get("Server-Timing"); !strings.Contains(st, "render;dur=") || !strings.Contains(st, "prefill;dur=") || !strings.Contains(st, "decode;dur=") {
		t.Fatalf("Server-Timing %q", st)
	}
}

func TestTraceContextForwardedWithTracingOff(t *testing.T) {
	s, _, exp := startObserved(t, false)
	if _, err := s.client.Chat.Completions.New(context.Background(), chatParams("untraced", 2), option.WithHeader("traceparent", clientTrace)); err != nil {
		t.Fatal(err)
	}
	if len(exp.GetSpans()) != 0 {
		t.Fatal("spans exported with tracing off")
	}
	for _, r := range s.stack.Decode[0].Requests() {
		if !strings.Contains(r.Header.Get("traceparent"), clientTraceID) {
			t.Fatalf("decode leg lost the client's trace: %q", r.Header.Get("traceparent"))
		}
	}
}

func hasAttr(sp tracetest.SpanStub, key, value string) bool {
	for _, a := range sp.Attributes {
		if string(a.Key) == key && a.Value.String() == value {
			return true
		}
	}
	return false
}

func TestMetrics(t *testing.T) {
	s, reg, _ := startObserved(t, false)
	ctx := context.Background()
	img := dataURL(mediaserver.PNG("m"))
	for i := 0; i < 2; i++ { // a miss, then a conditional-decode hit
		if _, err := s.client.Chat.Completions.New(ctx, imageChat("metric me", 2, img, img)); err != nil {
			t.Fatal(err)
		}
	}
	s.post("/v1/chat/completions", `{"messages":"nope"}`, nil) // a 400 before any step

	count := func(name string, labels ...string) float64 { t.Helper(); return metricCount(t, reg, name, labels...) }
	checks := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"coordinator_requests_total", []string{"route", "chat", "model", "sim-model", "status", "200"}, 2},
		{"coordinator_requests_total", []string{"route", "chat", "model", "unknown", "status", "400"}, 1},
		{"coordinator_request_duration_seconds", []string{"route", "chat"}, 3},
		{"coordinator_requests_in_flight", []string{"route", "chat"}, 0},
		{"coordinator_conditional_decode_total", []string{"outcome", "fell_back"}, 1},
		{"coordinator_conditional_decode_total", []string{"outcome", "served"}, 1},
		{"coordinator_encode_fanout", nil, 1},
		{"coordinator_step_duration_seconds", []string{"step", "encode", "outcome", "ok"}, 1},
		{"coordinator_step_duration_seconds", []string{"step", "conditional-decode", "outcome", "done"}, 1},
		{"coordinator_upstream_requests_total", []string{"phase", "encode", "status", "200"}, 2},
		{"coordinator_upstream_requests_total", []string{"phase", "conditional-decode", "status", "412"}, 1},
		{"coordinator_upstream_requests_total", []string{"phase", "conditional-decode", "status", "200"}, 1},
		{"coordinator_upstream_requests_total", []string{"phase", "render", "status", "200"}, 2},
		{"coordinator_upstream_duration_seconds", []string{"phase", "decode", "status", "200"}, 1},
		{"coordinator_request_size_bytes", []string{"route", "chat"}, 3},
		{"coordinator_response_size_bytes", []string{"route", "chat"}, 3},
		{"llm_d_coordinator_execution_path_total", []string{"path", "encode-prefill-decode"}, 1},
		{"llm_d_coordinator_execution_path_total", []string{"path", "decode-only"}, 1},
		{"llm_d_coordinator_upstream_request_total", []string{"upstream", "encode"}, 2},
		{"llm_d_coordinator_encode_subrequests", nil, 1},
		{"llm_d_coordinator_media_items", []string{"media_type", "image"}, 2},
	}
	for _, c := range checks {
		if got := count(c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "go_goroutines", "process_resident_memory_bytes"); err != nil || n != 2 {
		t.Errorf("runtime collectors: %d %v", n, err)
	}
}

// metricCount sums the values (histograms: the sample counts) of name's series with labels (name, value pairs).
func metricCount(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		total := 0.0
		for _, m := range mf.GetMetric() {
			match := true
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				match = match && found
			}
			if !match {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				total += m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				total += float64(m.GetHistogram().GetSampleCount())
			case m.GetGauge() != nil:
				total += m.GetGauge().GetValue()
			}
		}
		return total
	}
	return 0
}

// TestLLMDMetrics: the llm-d-compatible series beside ours. A text request runs prefill+decode
// (the conditional-decode probe is deferred: 412); the same again is a conditional-decode hit.
func TestLLMDMetrics(t *testing.T) {
	s, reg, _ := startObserved(t, false)
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if _, err := s.client.Chat.Completions.New(ctx, chatParams("llm-d metrics", 2)); err != nil {
			t.Fatal(err)
		}
	}
	s.post("/v1/chat/completions", `{"model":"sim-model","messages":"nope"}`, nil) // a 400 before any step
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"llm_d_coordinator_execution_path_total", []string{"model_name", "sim-model", "path", "prefill-decode"}, 1},
		{"llm_d_coordinator_execution_path_total", []string{"model_name", "sim-model", "path", "decode-only"}, 1},
		{"llm_d_coordinator_upstream_request_total", []string{"upstream", "prefill"}, 1},
		{"llm_d_coordinator_upstream_request_total", []string{"upstream", "conditional-decode"}, 2},
		{"llm_d_coordinator_upstream_request_total", []string{"upstream", "decode"}, 1},
		{"llm_d_coordinator_upstream_request_duration_seconds", []string{"upstream", "render"}, 2},
		{"llm_d_coordinator_conditional_decode_probes_total", []string{"result", "deferred"}, 1},
		{"llm_d_coordinator_conditional_decode_probes_total", []string{"result", "served"}, 1},
		{"llm_d_coordinator_request_total", []string{"model_name", "sim-model"}, 2},
		{"llm_d_coordinator_request_total", []string{"model_name", "unknown"}, 1}, // a body that does not parse has no model
		{"llm_d_coordinator_request_error_total", []string{"model_name", "unknown", "error_code", "bad_request"}, 1},
		{"llm_d_coordinator_request_error_total", []string{"model_name", "sim-model"}, 0},
		{"llm_d_coordinator_request_running", nil, 0},
		{"llm_d_coordinator_request_input_tokens", []string{"model_name", "sim-model"}, 2},
		{"llm_d_coordinator_step_duration_seconds", []string{"step", "prefill"}, 1},
		{"llm_d_coordinator_step_running", nil, 0},
		{"llm_d_coordinator_orchestration_overhead_seconds", []string{"route", "chat-completions"}, 2},
		{"llm_d_coordinator_response_size_bytes", []string{"stream", "false"}, 3},
		{"llm_d_coordinator_media_items", []string{"media_type", "image"}, 2},
	} {
		if got := metricCount(t, reg, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

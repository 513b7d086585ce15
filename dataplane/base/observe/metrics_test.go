package observe

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

func TestModelLabelIsCapped(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	for i := 0; i < MaxModels+50; i++ {
		m.RequestStarted("chat")(fmt.Sprintf("model-%d", i), 200, 10, 10)
	}
	m.RequestStarted("chat")("model-3", 200, 1, 1) // admitted earlier: keeps its label
	m.RequestStarted("chat")("model-3", 404, 1, 1) // an admitted model keeps its label whatever the status
	m.RequestStarted("chat")("", 200, 1, 1)
	if n := testutil.CollectAndCount(m.requests); n != MaxModels+3 { // 1000 models (model-3 twice) + other + unknown
		t.Fatalf("%d series", n)
	}
	if len(m.models.seen) != MaxModels {
		t.Fatalf("%d models admitted", len(m.models.seen))
	}
	if v := testutil.ToFloat64(m.requests.WithLabelValues("chat", "other", "200")); v != 50 {
		t.Fatalf("other = %v", v)
	}
	if v := testutil.ToFloat64(m.requests.WithLabelValues("chat", "model-3", "200")); v != 2 {
		t.Fatalf("model-3 = %v", v)
	}
}

// TestNilMetricsRecordNothing: a Telemetry without metrics (tests, the operator's validation
// builds) is safe to call and records nowhere, not even in the process-wide default registry.
func TestNilMetricsRecordNothing(t *testing.T) {
	coordinatorSeries := func() int {
		mfs, err := prometheus.DefaultGatherer.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, mf := range mfs {
			if strings.HasPrefix(mf.GetName(), "coordinator_") || strings.HasPrefix(mf.GetName(), "llm_d_") {
				n += len(mf.GetMetric())
			}
		}
		return n
	}
	before := coordinatorSeries()
	var m *Metrics
	m.RequestStarted("chat")("m", 200, 1, 1)
	m.Step("decode", "ok", time.Millisecond)
	m.Upstream("decode", 0, time.Millisecond)
	m.ConditionalDecode(CondServed)
	m.EncodeFanout(2)
	m.Reload(true, "r")
	m.Loaded("r")
	r := m.StartRequest("chat")
	r.Model("m")
	r.Done(RequestEnd{Model: "m", Status: 200, Ran: true})
	m.StepStarted("decode")("ok", time.Millisecond, nil)
	m.MediaDownload(context.Background(), nil, time.Millisecond)
	m.PipelineRequest("stable", "r", OutcomeSuccess)
	if after := coordinatorSeries(); after != before {
		t.Fatalf("nil metrics recorded %d series in the default registry", after-before)
	}
}

func TestReloadAndInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.Loaded("a")
	m.Reload(true, "b")
	m.Reload(false, "b")
	want := `
# HELP coordinator_config_info 1 for the loaded configuration revision.
# TYPE coordinator_config_info gauge
coordinator_config_info{revision="b"} 1
# HELP coordinator_config_reloads_total Configuration reload attempts by result (success, failure).
# TYPE coordinator_config_reloads_total counter
coordinator_config_reloads_total{result="failure"} 1
coordinator_config_reloads_total{result="success"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "coordinator_config_info", "coordinator_config_reloads_total"); err != nil {
		t.Fatal(err)
	}
	m.Upstream("prefill", 0, time.Second)
	if v := testutil.ToFloat64(m.upstreamRequests.WithLabelValues("prefill", "error")); v != 1 {
		t.Fatalf("transport errors are labelled error: %v", v)
	}
}

// The pipeline series are bounded by the revisions loaded at once: a reload drops the series
// of revisions it no longer serves, a promoted canary keeps its own, a loaded pipeline's series
// exist at zero, and a request finishing on an unloaded revision leaves none behind.
func TestPipelineSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.Loaded("cfg-1", PipelineTrack{Track: "stable", Revision: "s1", WeightPercent: 95}, PipelineTrack{Track: "canary", Revision: "c1", WeightPercent: 5})
	m.PipelineRequest("stable", "s1", OutcomeSuccess)
	m.PipelineRequest("canary", "c1", OutcomeError)
	m.PipelineRequest("canary", "c1", PipelineOutcome(200, false))
	m.Hold(PipelineTrack{Track: "stable", Revision: "n1"}) // built, not yet swapped in: counted already
	m.PipelineRequest("stable", "n1", OutcomeSuccess)
	if got := testutil.ToFloat64(m.pipelineRequests.WithLabelValues("stable", "n1", OutcomeSuccess)); got != 1 {
		t.Fatalf("a held revision's request was not counted: %v", got)
	}
	m.Reload(true, "cfg-2", PipelineTrack{Track: "stable", Revision: "c1", WeightPercent: 100}) // promotion
	m.PipelineRequest("stable", "s1", OutcomeSuccess)                                           // in flight on the old pipeline
	m.PipelineRequest("stable", "c1", PipelineOutcome(404, false))
	want := `
# HELP coordinator_pipeline_requests_total Requests run by pipeline track (stable, canary), pipeline revision and outcome (success; client_error: 4xx; error: 5xx or a response cut off). The series of revisions no longer loaded are removed.
# TYPE coordinator_pipeline_requests_total counter
coordinator_pipeline_requests_total{outcome="client_error",revision="c1",track="canary"} 0
coordinator_pipeline_requests_total{outcome="client_error",revision="c1",track="stable"} 1
coordinator_pipeline_requests_total{outcome="error",revision="c1",track="canary"} 1
coordinator_pipeline_requests_total{outcome="error",revision="c1",track="stable"} 0
coordinator_pipeline_requests_total{outcome="success",revision="c1",track="canary"} 1
coordinator_pipeline_requests_total{outcome="success",revision="c1",track="stable"} 0
# HELP coordinator_pipeline_weight_percent The share of requests each loaded pipeline serves, by track and pipeline revision.
# TYPE coordinator_pipeline_weight_percent gauge
coordinator_pipeline_weight_percent{revision="c1",track="stable"} 100
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "coordinator_pipeline_requests_total", "coordinator_pipeline_weight_percent"); err != nil {
		t.Fatal(err)
	}
	for status, want := range map[int]string{200: OutcomeSuccess, 302: OutcomeSuccess, 400: OutcomeClientError, 499: OutcomeClientError, 500: OutcomeError, 503: OutcomeError} {
		if got := PipelineOutcome(status, false); got != want {
			t.Errorf("status %d: %s, want %s", status, got, want)
		}
	}
	if PipelineOutcome(200, true) != OutcomeError {
		t.Error("a cut response is an error")
	}
}

// TestModelLabel: what becomes of a request's model, by its name and how the request ended.
func TestModelLabel(t *testing.T) {
	long := strings.Repeat("m", MaxLabelLen)
	for _, tc := range []struct {
		name   string
		model  string
		status int
		want   string
	}{
		{"served", "meta-llama/Llama-3.1-8B-Instruct", 200, "meta-llama/Llama-3.1-8B-Instruct"},
		{"served, non-ASCII", "qwen/通义千问 7B", 200, "qwen/通义千问 7B"},
		{"served, a literal U+FFFD", "m\uFFFD", 200, "m\uFFFD"},
		{"served, MaxLabelLen bytes", long, 200, long},
		{"empty", "", 200, LabelUnknown},
		{"empty, failed", "", 400, LabelUnknown},
		{"model not found at the worker", "no-such-model", 404, LabelOther},
		{"bad request", "typo-model", 400, LabelOther},
		{"worker error", "flaky-model", 502, LabelOther},
		{"rate limited", "busy-model", 429, LabelOther},
		{"queued by the async broker", "queued-model", 202, LabelOther},
		{"no status", "cut-model", 0, LabelOther},
		{"invalid UTF-8", "model-\xff\xfe", 200, LabelInvalid},
		{"truncated rune", "model-\xe4\xb8", 200, LabelInvalid},
		{"one byte too long", long + "m", 200, LabelInvalid},
		{"1 MiB", strings.Repeat("x", 1<<20), 200, LabelInvalid},
		{"newline", "model\nfake_metric 1", 200, LabelInvalid},
		{"NUL", "model\x00", 200, LabelInvalid},
		{"DEL", "model\x7f", 200, LabelInvalid},
		{"C1 control", "model\u0085", 200, LabelInvalid},
		{"zero-width space (format)", "model\u200b", 200, LabelInvalid},
		{"bidi override", "model\u202e", 200, LabelInvalid},
		{"private use", "model\ue000", 200, LabelInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			m := NewMetrics(reg)
			m.RequestStarted("chat")(tc.model, tc.status, 1, 1) // must not panic
			if v := testutil.ToFloat64(m.requests.WithLabelValues("chat", tc.want, fmt.Sprint(tc.status))); v != 1 {
				t.Fatalf("requests_total{model=%.40q} = %v, want 1", tc.want, v)
			}
			if n := testutil.CollectAndCount(m.requests); n != 1 {
				t.Fatalf("%d series", n)
			}
			if _, err := reg.Gather(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestJunkModelsNeverAdmitted: distinct names that never succeed use up nothing: a real model
// served after 10,000 of them still gets its own label.
func TestJunkModelsNeverAdmitted(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	statuses := []int{400, 404, 422, 429, 500, 502, 503, 202}
	for i := 0; i < 10_000; i++ {
		m.RequestStarted("chat")(fmt.Sprintf("junk-%d", i), statuses[i%len(statuses)], 1, 1)
	}
	if len(m.models.seen) != 0 {
		t.Fatalf("%d junk models admitted", len(m.models.seen))
	}
	m.RequestStarted("chat")("real-model", 200, 1, 1)
	if v := testutil.ToFloat64(m.requests.WithLabelValues("chat", "real-model", "200")); v != 1 {
		t.Fatalf("real-model = %v", v)
	}
	// The real model's failures are counted under its name too, once admitted.
	m.RequestStarted("chat")("real-model", 503, 1, 1)
	if v := testutil.ToFloat64(m.requests.WithLabelValues("chat", "real-model", "503")); v != 1 {
		t.Fatalf("real-model 503 = %v", v)
	}
	if n := testutil.CollectAndCount(m.requests); n != len(statuses)+2 { // other × statuses + real-model × 2
		t.Fatalf("%d series", n)
	}
}

// TestExpositionBounded: /metrics stays small whatever names clients send.
func TestExpositionBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.RequestStarted("chat")("real-model", 200, 1, 1)
	before := exposition(t, reg)
	junk := []func(i int) string{
		func(i int) string { return fmt.Sprintf("junk-%d", i) },
		func(i int) string { return fmt.Sprintf("%d-%s", i, strings.Repeat("j", 1<<10)) },
		func(i int) string { return fmt.Sprintf("bad-\xff-%d", i) },
		func(i int) string { return fmt.Sprintf("ctl-\n-%d", i) },
	}
	for i := 0; i < 10_000; i++ {
		status := 404
		if i%2 == 0 {
			status = 200 // a served junk name is still not admitted when it is not well formed...
		}
		name := junk[i%len(junk)](i)
		if i%len(junk) == 0 {
			status = 400 // ...and a well-formed one only once served
		}
		m.RequestStarted("chat")(name, status, 1, 1)
	}
	after := exposition(t, reg)
	if len(m.models.seen) != 1 {
		t.Fatalf("%d models admitted", len(m.models.seen))
	}
	// A few new series (other and invalid, by status): a few KB, not 10,000 × a name.
	t.Logf("/metrics: %d bytes, %d after 10,000 junk requests", len(before), len(after))
	if grown := len(after) - len(before); grown > 16<<10 {
		t.Fatalf("/metrics grew by %d bytes after 10,000 junk requests", grown)
	}
}

// exposition is GET /metrics.
func exposition(t *testing.T, g prometheus.Gatherer) string {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}).
		ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

// TestHugeModelsNotKept: requests with 4 MiB model names leave nothing behind once they are done.
func TestHugeModelsNotKept(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	for i := 0; i < 50; i++ {
		name := fmt.Sprintf("%d%s", i, strings.Repeat("m", 4<<20))
		m.RequestStarted("chat")(name, http.StatusOK, 1, 1)
		_ = ModelAttr(name) // what the server span keeps
	}
	if after := heap(); after > before+32<<20 {
		t.Fatalf("heap grew by %d MiB after 50 requests with 4 MiB model names", (after-before)>>20)
	}
}

// TestLabelsNeverPanic: every recorder takes any string.
func TestLabelsNeverPanic(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	for _, s := range []string{"\xff", "a\x00b", strings.Repeat("s", 1<<16), ""} {
		m.RequestStarted(s)(s, 200, 1, 1)
		m.Step(s, s, time.Millisecond)
		m.Upstream(s, 200, time.Millisecond)
		m.ConditionalDecode(s)
		m.Reload(true, s)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
}

func TestShortModel(t *testing.T) {
	long := strings.Repeat("m", MaxLabelLen)
	wide := strings.Repeat("é", MaxLabelLen) // 2 bytes each
	for _, tc := range []struct {
		name, in, want string
	}{
		{"short", "llama", "llama"},
		{"empty", "", ""},
		{"MaxLabelLen", long, long},
		{"long", long + "tail", long},
		{"4 MiB", long + strings.Repeat("x", 4<<20), long},
		{"cut on a rune boundary", "m" + wide, "m" + wide[:MaxLabelLen-2]},
		{"invalid UTF-8", "a\xffb", "a\uFFFDb"},
		{"control characters kept (escaped by exporters)", "a\nb", "a\nb"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ShortModel(tc.in)
			if got != tc.want {
				t.Fatalf("ShortModel = %.60q, want %.60q", got, tc.want)
			}
			if len(got) > MaxLabelLen || !utf8.ValidString(got) {
				t.Fatalf("ShortModel = %q: too long or not UTF-8", got)
			}
			if kv := ModelAttr(tc.in); kv.Key != AttrModel || kv.Value.AsString() != tc.want {
				t.Fatalf("ModelAttr = %v", kv)
			}
		})
	}
}

// FuzzModelLabel: any model and status give a valid label (the Prometheus client panics on an
// invalid one) and a short valid span attribute.
func FuzzModelLabel(f *testing.F) {
	f.Add("llama", 200)
	f.Add("\xff", 200)
	f.Add("a\u200bb", 404)
	f.Add(strings.Repeat("é", 100), 200)
	m := NewMetrics(prometheus.NewRegistry())
	f.Fuzz(func(t *testing.T, model string, status int) {
		l := m.models.label(model, status)
		if !ValidLabel(l) {
			t.Fatalf("label %q is not valid", l)
		}
		if l != model && l != LabelOther && l != LabelInvalid && l != LabelUnknown {
			t.Fatalf("label %q for model %q", l, model)
		}
		m.RequestStarted("chat")(model, status, 0, 0)
		if s := ShortModel(model); len(s) > MaxLabelLen || !utf8.ValidString(s) || (len(model) <= MaxLabelLen && utf8.ValidString(model) && s != model) {
			t.Fatalf("ShortModel(%q) = %q", model, s)
		}
	})
}

// The answer metrics: time to first token and the prefill gap of 2xx answers only, tokens from
// the usage under the served model's bounded label, and the inter-token clock (a write of n
// events shares its gap; the first event of a stream has none).
func TestAnswerMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	r := m.StartRequest("chat")
	r.Model("m")
	r.Events(3) // the first write: two more events with no gap
	r.Events(2) // the second: two events sharing the gap since the first write
	r.Done(RequestEnd{Model: "m", Status: 200, Ran: true, FirstByte: 250 * time.Millisecond, PrefillToFirstByte: 40 * time.Millisecond,
		HasUsage: true, PromptTokens: 7, CompletionTokens: 5, CachedTokens: 4, TargetModel: "m-lora"})
	failed := m.StartRequest("chat")
	failed.Done(RequestEnd{Model: "m", Status: 503, FirstByte: time.Millisecond, HasUsage: true, PromptTokens: 100})
	junk := m.StartRequest("completions")
	junk.Done(RequestEnd{Model: "m", Status: 200, FirstByte: time.Millisecond, HasUsage: true, CompletionTokens: 1, TargetModel: "bad\x00name"})

	if got := testutil.ToFloat64(m.tokens.WithLabelValues("chat", "m", "m-lora", TokensPrompt)); got != 7 {
		t.Errorf("prompt tokens %v", got)
	}
	if got := testutil.ToFloat64(m.tokens.WithLabelValues("chat", "m", "m-lora", TokensCached)); got != 4 {
		t.Errorf("cached tokens %v", got)
	}
	if got := testutil.ToFloat64(m.tokens.WithLabelValues("completions", "m", LabelInvalid, TokensCompletion)); got != 1 {
		t.Errorf("a worker's malformed model must be labelled invalid: %v", got)
	}
	if n := testutil.CollectAndCount(m.tokens); n != 6 {
		t.Errorf("%d token series: the 503's usage must not count", n)
	}
	if n := testutil.CollectAndCount(m.timeToFirstToken); n != 2 {
		t.Errorf("%d time-to-first-token series, want chat and completions (not the 503)", n)
	}
	h := func(c prometheus.Collector) (uint64, float64) {
		ch := make(chan prometheus.Metric, 4)
		c.Collect(ch)
		close(ch)
		var n uint64
		var sum float64
		for metric := range ch {
			var d dto.Metric
			_ = metric.Write(&d)
			n += d.GetHistogram().GetSampleCount()
			sum += d.GetHistogram().GetSampleSum()
		}
		return n, sum
	}
	if n, _ := h(m.interTokenLatency); n != 4 {
		t.Errorf("%d inter-token samples, want 4 (2 of the first write, 2 of the second)", n)
	}
	if n, sum := h(m.prefillToFirst); n != 1 || sum != 0.04 {
		t.Errorf("prefill to first token: %d samples, %v", n, sum)
	}
	var chat dto.Metric
	_ = m.timeToFirstToken.WithLabelValues("chat", "m").(prometheus.Metric).Write(&chat)
	if got := chat.GetHistogram(); got.GetSampleCount() != 1 || got.GetSampleSum() != 0.25 {
		t.Errorf("chat's time to first token: %d samples, %v; want the one 2xx answer's 0.25s", got.GetSampleCount(), got.GetSampleSum())
	}
}

// Tenant labels come from a client header, so they are bounded like model names: a value is a
// label only once a request carrying it ended with a 2xx, at most MaxTenants of them; the
// rest count as other, a malformed one as invalid, an absent one as unknown.
func TestTenantLabel(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	done := func(tenant string, status int) {
		m.StartRequest("chat").Done(RequestEnd{Model: "m", Status: status, Tenanted: true, Tenant: tenant, FirstByte: time.Millisecond,
			HasUsage: status == 200, PromptTokens: 3, CompletionTokens: 2})
	}
	done("team-a", 200)
	done("team-a", 503)
	done("never-served", 400)
	done("bad\x00", 200)
	done("", 200)
	for i := range MaxTenants + 50 { // a client inventing tenants: the cap holds
		done(fmt.Sprintf("flood-%d", i), 200)
	}
	m.StartRequest("chat").Done(RequestEnd{Model: "m", Status: 200}) // the header not configured: no tenant series
	count := func(tenant, outcome string) float64 {
		return testutil.ToFloat64(m.tenantRequests.WithLabelValues(tenant, "chat", outcome))
	}
	if count("team-a", OutcomeSuccess) != 1 || count("team-a", OutcomeError) != 1 {
		t.Error("team-a's requests")
	}
	if count(LabelOther, OutcomeClientError) != 1 {
		t.Error("a tenant that was never served is other")
	}
	if count(LabelInvalid, OutcomeSuccess) != 1 || count(LabelUnknown, OutcomeSuccess) != 1 {
		t.Error("malformed and absent tenants")
	}
	// team-a took one of the MaxTenants places: MaxTenants-1 floods got one, 51 are other.
	if got := count(LabelOther, OutcomeSuccess); got != 51 {
		t.Errorf("%v floods counted as other, want 51", got)
	}
	if n := len(m.tenants.seen); n != MaxTenants {
		t.Errorf("%d tenant labels held, want the cap %d", n, MaxTenants)
	}
	if got := testutil.ToFloat64(m.tenantTokens.WithLabelValues("team-a", TokensCompletion)); got != 2 {
		t.Errorf("team-a's completion tokens %v, want 2 (the 503's usage does not count)", got)
	}
}

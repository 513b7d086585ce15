// Package observe is the coordinator's telemetry: Prometheus metrics (where each request's time
// went, per step and per upstream leg) and OpenTelemetry tracing (a span per request, step and
// leg, W3C trace context on every leg). A nil *Metrics records nothing, so tests and embedders
// can leave it out.
package observe

import (
	"cmp"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/attribute"
)

// Namespace prefixes every data-plane metric.
const Namespace = "coordinator"

// The model label is the one label whose value comes from a client (the request's "model"), so
// it is bounded three ways (see modelCap):
//
//   - a name longer than MaxLabelLen bytes, not valid UTF-8, or holding a control or other
//     non-graphic character is never a label: it is counted as LabelInvalid;
//   - a well-formed name becomes a label only once a worker confirmed it, i.e. a request for it
//     ended with a 2xx status other than 202 (a 202 is the async broker queueing it, unseen by a
//     worker). A 400, a worker's 404 "model not found" or any other failure does not admit it, so
//     junk names can neither grow the series nor use up the cap before the real models;
//   - at most MaxModels names are admitted per process (admitted names stay admitted); names not
//     admitted are counted as LabelOther, and an empty model as LabelUnknown.
//
// The series of requests_total and request_duration_seconds are thus at most
// (MaxModels+3) × routes × statuses whatever clients send, and the label values held are at most
// MaxModels × MaxLabelLen bytes.
const (
	// MaxModels caps the distinct admitted values of the model label.
	MaxModels = 1000
	// MaxTenants caps the distinct admitted values of the tenant label (server.metrics_tenant_header):
	// a value becomes a label once a request carrying it ended with a 2xx, as a model does.
	MaxTenants = 1000
	// MaxLabelLen is the longest label value, in bytes, taken from a client or a worker.
	MaxLabelLen = 128

	// LabelOther counts well-formed models not admitted (never confirmed, or past MaxModels).
	LabelOther = "other"
	// LabelInvalid replaces a client or worker value that is not a ValidLabel.
	LabelInvalid = "invalid"
	// LabelUnknown counts requests without a model.
	LabelUnknown = "unknown"
)

// LatencyBuckets suit LLM work: 5 ms (a cache hit) to an hour (a long generation).
var LatencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600}

// TokenLatencyBuckets suit the gap between two streamed tokens: 1 ms to 10 s.
var TokenLatencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5, 5, 10}

// Token kinds of coordinator_tokens_total.
const (
	TokensPrompt     = "prompt"
	TokensCompletion = "completion"
	TokensCached     = "cached"
)

// SizeBuckets are powers of four from 256 B to 256 MiB.
var SizeBuckets = prometheus.ExponentialBuckets(256, 4, 11)

// Conditional-decode outcomes.
const (
	CondServed   = "served"
	CondFellBack = "fell_back"
	CondError    = "error"
)

// Metrics holds the data plane's collectors.
type Metrics struct {
	requests          *prometheus.CounterVec
	requestDuration   *prometheus.HistogramVec
	inFlight          *prometheus.GaugeVec
	requestBytes      *prometheus.HistogramVec
	responseBytes     *prometheus.HistogramVec
	stepDuration      *prometheus.HistogramVec
	upstreamDuration  *prometheus.HistogramVec
	upstreamRequests  *prometheus.CounterVec
	conditionalDecode *prometheus.CounterVec
	retries           *prometheus.CounterVec
	budgetExhausted   *prometheus.CounterVec
	resumes           *prometheus.CounterVec
	degraded          *prometheus.CounterVec
	encodeFanout      prometheus.Histogram
	mediaItems        *prometheus.CounterVec
	reloads           *prometheus.CounterVec
	configInfo        *prometheus.GaugeVec
	pipelineRequests  *prometheus.CounterVec
	pipelineWeight    *prometheus.GaugeVec
	timeToFirstToken  *prometheus.HistogramVec
	interTokenLatency *prometheus.HistogramVec
	prefillToFirst    *prometheus.HistogramVec
	tokens            *prometheus.CounterVec
	tenantRequests    *prometheus.CounterVec
	tenantTokens      *prometheus.CounterVec
	pdRequests        *prometheus.CounterVec
	legsInFlight      *prometheus.GaugeVec
	firstByte         *prometheus.HistogramVec
	// held are the pipeline revisions loaded (Loaded), whose series are kept.
	heldMu sync.RWMutex
	held   map[string]bool

	// llmd are upstream llm-d's series (llmd.go), recorded by the same hooks.
	llmd *llmdMetrics

	models modelCap
	// targets bounds the target_model_name label (the served model, from workers) as models
	// bounds model; tenants the tenant label (from a client header) at MaxTenants.
	targets, tenants modelCap
}

// NewMetrics creates the collectors and registers them (plus the Go and process collectors) on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "requests_total",
			Help: "Requests served, by route, model and HTTP status."}, []string{"route", "model", "status"}),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "request_duration_seconds",
			Help: "Time from receiving a request to the end of its response, by route and model.", Buckets: LatencyBuckets}, []string{"route", "model"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "requests_in_flight",
			Help: "Requests being served, by route."}, []string{"route"}),
		requestBytes: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "request_size_bytes",
			Help: "Request body sizes, by route.", Buckets: SizeBuckets}, []string{"route"}),
		responseBytes: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "response_size_bytes",
			Help: "Response body sizes written to clients, by route.", Buckets: SizeBuckets}, []string{"route"}),
		stepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "step_duration_seconds",
			Help: "Pipeline step durations, by step and outcome (ok, done, error).", Buckets: LatencyBuckets}, []string{"step", "outcome"}),
		upstreamDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "upstream_duration_seconds",
			Help: "Outbound calls from request to the end of the response body, by phase and status.", Buckets: LatencyBuckets}, []string{"phase", "status"}),
		upstreamRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "upstream_requests_total",
			Help: "Outbound calls by phase (render, media, encode, prefill, decode, conditional-decode, passthrough) and status (HTTP code, or error)."}, []string{"phase", "status"}),
		conditionalDecode: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "conditional_decode_total",
			Help: "Conditional-decode outcomes: served by decode alone, fell back to the full pipeline (412), or error."}, []string{"outcome"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "upstream_retries_total",
			Help: "Legs tried again on another pick, by phase and the reason the attempt failed (connect, reset, timeout, idle_timeout, 429, 502, 503, 504). Attempts are upstream_requests_total."}, []string{"phase", "reason"}),
		budgetExhausted: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "retry_budget_exhausted_total",
			Help: "Retries not made because the process's retry budget was spent, by phase."}, []string{"phase"}),
		resumes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "stream_resumes_total",
			Help: "Decode streams that broke off after the client got tokens, by outcome: resumed on another decode pick, or failed (the client got an error event; reason: not_resumable, exhausted, failed)."}, []string{"outcome"}),
		degraded: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "degraded_requests_total",
			Help: "Requests whose encode or prefill pool could not serve them after retries, by phase and policy outcome (aggregated: served by decode alone; failed: answered 503)."}, []string{"phase", "outcome"}),
		encodeFanout: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: "encode_fanout",
			Help: "Encode legs per request (media items).", Buckets: []float64{1, 2, 3, 4, 6, 8, 12, 16, 32, 64}}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "config_reloads_total",
			Help: "Configuration reload attempts by result (success, failure)."}, []string{"result"}),
		configInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "config_info",
			Help: "1 for the loaded configuration revision."}, []string{"revision"}),
		pipelineRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "pipeline_requests_total",
			Help: "Requests run by pipeline track (stable, canary), pipeline revision and outcome (success; client_error: 4xx; error: 5xx or a response cut off). The series of revisions no longer loaded are removed."},
			[]string{"track", "revision", "outcome"}),
		pipelineWeight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "pipeline_weight_percent",
			Help: "The share of requests each loaded pipeline serves, by track and pipeline revision."}, []string{"track", "revision"}),
		timeToFirstToken: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "time_to_first_token_seconds",
			Help: "Time from receiving a request to the first byte of its answer sent to the client (2xx answers), by route and model.", Buckets: LatencyBuckets},
			[]string{"route", "model"}),
		interTokenLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "inter_token_latency_seconds",
			Help: "Time between two token events of a stream relayed to the client (events written together share the gap), by route and model.", Buckets: TokenLatencyBuckets},
			[]string{"route", "model"}),
		prefillToFirst: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "prefill_to_first_token_seconds",
			Help: "Time from the prefill leg's answer to the first byte of the answer sent to the client: what the KV transfer and the decode start cost, by route.", Buckets: LatencyBuckets},
			[]string{"route"}),
		tenantRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "tenant_requests_total",
			Help: "Requests by tenant (the server.metrics_tenant_header value, bounded like model), route and outcome (success, client_error, error). Only with the header configured."},
			[]string{"tenant", "route", "outcome"}),
		tenantTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "tenant_tokens_total",
			Help: "Tokens of served answers by tenant and kind (prompt, completion, cached). Only with server.metrics_tenant_header configured."},
			[]string{"tenant", "kind"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "tokens_total",
			Help: "Tokens of served answers as their usage reports them, by route, requested model, served model (target_model_name) and kind (prompt, completion, cached: prompt tokens served from the prefix cache)."},
			[]string{"route", "model", "target_model_name", "kind"}),
	}
	m.pdRequests, m.legsInFlight, m.firstByte = newPDRequests(), newLegsInFlight(), newFirstByte()
	m.models.seen = map[string]string{}
	m.targets.seen = map[string]string{}
	m.tenants.seen, m.tenants.max = map[string]string{}, MaxTenants
	m.mediaItems = newMediaItems()
	m.llmd = newLLMD()
	reg.MustRegister(m.llmd.collectors()...)
	reg.MustRegister(m.requests, m.requestDuration, m.inFlight, m.requestBytes, m.responseBytes, m.stepDuration,
		m.upstreamDuration, m.upstreamRequests, m.conditionalDecode, m.retries, m.budgetExhausted, m.resumes, m.degraded, m.encodeFanout, m.reloads, m.configInfo,
		m.pipelineRequests, m.pipelineWeight, m.timeToFirstToken, m.interTokenLatency, m.prefillToFirst, m.tokens, m.tenantRequests, m.tenantTokens, m.pdRequests, m.legsInFlight, m.firstByte, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), m.mediaItems)
	return m
}

// ValidLabel reports whether s may be a label value as is: at most MaxLabelLen bytes of valid
// UTF-8 with only graphic characters (letters, marks, numbers, punctuation, symbols and spaces;
// no control, format or private-use characters).
func ValidLabel(s string) bool {
	if len(s) > MaxLabelLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f {
			return false
		} else if c >= utf8.RuneSelf {
			return validLabelRunes(s[i:])
		}
	}
	return true
}

func validLabelRunes(s string) bool {
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		if r == utf8.RuneError && n == 1 || !unicode.IsGraphic(r) { // invalid UTF-8, or not graphic
			return false
		}
		s = s[n:]
	}
	return true
}

// LabelValue is s if it is a ValidLabel and LabelInvalid otherwise: the sanitiser for every label
// whose value can come from a client or a worker, so that no value makes WithLabelValues panic
// (it does on invalid UTF-8) or bloats the exposition.
func LabelValue(s string) string {
	if ValidLabel(s) {
		return s
	}
	return LabelInvalid
}

// ShortModel is model cut to MaxLabelLen bytes of valid UTF-8 (invalid bytes replaced by U+FFFD),
// for span attributes and logs: unlike the metric label it keeps the start of an odd name, but
// never the rest of a huge one. A cut name is a copy, so it does not pin the request's memory.
func ShortModel(model string) string {
	if len(model) <= MaxLabelLen && utf8.ValidString(model) {
		return model
	}
	if len(model) > 4*MaxLabelLen {
		model = model[:4*MaxLabelLen] // only MaxLabelLen bytes are kept: convert no more than needed
	}
	model = strings.ToValidUTF8(model, "\uFFFD")
	if len(model) > MaxLabelLen {
		n := MaxLabelLen
		for n > 0 && !utf8.RuneStart(model[n]) {
			n--
		}
		model = model[:n]
	}
	return strings.Clone(model)
}

// ModelAttr is the gen_ai.request.model span attribute of a client's model: ShortModel(model).
func ModelAttr(model string) attribute.KeyValue {
	return AttrModel.String(ShortModel(model))
}

// modelCap admits up to MaxModels distinct model names, each once a worker confirmed it (see
// MaxModels); admitted names stay admitted.
type modelCap struct {
	// max is the cap (MaxModels when 0).
	max int
	mu  sync.RWMutex
	// seen maps an admitted name to its own copy, the label value handed to the collectors (so
	// that a series never pins the memory of the request that created it).
	seen map[string]string
}

// label is the model label of a request for model that ended with status.
func (c *modelCap) label(model string, status int) string {
	switch {
	case model == "":
		return LabelUnknown
	case !ValidLabel(model):
		return LabelInvalid
	}
	limit := cmp.Or(c.max, MaxModels)
	c.mu.RLock()
	label, ok := c.seen[model]
	full := len(c.seen) >= limit
	c.mu.RUnlock()
	switch {
	case ok:
		return label
	case full || !confirmed(status):
		return LabelOther
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if label, ok := c.seen[model]; ok {
		return label
	}
	if len(c.seen) >= limit {
		return LabelOther
	}
	label = strings.Clone(model)
	c.seen[label] = label
	return label
}

// confirmed reports whether a request's status shows a worker served its model: a 2xx other than
// 202 Accepted (queued by the async broker, unseen by any worker).
func confirmed(status int) bool {
	return status >= 200 && status < 300 && status != http.StatusAccepted
}

// RequestStarted counts a request in flight and returns the func that records its end: the
// short form of StartRequest and Request.Done.
func (m *Metrics) RequestStarted(route string) func(model string, status, requestBytes, responseBytes int) {
	r := m.StartRequest(route)
	return func(model string, status, requestBytes, responseBytes int) {
		r.Done(RequestEnd{Model: model, Status: status, RequestBytes: requestBytes, ResponseBytes: responseBytes,
			ErrorCode: ErrorCode(nil, status)})
	}
}

// Step records one step's duration and outcome.
func (m *Metrics) Step(step, outcome string, d time.Duration) {
	if m != nil {
		step = LabelValue(step)
		m.stepDuration.WithLabelValues(step, LabelValue(outcome)).Observe(d.Seconds())
		m.llmd.stepDuration.WithLabelValues(step).Observe(d.Seconds())
	}
}

// Upstream records one outbound call; status 0 means it failed without an HTTP answer.
func (m *Metrics) Upstream(phase string, status int, d time.Duration) {
	if m == nil {
		return
	}
	s := "error"
	if status != 0 {
		s = strconv.Itoa(status)
	}
	if up, ok := llmdUpstreams[phase]; ok {
		m.llmd.upstreamRequests.WithLabelValues(up).Inc()
		m.llmd.upstreamDuration.WithLabelValues(up).Observe(d.Seconds())
	}
	phase = LabelValue(phase)
	m.upstreamRequests.WithLabelValues(phase, s).Inc()
	m.upstreamDuration.WithLabelValues(phase, s).Observe(d.Seconds())
}

// ConditionalDecode records a conditional-decode outcome (CondServed, CondFellBack, CondError, or
// CondTransportError: an error without an HTTP answer).
func (m *Metrics) ConditionalDecode(outcome string) {
	if m == nil {
		return
	}
	if r, ok := llmdProbe[outcome]; ok {
		m.llmd.probes.WithLabelValues(r).Inc()
	}
	if outcome == CondTransportError {
		outcome = CondError
	}
	m.conditionalDecode.WithLabelValues(LabelValue(outcome)).Inc()
}

// Stream-resume outcomes.
const (
	ResumeResumed      = "resumed"
	ResumeNotResumable = "not_resumable"
	ResumeExhausted    = "exhausted"
	ResumeFailed       = "failed"
	DegradedAggregated = "aggregated"
	DegradedFailed     = "failed"
)

// Retry records a leg tried again after failing for reason.
func (m *Metrics) Retry(phase, reason string) {
	if m != nil {
		m.retries.WithLabelValues(phase, reason).Inc()
	}
}

// RetryBudgetExhausted records a retry the budget did not allow.
func (m *Metrics) RetryBudgetExhausted(phase string) {
	if m != nil {
		m.budgetExhausted.WithLabelValues(phase).Inc()
	}
}

// StreamResume records how a broken decode stream ended.
func (m *Metrics) StreamResume(outcome string) {
	if m != nil {
		m.resumes.WithLabelValues(outcome).Inc()
	}
}

// Degraded records a request whose phase's pool could not serve it, and what the policy did.
func (m *Metrics) Degraded(phase, outcome string) {
	if m != nil {
		m.degraded.WithLabelValues(phase, outcome).Inc()
	}
}

// EncodeFanout records how many encode legs a request made.
func (m *Metrics) EncodeFanout(n int) {
	if m != nil {
		m.encodeFanout.Observe(float64(n))
		m.llmd.encodeSub.Observe(float64(n))
	}
}

// Reload records a reload attempt and, on success, the new loaded revision and pipelines.
func (m *Metrics) Reload(ok bool, revision string, pipelines ...PipelineTrack) {
	if m == nil {
		return
	}
	if !ok {
		m.reloads.WithLabelValues("failure").Inc()
		return
	}
	m.reloads.WithLabelValues("success").Inc()
	m.Loaded(revision, pipelines...)
}

// PipelineTrack is one pipeline a configuration loads: its track (stable, canary), pipeline
// revision and share of the requests.
type PipelineTrack struct {
	Track, Revision string
	WeightPercent   int
}

// Loaded marks revision as the loaded configuration and pipelines as the pipelines it serves.
// Their request series are created at zero (so that a ratio of errors to requests exists before
// the first error), and the series of pipeline revisions no longer served are removed: the
// series are bounded by the revisions loaded at once, however many reloads there were.
func (m *Metrics) Loaded(revision string, pipelines ...PipelineTrack) {
	if m == nil {
		return
	}
	m.configInfo.Reset()
	m.configInfo.WithLabelValues(LabelValue(revision)).Set(1)
	m.heldMu.Lock()
	defer m.heldMu.Unlock()
	held := map[string]bool{}
	m.pipelineWeight.Reset()
	for _, p := range pipelines {
		held[p.Revision] = true
		rev := LabelValue(p.Revision)
		m.pipelineWeight.WithLabelValues(p.Track, rev).Set(float64(p.WeightPercent))
		for _, o := range []string{OutcomeSuccess, OutcomeClientError, OutcomeError} {
			m.pipelineRequests.WithLabelValues(p.Track, rev, o).Add(0)
		}
	}
	for r := range m.held {
		if !held[r] {
			m.pipelineRequests.DeletePartialMatch(prometheus.Labels{"revision": LabelValue(r)})
		}
	}
	m.held = held
}

// Hold counts the requests of pipelines from now on, before they serve (a reload swaps them in
// afterwards, then calls Loaded): no request of a new revision goes uncounted in between.
func (m *Metrics) Hold(pipelines ...PipelineTrack) {
	if m == nil {
		return
	}
	m.heldMu.Lock()
	defer m.heldMu.Unlock()
	if m.held == nil {
		m.held = map[string]bool{}
	}
	for _, p := range pipelines {
		m.held[p.Revision] = true
	}
}

// Pipeline request outcomes (PipelineOutcome).
const (
	OutcomeSuccess     = "success"
	OutcomeClientError = "client_error"
	OutcomeError       = "error"
)

// PipelineOutcome is the outcome of a request run on a pipeline that ended with status; cut
// says its response was cut off after it started (by the coordinator or a worker, not the
// client). Only OutcomeError counts against the pipeline.
func PipelineOutcome(status int, cut bool) string {
	switch {
	case cut || status >= 500:
		return OutcomeError
	case status >= 400:
		return OutcomeClientError
	}
	return OutcomeSuccess
}

// PipelineRequest records a request run on the pipeline of track and revision, with outcome.
func (m *Metrics) PipelineRequest(track, revision, outcome string) {
	if m == nil {
		return
	}
	m.heldMu.RLock()
	defer m.heldMu.RUnlock()
	if m.held[revision] { // a request finishing on a pipeline unloaded meanwhile leaves no series behind
		m.pipelineRequests.WithLabelValues(track, LabelValue(revision), outcome).Inc()
	}
}

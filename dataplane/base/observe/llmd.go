package observe

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
)

// The llm-d series: upstream llm-d's coordinator metrics (llm-d-router pkg/coordinator/metrics,
// docs/metrics.coord.md) under their names, labels and buckets, so that dashboards written for
// llm-d work unchanged. They are recorded by the same hooks as the coordinator_* series (each
// fact once) and bounded the same way: model_name is the model label of those series (see
// modelCap), every other label takes a fixed set of values or a configured step name.
const (
	LLMDNamespace = "llm_d"
	LLMDSubsystem = "coordinator"
)

// llm-d error_code values.
const (
	ErrBadRequest        = "bad_request"
	ErrUpstream4xx       = "upstream_4xx"
	ErrUpstream5xx       = "upstream_5xx"
	ErrInternal          = "internal"
	ErrUpstreamTransport = "upstream_transport"
)

// llm-d execution_path_total path values: what the request actually ran.
const (
	PathDecodeOnly          = "decode-only"
	PathPrefillDecode       = "prefill-decode"
	PathEncodePrefillDecode = "encode-prefill-decode"
)

// CondTransportError is the conditional-decode outcome of a probe that got no HTTP answer:
// coordinator_conditional_decode_total counts it as CondError, the llm-d probe series as
// transport_error.
const CondTransportError = "transport_error"

// Media download results (llm_d_coordinator_media_download_duration_seconds).
const (
	MediaSuccess   = "success"
	MediaError     = "error"
	MediaCancelled = "cancelled"
)

// LLMDLatencyBuckets are upstream's general latency buckets.
var LLMDLatencyBuckets = []float64{0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10,
	15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600}

// LLMDSizeBuckets are upstream's size ladder: powers of two from 64 B to 1 GiB.
var LLMDSizeBuckets = prometheus.ExponentialBuckets(64, 2, 25)

// LLMDTokenBuckets are upstream's token ladder: 1, then powers of two from 8 to 1048576.
var LLMDTokenBuckets = append([]float64{1}, prometheus.ExponentialBuckets(8, 2, 18)...)

// llmdCountBuckets count encode sub-requests and media items per request (0 included).
var llmdCountBuckets = []float64{0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64}

// llmdOverheadBuckets suit the coordinator's own time per request: 100 µs to 1 s.
var llmdOverheadBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}

// llmdRoutes maps the inference routes of the coordinator_* series to upstream's route label; other
// routes (passthrough) record no llm-d request series.
var llmdRoutes = map[string]string{"chat": "chat-completions", "completions": "completions", "generate": "generate", "responses": "responses"}

// llmdUpstreams maps an outbound call's phase to upstream's upstream label; other phases
// (passthrough) record no llm-d upstream series.
var llmdUpstreams = map[string]string{"render": "render", "media": "media-fetch", "encode": "encode", "prefill": "prefill",
	"conditional-decode": "conditional-decode", "decode": "decode"}

// llmdProbe maps a conditional-decode outcome to upstream's probe result.
var llmdProbe = map[string]string{CondServed: "served", CondFellBack: "deferred", CondError: "error", CondTransportError: "transport_error"}

type llmdMetrics struct {
	requests         *prometheus.CounterVec
	requestErrors    *prometheus.CounterVec
	requestDuration  *prometheus.HistogramVec
	requestSize      *prometheus.HistogramVec
	inputTokens      *prometheus.HistogramVec
	running          *prometheus.GaugeVec
	stepDuration     *prometheus.HistogramVec
	stepErrors       *prometheus.CounterVec
	stepRunning      *prometheus.GaugeVec
	upstreamRequests *prometheus.CounterVec
	upstreamDuration *prometheus.HistogramVec
	executionPath    *prometheus.CounterVec
	probes           *prometheus.CounterVec
	encodeSub        prometheus.Histogram
	overhead         *prometheus.HistogramVec
	mediaItems       *prometheus.HistogramVec
	mediaDownload    *prometheus.HistogramVec
	responseSize     *prometheus.HistogramVec
}

func newLLMD() *llmdMetrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: LLMDNamespace, Subsystem: LLMDSubsystem, Name: name, Help: help}, labels)
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: LLMDNamespace, Subsystem: LLMDSubsystem, Name: name, Help: help}, labels)
	}
	hist := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: LLMDNamespace, Subsystem: LLMDSubsystem, Name: name, Help: help, Buckets: buckets}, labels)
	}
	return &llmdMetrics{
		requests:        counter("request_total", "Inference requests, by model.", "model_name"),
		requestErrors:   counter("request_error_total", "Failed inference requests, by model and error code.", "model_name", "error_code"),
		requestDuration: hist("request_duration_seconds", "Inference request latency, by model.", LLMDLatencyBuckets, "model_name"),
		requestSize:     hist("request_size_bytes", "Inference request body sizes, by model.", LLMDSizeBuckets, "model_name"),
		inputTokens:     hist("request_input_tokens", "Prompt tokens of inference requests (after render), by model.", LLMDTokenBuckets, "model_name"),
		running:         gauge("request_running", "Inference requests being served, by model.", "model_name"),
		stepDuration:    hist("step_duration_seconds", "Pipeline step durations, by step.", LLMDLatencyBuckets, "step"),
		stepErrors:      counter("step_errors_total", "Pipeline step failures, by step and error code.", "step", "error_code"),
		stepRunning:     gauge("step_running", "Pipeline steps running, by step.", "step"),
		upstreamRequests: counter("upstream_request_total",
			"Outbound calls, by upstream (render, media-fetch, encode, prefill, conditional-decode, decode).", "upstream"),
		upstreamDuration: hist("upstream_request_duration_seconds", "Outbound call latency, by upstream.", LLMDLatencyBuckets, "upstream"),
		executionPath: counter("execution_path_total",
			"Served inference requests by the path they ran (decode-only, prefill-decode, encode-prefill-decode).", "model_name", "path"),
		probes: counter("conditional_decode_probes_total",
			"Conditional-decode probes, by result (served, deferred, error, transport_error).", "result"),
		encodeSub: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: LLMDNamespace, Subsystem: LLMDSubsystem, Name: "encode_subrequests",
			Help: "Encode sub-requests per request that ran the encode step.", Buckets: llmdCountBuckets}),
		overhead: hist("orchestration_overhead_seconds",
			"Coordinator time per request outside parsing and pipeline steps, by route.", llmdOverheadBuckets, "route"),
		mediaItems:    hist("media_items", "Media items per request, by media type (image, other).", llmdCountBuckets, "media_type"),
		mediaDownload: hist("media_download_duration_seconds", "Media downloads, by result (success, error, cancelled).", LLMDLatencyBuckets, "result"),
		responseSize:  hist("response_size_bytes", "Inference response body sizes, by stream (true, false).", LLMDSizeBuckets, "stream"),
	}
}

func (l *llmdMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{l.requests, l.requestErrors, l.requestDuration, l.requestSize, l.inputTokens, l.running,
		l.stepDuration, l.stepErrors, l.stepRunning, l.upstreamRequests, l.upstreamDuration, l.executionPath, l.probes,
		l.encodeSub, l.overhead, l.mediaItems, l.mediaDownload, l.responseSize}
}

// RequestEnd is what the server knows of a request when it ends.
type RequestEnd struct {
	// Model is the client's model (labelled through modelCap), Status the client's status.
	Model  string
	Status int
	// RequestBytes and ResponseBytes are the bodies' sizes.
	RequestBytes, ResponseBytes int
	// ErrorCode is the llm-d error code of a failed request (ErrorCode), "" for a success.
	ErrorCode string

	// Ran is true when the request reached the pipeline; the fields below are set only then.
	Ran bool
	// Stream is the request's stream flag.
	Stream bool
	// InputTokens is the prompt's token count after render (0: none known).
	InputTokens int
	// Path is the execution path of a served request (Path*), "" when not counted.
	Path string
	// Images and OtherMedia count the request's media items.
	Images, OtherMedia int
	// Overhead is the coordinator's own time: the total less parsing and the steps.
	Overhead time.Duration
	// FirstByte is the time from receipt to the first byte of the answer sent (0: none was).
	FirstByte time.Duration
	// PrefillToFirstByte is the time from the prefill leg's answer to that first byte (0: no
	// prefill, or no byte).
	PrefillToFirstByte time.Duration
	// HasUsage says the answer's usage was read: PromptTokens, CompletionTokens and
	// CachedTokens; TargetModel is the answer's model ("" when absent).
	HasUsage                                     bool
	PromptTokens, CompletionTokens, CachedTokens int64
	TargetModel                                  string
	// Tenanted says server.metrics_tenant_header is configured; Tenant is the request's value of
	// it ("" when absent).
	Tenanted bool
	Tenant   string
}

// Request is one request's metrics, from StartRequest to Done. A nil *Request records nothing.
type Request struct {
	m       *Metrics
	route   string
	llmd    string // upstream's route label; "" for routes without llm-d request series
	start   time.Time
	running string // the request_running model label once Model was called
	// model is the model label known when the body was parsed (Model): the inter-token latency's,
	// observed while the answer streams, before the request's own label is settled.
	model string
	// itl and lastEvent are the inter-token latency clock (Events).
	itl       prometheus.Observer
	lastEvent time.Time
}

// StartRequest counts a request of route in flight; Done records its end.
func (m *Metrics) StartRequest(route string) *Request {
	if m == nil {
		return nil
	}
	r := &Request{m: m, route: LabelValue(route), llmd: llmdRoutes[route], start: time.Now()}
	m.inFlight.WithLabelValues(r.route).Inc()
	return r
}

// Model marks the request running for model (llm_d_coordinator_request_running), once its body
// was parsed. The label is the model's if it is already admitted (a request in flight admits no
// name), else other, unknown or invalid.
func (r *Request) Model(model string) {
	if r == nil {
		return
	}
	r.model = r.m.models.label(model, 0)
	if r.llmd == "" || r.running != "" {
		return
	}
	r.running = r.m.models.label(model, 0)
	r.m.llmd.running.WithLabelValues(r.running).Inc()
}

// Events records that n token events of the request's stream were just written to the client:
// the gap since the previous write is the inter-token latency of each (n events written at
// once share it); the first write starts the clock.
func (r *Request) Events(n int) {
	if r == nil || n <= 0 {
		return
	}
	now := time.Now()
	if r.itl == nil {
		r.itl = r.m.interTokenLatency.WithLabelValues(r.route, cmp.Or(r.model, LabelUnknown))
	}
	gap := 0.0
	if r.lastEvent.IsZero() {
		n-- // the first token has no predecessor: its latency is the time to first token
	} else {
		gap = now.Sub(r.lastEvent).Seconds() / float64(n)
	}
	r.lastEvent = now
	for range n {
		r.itl.Observe(gap)
	}
}

// Done records the request's end. Call it once.
func (r *Request) Done(e RequestEnd) {
	if r == nil {
		return
	}
	m := r.m
	d := time.Since(r.start).Seconds()
	model := m.models.label(e.Model, e.Status)
	m.inFlight.WithLabelValues(r.route).Dec()
	m.requests.WithLabelValues(r.route, model, strconv.Itoa(e.Status)).Inc()
	m.requestDuration.WithLabelValues(r.route, model).Observe(d)
	m.requestBytes.WithLabelValues(r.route).Observe(float64(e.RequestBytes))
	m.responseBytes.WithLabelValues(r.route).Observe(float64(e.ResponseBytes))
	m.answered(r.route, model, e)
	if e.Tenanted {
		m.tenanted(r.route, e)
	}
	if r.llmd == "" {
		return
	}
	l := m.llmd
	if r.running != "" {
		l.running.WithLabelValues(r.running).Dec()
	}
	l.requests.WithLabelValues(model).Inc()
	if e.ErrorCode != "" {
		l.requestErrors.WithLabelValues(model, LabelValue(e.ErrorCode)).Inc()
	}
	l.requestDuration.WithLabelValues(model).Observe(d)
	l.requestSize.WithLabelValues(model).Observe(float64(e.RequestBytes))
	stream := "false"
	if e.Stream {
		stream = "true"
	}
	l.responseSize.WithLabelValues(stream).Observe(float64(e.ResponseBytes))
	if !e.Ran {
		return
	}
	if e.InputTokens > 0 {
		l.inputTokens.WithLabelValues(model).Observe(float64(e.InputTokens))
	}
	switch e.Path {
	case PathDecodeOnly, PathPrefillDecode, PathEncodePrefillDecode:
		l.executionPath.WithLabelValues(model, e.Path).Inc()
	}
	l.mediaItems.WithLabelValues("image").Observe(float64(e.Images))
	if e.OtherMedia > 0 {
		l.mediaItems.WithLabelValues("other").Observe(float64(e.OtherMedia))
	}
	l.overhead.WithLabelValues(r.llmd).Observe(max(e.Overhead, 0).Seconds())
}

// StepStarted counts step running (llm_d_coordinator_step_running) and returns the func that
// records its end: Step, and the error's code when it failed.
func (m *Metrics) StepStarted(step string) func(outcome string, d time.Duration, err error) {
	if m == nil {
		return func(string, time.Duration, error) {}
	}
	label := LabelValue(step)
	m.llmd.stepRunning.WithLabelValues(label).Inc()
	return func(outcome string, d time.Duration, err error) {
		m.llmd.stepRunning.WithLabelValues(label).Dec()
		m.Step(step, outcome, d)
		if err != nil {
			m.llmd.stepErrors.WithLabelValues(label, ErrorCode(err, 0)).Inc()
		}
	}
}

// MediaDownload records one media download: its result is success without err, cancelled when
// ctx ended (the client left, or another download of the request failed), else error.
func (m *Metrics) MediaDownload(ctx context.Context, err error, d time.Duration) {
	if m == nil {
		return
	}
	result := MediaSuccess
	switch {
	case err == nil:
	case ctx.Err() != nil || errors.Is(err, context.Canceled):
		result = MediaCancelled
	default:
		result = MediaError
	}
	m.llmd.mediaDownload.WithLabelValues(result).Observe(d.Seconds())
}

// tokenCount is a count of tokens of one kind (Tokens*).
type tokenCount struct {
	kind string
	n    int64
}

// tokens are e's token counts by kind.
func (e RequestEnd) tokens() [3]tokenCount {
	return [3]tokenCount{{TokensPrompt, e.PromptTokens}, {TokensCompletion, e.CompletionTokens}, {TokensCached, e.CachedTokens}}
}

// tenanted records a request of a tenant (server.metrics_tenant_header), and its tokens.
func (m *Metrics) tenanted(route string, e RequestEnd) {
	tenant := m.tenants.label(e.Tenant, e.Status)
	m.tenantRequests.WithLabelValues(tenant, route, PipelineOutcome(e.Status, false)).Inc()
	if e.HasUsage && e.Status >= 200 && e.Status < 300 {
		for _, t := range e.tokens() {
			m.tenantTokens.WithLabelValues(tenant, t.kind).Add(float64(t.n))
		}
	}
}

// answered records the time to first token, the prefill-to-first-token gap and the tokens of a
// served (2xx) answer.
func (m *Metrics) answered(route, model string, e RequestEnd) {
	if e.Status < 200 || e.Status >= 300 || e.FirstByte <= 0 {
		return
	}
	m.timeToFirstToken.WithLabelValues(route, model).Observe(e.FirstByte.Seconds())
	if e.PrefillToFirstByte > 0 {
		m.prefillToFirst.WithLabelValues(route).Observe(e.PrefillToFirstByte.Seconds())
	}
	if !e.HasUsage {
		return
	}
	// The served model is a label only where it differs from the requested one (a rewrite, an
	// alias): one series per pair seen, not the product of the two label sets.
	target := ""
	if e.TargetModel != "" && e.TargetModel != e.Model {
		target = m.targets.label(e.TargetModel, e.Status)
	}
	for _, t := range e.tokens() {
		m.tokens.WithLabelValues(route, model, target, t.kind).Add(float64(t.n))
	}
}

// ErrorCode is the llm-d error_code of a request or step that ended with err and, for a request,
// the client's status (0 for a step): an upstream's failure by its status (0: upstream_transport;
// 4xx: upstream_4xx; other, including an unusable 2xx answer: upstream_5xx), the coordinator's own
// 4xx (and a client's cancellation, 499) bad_request, anything else internal. A request without
// err but with a status of 400 or more relayed a worker's error answer. "" means no error.
func ErrorCode(err error, status int) string {
	if err == nil {
		switch {
		case status >= 500:
			return ErrUpstream5xx
		case status >= 400:
			return ErrUpstream4xx
		}
		return ""
	}
	if errors.Is(err, context.Canceled) {
		return ErrBadRequest
	}
	if up := (*apierror.UpstreamError)(nil); errors.As(err, &up) {
		switch {
		case up.Status == 0:
			return ErrUpstreamTransport
		case up.Status >= 400 && up.Status < 500:
			return ErrUpstream4xx
		}
		return ErrUpstream5xx
	}
	if e := (*apierror.Error)(nil); status == 0 && errors.As(err, &e) {
		status = e.Status
	}
	if status >= http.StatusBadRequest && status < http.StatusInternalServerError {
		return ErrBadRequest
	}
	return ErrInternal
}

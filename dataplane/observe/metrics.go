// Package observe is the coordinator's telemetry: Prometheus metrics (where each request's time
// went, per step and per upstream leg) and OpenTelemetry tracing (a span per request, step and
// leg, W3C trace context on every leg). A nil *Metrics records nothing, so tests and embedders
// can leave it out.
package observe

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Namespace prefixes every data-plane metric.
const Namespace = "coordinator"

// MaxModels caps the distinct values of the model label; later models are counted as "other".
const MaxModels = 1000

// LatencyBuckets suit LLM work: 5 ms (a cache hit) to an hour (a long generation).
var LatencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600}

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
	encodeFanout      prometheus.Histogram
	reloads           *prometheus.CounterVec
	configInfo        *prometheus.GaugeVec

	models modelCap
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
		encodeFanout: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: "encode_fanout",
			Help: "Encode legs per request (media items).", Buckets: []float64{1, 2, 3, 4, 6, 8, 12, 16, 32, 64}}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "config_reloads_total",
			Help: "Configuration reload attempts by result (success, failure)."}, []string{"result"}),
		configInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "config_info",
			Help: "1 for the loaded configuration revision."}, []string{"revision"}),
	}
	m.models.seen = map[string]struct{}{}
	reg.MustRegister(m.requests, m.requestDuration, m.inFlight, m.requestBytes, m.responseBytes, m.stepDuration,
		m.upstreamDuration, m.upstreamRequests, m.conditionalDecode, m.encodeFanout, m.reloads, m.configInfo,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// modelCap admits up to MaxModels distinct model names; admitted names stay admitted.
type modelCap struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

func (c *modelCap) label(model string) string {
	if model == "" {
		return "unknown"
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seen[model]; ok {
		return model
	}
	if len(c.seen) >= MaxModels {
		return "other"
	}
	c.seen[model] = struct{}{}
	return model
}

// RequestStarted counts a request in flight and returns the func that records its end.
func (m *Metrics) RequestStarted(route string) func(model string, status, requestBytes, responseBytes int) {
	if m == nil {
		return func(string, int, int, int) {}
	}
	start := time.Now()
	m.inFlight.WithLabelValues(route).Inc()
	return func(model string, status, requestBytes, responseBytes int) {
		model = m.models.label(model)
		m.inFlight.WithLabelValues(route).Dec()
		m.requests.WithLabelValues(route, model, strconv.Itoa(status)).Inc()
		m.requestDuration.WithLabelValues(route, model).Observe(time.Since(start).Seconds())
		m.requestBytes.WithLabelValues(route).Observe(float64(requestBytes))
		m.responseBytes.WithLabelValues(route).Observe(float64(responseBytes))
	}
}

// Step records one step's duration and outcome.
func (m *Metrics) Step(step, outcome string, d time.Duration) {
	if m != nil {
		m.stepDuration.WithLabelValues(step, outcome).Observe(d.Seconds())
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
	m.upstreamRequests.WithLabelValues(phase, s).Inc()
	m.upstreamDuration.WithLabelValues(phase, s).Observe(d.Seconds())
}

// ConditionalDecode records a conditional-decode outcome (CondServed, CondFellBack, CondError).
func (m *Metrics) ConditionalDecode(outcome string) {
	if m != nil {
		m.conditionalDecode.WithLabelValues(outcome).Inc()
	}
}

// EncodeFanout records how many encode legs a request made.
func (m *Metrics) EncodeFanout(n int) {
	if m != nil {
		m.encodeFanout.Observe(float64(n))
	}
}

// Reload records a reload attempt and, on success, the new loaded revision.
func (m *Metrics) Reload(ok bool, revision string) {
	if m == nil {
		return
	}
	if !ok {
		m.reloads.WithLabelValues("failure").Inc()
		return
	}
	m.reloads.WithLabelValues("success").Inc()
	m.Loaded(revision)
}

// Loaded marks revision as the loaded configuration.
func (m *Metrics) Loaded(revision string) {
	if m != nil {
		m.configInfo.Reset()
		m.configInfo.WithLabelValues(revision).Set(1)
	}
}

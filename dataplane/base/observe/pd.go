package observe

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of coordinator_pd_requests_total: what became of a request's prefill/decode split,
// judged from the decode answer's usage (prompt_tokens_details.cached_tokens).
const (
	// PDDisaggregated: the decode leg carried the prefill's kv_transfer_params and its usage
	// reports at least the configured share of the prompt as cached: the KV moved.
	PDDisaggregated = "disaggregated"
	// PDRecomputed: the decode leg carried the prefill's kv_transfer_params (or was retried
	// without them after a failed transfer) and its usage reports less than that share cached:
	// the decode worker computed the prompt again, paying the prefill twice.
	PDRecomputed = "recomputed"
	// PDUnverified: the decode leg carried the prefill's kv_transfer_params but its usage says
	// nothing of cached tokens (no usage, or no prompt_tokens_details: vLLM without
	// --enable-prompt-tokens-details).
	PDUnverified = "unverified"
	// PDAggregated: decode served the request alone by policy: no prefill ran (a pipeline
	// without one, a conditional-decode hit, a prefill pool degraded to aggregated).
	PDAggregated = "aggregated"
)

// pdOutcomes are the values of the outcome label, all created at start so that a rate over
// them is defined (0) before the first request of each.
var pdOutcomes = []string{PDDisaggregated, PDRecomputed, PDUnverified, PDAggregated}

// newPDRequests is coordinator_pd_requests_total.
func newPDRequests() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "pd_requests_total",
		Help: "Requests answered by a decode leg, by what became of the prefill/decode split (outcome: disaggregated, the decode's usage shows the prompt's KV arrived; recomputed, it shows the decode computed the prompt again; unverified, the usage says nothing of cached tokens; aggregated, no prefill ran by policy)."},
		[]string{"outcome"})
	for _, o := range pdOutcomes {
		c.WithLabelValues(o)
	}
	return c
}

// PD counts a request answered by decode with outcome (PD*); other values are not counted.
func (m *Metrics) PD(outcome string) {
	if m == nil {
		return
	}
	switch outcome {
	case PDDisaggregated, PDRecomputed, PDUnverified, PDAggregated:
		m.pdRequests.WithLabelValues(outcome).Inc()
	}
}

// newLegsInFlight is coordinator_upstream_legs_in_flight: a worker pool's saturation as one
// coordinator sees it.
func newLegsInFlight() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "upstream_legs_in_flight",
		Help: "Outbound legs sent and not yet answered to their end, by phase (render, media, encode, prefill, decode, conditional-decode, passthrough): how many requests each pool is working on for this coordinator, for a worker-pool autoscaler."},
		[]string{"phase"})
}

// newFirstByte is coordinator_upstream_first_byte_seconds.
func newFirstByte() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "upstream_first_byte_seconds",
		Help: "Time from sending a leg to its answer's first byte (the response headers), by phase: the pool's queue wait plus, for prefill, the prompt's computation; for a worker-pool autoscaler.", Buckets: LatencyBuckets},
		[]string{"phase"})
}

// LegSent counts a leg of phase in flight until LegEnded.
func (m *Metrics) LegSent(phase string) {
	if m != nil {
		m.legsInFlight.WithLabelValues(LabelValue(phase)).Inc()
	}
}

// LegAnswered records the time from a leg's send to its answer's first byte.
func (m *Metrics) LegAnswered(phase string, d time.Duration) {
	if m != nil {
		m.firstByte.WithLabelValues(LabelValue(phase)).Observe(d.Seconds())
	}
}

// LegEnded ends a leg LegSent counted: it failed, or its answer was read to its end or closed.
func (m *Metrics) LegEnded(phase string) {
	if m != nil {
		m.legsInFlight.WithLabelValues(LabelValue(phase)).Dec()
	}
}

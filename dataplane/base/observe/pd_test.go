package observe

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// coordinator_pd_requests_total has its four outcomes from the start, counts each PD call of one
// of them and nothing else: the outcome label is bounded whatever a caller passes.
func TestPDRequests(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	if n := testutil.CollectAndCount(m.pdRequests); n != 4 {
		t.Fatalf("%d series before any request, want the 4 outcomes at zero", n)
	}
	for _, o := range []string{PDDisaggregated, PDDisaggregated, PDRecomputed, PDUnverified, PDAggregated, "", "other", "recomputed\x00"} {
		m.PD(o)
	}
	want := map[string]float64{PDDisaggregated: 2, PDRecomputed: 1, PDUnverified: 1, PDAggregated: 1}
	for o, n := range want {
		if got := testutil.ToFloat64(m.pdRequests.WithLabelValues(o)); got != n {
			t.Errorf("%s: %v, want %v", o, got, n)
		}
	}
	if n := testutil.CollectAndCount(m.pdRequests); n != 4 {
		t.Fatalf("%d series, want 4", n)
	}
	var nilMetrics *Metrics
	nilMetrics.PD(PDRecomputed) // records nothing, does not panic
	nilMetrics.LegSent("decode")
	nilMetrics.LegAnswered("decode", 0)
	nilMetrics.LegEnded("decode")
}

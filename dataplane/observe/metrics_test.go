package observe

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestModelLabelIsCapped(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	for i := 0; i < MaxModels+50; i++ {
		m.RequestStarted("chat")(fmt.Sprintf("model-%d", i), 200, 10, 10)
	}
	m.RequestStarted("chat")("model-3", 200, 1, 1) // admitted earlier: keeps its label
	m.RequestStarted("chat")("", 200, 1, 1)
	if n := testutil.CollectAndCount(m.requests); n != MaxModels+2 { // 1000 models + other + unknown
		t.Fatalf("%d series", n)
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
			if strings.HasPrefix(mf.GetName(), "coordinator_") {
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

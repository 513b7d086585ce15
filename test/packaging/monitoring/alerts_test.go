package monitoring

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	promqlengine "github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/promqltest"
)

// alertExpr returns the expression of the shipped alert named name.
func alertExpr(t *testing.T, name string) string {
	t.Helper()
	for _, q := range rules(t) {
		if strings.HasSuffix(q.where, "alert "+name) {
			return q.expr
		}
	}
	t.Fatalf("no alert %s", name)
	return ""
}

// series is one pipeline-requests counter rising by perMinute, as a promqltest load line.
func series(track, outcome string, perMinute int) string {
	return fmt.Sprintf(`coordinator_pipeline_requests_total{namespace="llm-d",pipeline="epd",pod="epd-0",track=%q,revision=%q,outcome=%q} 0+%dx20`,
		track, track+"-rev", outcome, perMinute)
}

// CoordinatorCanaryErrorRatio, evaluated by Prometheus's own engine on the series the
// coordinators export (the pipeline's series exist at zero from the moment it loads): it fires
// for a canary failing more than 2% and more than twice the stable pipeline, whether the stable
// pipeline has no errors, no traffic (weight 100) or no series at all.
func TestCanaryErrorRatioAlert(t *testing.T) {
	expr := alertExpr(t, "CoordinatorCanaryErrorRatio")
	tests := map[string]struct {
		load []string
		fire bool
	}{
		"canary 10% errors, stable none": {fire: true, load: []string{
			series("canary", "success", 90), series("canary", "error", 10), series("canary", "client_error", 0),
			series("stable", "success", 900), series("stable", "error", 0), series("stable", "client_error", 0)}},
		"canary 1% errors": {load: []string{
			series("canary", "success", 99), series("canary", "error", 1),
			series("stable", "success", 900), series("stable", "error", 0)}},
		"canary 10%, stable 8%: not twice": {load: []string{
			series("canary", "success", 90), series("canary", "error", 10),
			series("stable", "success", 920), series("stable", "error", 80)}},
		"canary 10%, stable 3%": {fire: true, load: []string{
			series("canary", "success", 90), series("canary", "error", 10),
			series("stable", "success", 970), series("stable", "error", 30)}},
		"weight 100: the stable pipeline idle": {fire: true, load: []string{
			series("canary", "success", 90), series("canary", "error", 10),
			series("stable", "success", 0), series("stable", "error", 0)}},
		"no stable series at all":  {fire: true, load: []string{series("canary", "success", 90), series("canary", "error", 10)}},
		"a canary without traffic": {load: []string{series("canary", "success", 0), series("canary", "error", 0), series("stable", "success", 900)}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			vec := evalAt(t, tc.load, expr)
			if fired := len(vec) > 0; fired != tc.fire {
				t.Fatalf("fired %v (%v), want %v", fired, vec, tc.fire)
			}
			if tc.fire && (vec[0].Metric.Get("revision") != "canary-rev" || vec[0].Metric.Get("pipeline") != "epd") {
				t.Fatalf("alert labels %v", vec[0].Metric)
			}
		})
	}
}

// pdSeries is a P/D truth counter of outcome rising by perMinute, as a promqltest load line.
func pdSeries(pod, outcome string, perMinute int) string {
	return fmt.Sprintf(`coordinator_pd_requests_total{namespace="llm-d",pipeline="epd",pod=%q,outcome=%q} 0+%dx20`, pod, outcome, perMinute)
}

// CoordinatorKVRecomputed fires when more than 5% of a pipeline's disaggregated requests (KV
// moved or recomputed; unverified and aggregated ones say nothing either way) were recomputed by
// decode, summed over its pods, and not for a trickle of traffic.
func TestKVRecomputedAlert(t *testing.T) {
	expr := alertExpr(t, "CoordinatorKVRecomputed")
	tests := map[string]struct {
		load []string
		fire bool
	}{
		"10% recomputed": {fire: true, load: []string{pdSeries("a", "disaggregated", 90), pdSeries("a", "recomputed", 10)}},
		"3% recomputed":  {load: []string{pdSeries("a", "disaggregated", 97), pdSeries("a", "recomputed", 3)}},
		"one pod recomputes everything, 2 of 100 in all":  {load: []string{pdSeries("a", "disaggregated", 98), pdSeries("b", "recomputed", 2)}},
		"one pod recomputes everything, 10 of 100 in all": {fire: true, load: []string{pdSeries("a", "disaggregated", 90), pdSeries("b", "recomputed", 10)}},
		"aggregated and unverified requests do not dilute it": {fire: true, load: []string{pdSeries("a", "disaggregated", 9), pdSeries("a", "recomputed", 1),
			pdSeries("a", "aggregated", 900), pdSeries("a", "unverified", 900)}},
		"no disaggregated traffic": {load: []string{pdSeries("a", "disaggregated", 0), pdSeries("a", "recomputed", 0), pdSeries("a", "aggregated", 100)}},
		"a trickle":                {load: []string{pdSeries("a", "disaggregated", 1), pdSeries("a", "recomputed", 1)}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			vec := evalAt(t, tc.load, expr)
			if fired := len(vec) > 0; fired != tc.fire {
				t.Fatalf("fired %v (%v), want %v", fired, vec, tc.fire)
			}
			if tc.fire && (vec[0].Metric.Get("pipeline") != "epd" || vec[0].Metric.Get("namespace") != "llm-d") {
				t.Fatalf("alert labels %v", vec[0].Metric)
			}
		})
	}
}

// evalAt evaluates expr over the series of load (one sample a minute) at 20 minutes.
func evalAt(t *testing.T, load []string, expr string) promqlengine.Vector {
	t.Helper()
	storage := promqltest.LoadedStorage(t, "load 1m\n  "+strings.Join(load, "\n  "))
	t.Cleanup(func() { _ = storage.Close() })
	engine := promqltest.NewTestEngine(t, false, 5*time.Minute, promqltest.DefaultMaxSamplesPerQuery)
	q, err := engine.NewInstantQuery(context.Background(), storage, nil, expr, time.Unix(0, 0).Add(20*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	res := q.Exec(context.Background())
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	vec, err := res.Vector()
	if err != nil {
		t.Fatal(err)
	}
	return vec
}

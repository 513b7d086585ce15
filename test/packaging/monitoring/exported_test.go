package monitoring

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/harness/cluster"
	"github.com/epd-dev/coordinator/test/harness/stack"
	"github.com/epd-dev/coordinator/test/internal/loopback"
)

// targetLabels are added by the scrape (PodMonitor, ServiceMonitor), not by the binaries: the
// expressions may match on them whatever a binary exports. The operator's per-object series
// carry their own namespace (the ServiceMonitor honours it); that is checked like any label when
// the series has it.
var targetLabels = []string{"namespace", "pod", "pipeline", "job", "instance", "container", "endpoint", "service"}

// exposition is what the binaries export: per series name (histograms as _bucket, _sum and
// _count) its label values.
type exposition map[string]map[string]map[string]bool

func (x exposition) add(families map[string]*dto.MetricFamily) {
	for name, f := range families {
		names := []string{name}
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			names = []string{name + "_bucket", name + "_sum", name + "_count"}
		case dto.MetricType_SUMMARY:
			names = []string{name, name + "_sum", name + "_count"}
		}
		for _, n := range names {
			if x[n] == nil {
				x[n] = map[string]map[string]bool{}
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if x[n][l.GetName()] == nil {
						x[n][l.GetName()] = map[string]bool{}
					}
					x[n][l.GetName()][l.GetValue()] = true
				}
			}
			if strings.HasSuffix(n, "_bucket") {
				x[n]["le"] = map[string]bool{"+Inf": true}
			}
		}
	}
}

// check reports how a selector does not match the exposition: an unknown metric, a label the
// metric does not have, or an equality matcher on a value it never takes.
func (x exposition) check(u selectorUse) error {
	series, ok := x[u.metric]
	if !ok {
		return fmt.Errorf("metric %s is not exported", u.metric)
	}
	for _, m := range u.matchers {
		values, ok := series[m.Name]
		if !ok {
			if slices.Contains(targetLabels, m.Name) {
				continue
			}
			return fmt.Errorf("%s has no label %s (labels: %v)", u.metric, m.Name, sortedKeys(series))
		}
		if m.Type.String() == "=" && !values[m.Value] && !slices.Contains(targetLabels, m.Name) {
			return fmt.Errorf("%s{%s} takes no value %q (seen: %v)", u.metric, m.Name, m.Value, sortedKeys(values))
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// scrape reads url's Prometheus text exposition.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v\n%s", url, resp.StatusCode, err, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("parsing %s: %v", url, err)
	}
	return families
}

// Every metric the alerts, the dashboard and the KEDA example query, with every label they match
// on, is exported by the binaries.
func TestQueriedMetricsAreExported(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	bin := t.TempDir()
	start := time.Now()
	if err := cluster.Build(root, bin, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("built the binaries in %s", time.Since(start).Round(time.Millisecond))
	x := exposition{}
	x.add(coordinatorMetrics(t, bin))
	x.add(operatorMetrics(t, bin))

	n := 0
	for _, q := range slices.Concat(rules(t), dashboard(t), keda(t)) {
		uses, err := parse(q)
		if err != nil {
			t.Error(err)
			continue
		}
		for _, u := range uses {
			n++
			if err := x.check(u); err != nil {
				t.Errorf("%s: %v\n%s", q.where, err, q.expr)
			}
		}
	}
	t.Logf("%d selectors checked against %d exported series names", n, len(x))
}

// coordinatorMetrics runs the coordinator binary (conditional-decode, prefill, decode; a retry
// budget of one retry) in front of simworkers and the gateway double, sends requests that make
// every lazily created series appear (served, streamed, rejected, retried, refused by the
// budget, degraded, resumed, a good reload with a canary and a bad one) and scrapes its admin
// /metrics.
func coordinatorMetrics(t *testing.T, bin string) map[string]*dto.MetricFamily {
	st, err := stack.Start(stack.Options{KVConnector: "kv-nixl", ECConnector: "ec-nixl", Decoders: 2, ITL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	cfgPath := filepath.Join(t.TempDir(), "coordinator.yaml")
	doc := func(steps string) string {
		return fmt.Sprintf("log_level: 1\ngateway: {address: %s, retry: {budget_ratio: 0, budget_min_per_second: 0}}\n"+
			"pipeline: {kv_connector: kv-nixl, ec_connector: ec-nixl, steps: [%s]}\n", st.Gateway.URL(), steps)
	}
	write := func(text string) {
		tmp := cfgPath + ".tmp"
		if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, cfgPath); err != nil {
			t.Fatal(err)
		}
	}
	write(doc("{type: conditional-decode}, {type: prefill}, {type: decode}"))
	logs := &loopback.Log{}
	c, err := cluster.StartCoordinator(context.Background(), bin, cfgPath, "", nil, logs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(5 * time.Second) })

	post := func(path, body string) int {
		resp, err := http.Post(c.URL+path, "application/json", strings.NewReader(body))
		if err != nil { // the fault scenarios may end a connection
			t.Logf("POST %s %s: %v", path, body, err)
			return 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	chat := func(stream bool, words string) int {
		return post("/v1/chat/completions", fmt.Sprintf(`{"model": %q, "stream": %v, "max_tokens": 8, "messages": [{"role": "user", "content": %q}]}`, simworker.DefaultModelName, stream, words))
	}
	for i := range 3 {
		chat(false, fmt.Sprint("served ", i))
		chat(true, fmt.Sprint("streamed ", i))
	}
	post("/v1/completions", `{"model": "`+simworker.DefaultModelName+`", "max_tokens": 4, "prompt": "complete me"}`)
	post("/v1/chat/completions", `{"model": "`+simworker.DefaultModelName+`", "messages": "not a list"}`) // 400
	// Both decode workers fail the next leg: the first failure is retried (the budget's one
	// token), the second is refused by the budget and reaches the client as a 5xx.
	for _, w := range st.Decode {
		if err := w.InjectFault(simworker.Fault{Kind: simworker.FaultStatus, Status: http.StatusServiceUnavailable}); err != nil {
			t.Fatal(err)
		}
	}
	chat(false, "no decode worker answers")
	// The prefill pool fails: the request is served by decode alone (on_pool_failure: aggregate).
	for _, w := range st.Prefill {
		if err := w.InjectFault(simworker.Fault{Kind: simworker.FaultStatus, Status: http.StatusServiceUnavailable, Count: 4}); err != nil {
			t.Fatal(err)
		}
	}
	chat(false, "prefill is down")
	// A reload to a new revision (prefill, decode) ...
	reloads := func(result string) bool {
		for _, m := range scrape(t, c.AdminURL+"/metrics")["coordinator_config_reloads_total"].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return true
				}
			}
		}
		return false
	}
	// ... with a canary of half the traffic (each stream below breaks off: one on each track).
	write(doc("{type: prefill}, {type: decode}") + "canary: {weight_percent: 50, pipeline: {kv_connector: kv-nixl, ec_connector: ec-nixl, on_pool_failure: fail, steps: [{type: prefill}, {type: decode}]}}\n")
	waitFor(t, "a successful reload", func() bool { return reloads("success") })
	// ... where a decode stream breaks off after a few tokens: not resumed, the budget is spent.
	for _, w := range slices.Concat(st.Decode, st.Prefill) {
		w.ClearFaults()
	}
	for _, w := range st.Decode {
		if err := w.InjectFault(simworker.Fault{Kind: simworker.FaultDieMidStream, AfterTokens: 2}); err != nil {
			t.Fatal(err)
		}
	}
	chat(true, "a stream that breaks off after two tokens")
	chat(true, "another stream that breaks off, on the canary")
	// Then a configuration the coordinator refuses.
	write(doc("{type: no-such-step}"))
	waitFor(t, "a failed reload", func() bool { return reloads("failure") })
	for _, w := range st.Decode {
		w.ClearFaults()
	}
	chat(false, "after the reloads")

	families := scrape(t, c.AdminURL+"/metrics")
	for _, name := range []string{"coordinator_upstream_retries_total", "coordinator_retry_budget_exhausted_total",
		"coordinator_degraded_requests_total", "coordinator_stream_resumes_total", "coordinator_conditional_decode_total",
		"coordinator_pipeline_requests_total", "coordinator_pipeline_weight_percent"} {
		if families[name] == nil {
			t.Errorf("the scenario did not make %s appear; coordinator log:\n%s", name, logs.Tail(3000))
		}
	}
	return families
}

// operatorMetrics runs the manager binary on a real API server, lets it reconcile a
// CoordinatorPipeline and scrapes its metrics endpoint (plain HTTP).
func operatorMetrics(t *testing.T, bin string) map[string]*dto.MetricFamily {
	addr, err := loopback.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cl, err := cluster.Start(ctx, cluster.Options{Root: root, Bin: bin,
		ManagerArgs: []string{"--metrics-bind-address", addr, "--metrics-secure=false"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Stop)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "monitoring"}}
	if err := cl.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	cp := &coordinatorv1alpha1.CoordinatorPipeline{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "epd"},
		Spec: coordinatorv1alpha1.CoordinatorPipelineSpec{
			InferencePoolRef: coordinatorv1alpha1.InferencePoolReference{Name: "pool"},
			Gateway:          coordinatorv1alpha1.GatewaySpec{Address: "http://gateway.monitoring.svc:80"},
			Pipeline: coordinatorv1alpha1.PipelineSpec{
				KVConnector: "kv-nixl",
				Steps:       []coordinatorv1alpha1.PipelineStep{{Type: "prefill"}, {Type: "decode"}},
			},
			Replicas: ptr.To[int32](1),
		},
	}
	if err := cl.Client.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	url := "http://" + addr + "/metrics"
	var families map[string]*dto.MetricFamily
	waitFor(t, "the CoordinatorPipeline's status and metrics", func() bool {
		got := &coordinatorv1alpha1.CoordinatorPipeline{}
		if err := cl.Client.Get(ctx, client.ObjectKeyFromObject(cp), got); err != nil || got.Status.ConfigRevision == "" {
			return false
		}
		families = scrape(t, url)
		return families["coordinatorpipeline_status_condition"] != nil && families["coordinatorpipeline_config_revision_info"] != nil
	})
	return families
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !ok(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

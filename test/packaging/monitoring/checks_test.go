package monitoring

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

// The comparison catches the mistakes it is for.
func TestExpositionCheckCatchesMistakes(t *testing.T) {
	x := exposition{}
	label := func(n, v string) *dto.LabelPair { return &dto.LabelPair{Name: proto.String(n), Value: proto.String(v)} }
	x.add(map[string]*dto.MetricFamily{
		"c_total": {Name: proto.String("c_total"), Type: dto.MetricType_COUNTER.Enum(),
			Metric: []*dto.Metric{{Label: []*dto.LabelPair{label("status", "200")}}}},
		"h_seconds": {Name: proto.String("h_seconds"), Type: dto.MetricType_HISTOGRAM.Enum(), Metric: []*dto.Metric{{}}},
	})
	for expr, wantErr := range map[string]bool{
		`rate(c_total{status="200", namespace="x"}[5m])`:                false,
		`rate(c_total{status=~"5.."}[5m])`:                              false,
		`rate(c_total{status="500"}[5m])`:                               true, // a value never exported
		`rate(c_total{code="200"}[5m])`:                                 true, // a label it does not have
		`rate(d_total[5m])`:                                             true, // not exported
		`histogram_quantile(0.9, rate(h_seconds_bucket[5m]))`:           false,
		`histogram_quantile(0.9, rate(h_seconds[5m]))`:                  true, // a histogram's bare name
		`sum(rate(h_seconds_sum[5m])) / sum(rate(h_seconds_count[5m]))`: false,
	} {
		uses, err := parse(query{where: "test", expr: expr})
		if err != nil {
			t.Fatal(err)
		}
		var failed bool
		for _, u := range uses {
			failed = failed || x.check(u) != nil
		}
		if failed != wantErr {
			t.Errorf("%s: failed %v, want %v", expr, failed, wantErr)
		}
	}
}

// The modules this module shares with the main one are at the main module's versions, so that
// `make test` builds them once: a prometheus/prometheus whose requirements are newer than the
// main module's would make Go select the newer versions here and compile the whole Kubernetes
// client stack a second time (minutes on CI's two cores). Keep the prometheus version at the
// newest whose requirements do not pass the main module's, or bump the main module first.
func TestSharesTheMainModuleVersions(t *testing.T) {
	main, here := requirements(t, filepath.Join(root, "go.mod")), requirements(t, "go.mod")
	for path, v := range here {
		if mv, ok := main[path]; ok && mv != v {
			t.Errorf("%s is %s here and %s in the main module", path, v, mv)
		}
	}
}

// requirements reads the require lines of a go.mod.
func requirements(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	in := false
	for s := bufio.NewScanner(f); s.Scan(); {
		line := strings.TrimSpace(s.Text())
		switch {
		case line == "require (":
			in = true
		case line == ")":
			in = false
		case in || strings.HasPrefix(line, "require "):
			fields := strings.Fields(strings.TrimPrefix(line, "require "))
			if len(fields) >= 2 {
				out[fields[0]] = fields[1]
			}
		}
	}
	return out
}

// Package monitoring keeps the shipped monitoring honest: every PromQL expression of the alerts
// (config/prometheus/prometheus_rule.yaml), of the Grafana dashboard
// (config/grafana/coordinator-dashboard.json; the chart carries copies, test/packaging/chart keeps them
// equal) and of the KEDA example's triggers (config/samples/keda) parses with Prometheus's own parser, and every metric it queries, with every label it
// matches on, is one the real binaries export: the coordinator (cmd/coordinator) in front of
// simworkers and the gateway double, driven until its lazily created series exist, and the
// operator (cmd/manager) reconciling CoordinatorPipelines on a real API server (envtest).
//
// It is a module of its own so that github.com/prometheus/prometheus stays out of the main
// go.mod; `make test` runs it.
package monitoring

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// root is the main module's directory.
const root = "../../.."

const (
	rulesFile     = "config/prometheus/prometheus_rule.yaml"
	dashboardFile = "config/grafana/coordinator-dashboard.json"
	kedaFile      = "config/samples/keda/scaledobjects.yaml"
)

// query is one PromQL expression and where it comes from.
type query struct {
	where string
	expr  string
}

// rules returns the alert expressions of the PrometheusRule.
func rules(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Spec struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Alert string `json:"alert"`
					Expr  string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(b, &doc, yaml.DisallowUnknownFields); err != nil {
		// Strict on the fields read only: the rest of the rule is checked by test/packaging/chart.
		if err := yaml.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
	}
	var out []query
	for _, g := range doc.Spec.Groups {
		for _, r := range g.Rules {
			out = append(out, query{where: fmt.Sprintf("%s: alert %s", rulesFile, r.Alert), expr: r.Expr})
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no rules", rulesFile)
	}
	return out
}

// grafanaPanel is the part of a dashboard panel that holds queries.
type grafanaPanel struct {
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a collapsed row's
}

// dashboard returns the panel queries and the template variables' label_values queries.
func dashboard(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels     []grafanaPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var out []query
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			for i, tg := range p.Targets {
				out = append(out, query{where: fmt.Sprintf("%s: panel %q target %d", dashboardFile, p.Title, i), expr: tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var text string
		switch q := v.Query.(type) {
		case string:
			text = q
		case map[string]any:
			text, _ = q["query"].(string)
		}
		m := labelValues.FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("%s: variable %s: want label_values(<selector>, <label>), got %q", dashboardFile, v.Name, text)
		}
		// The variable's label must be on the selected series: select it with a matcher.
		sel := m[1]
		if !strings.Contains(sel, "{") {
			sel += "{}"
		}
		sel = strings.Replace(sel, "{", "{"+m[2]+`=~".+", `, 1)
		sel = strings.Replace(sel, ", }", "}", 1)
		out = append(out, query{where: fmt.Sprintf("%s: variable %s", dashboardFile, v.Name), expr: sel})
	}
	if len(out) < 10 {
		t.Fatalf("%s: only %d queries", dashboardFile, len(out))
	}
	return out
}

// grafanaVars are Grafana's macros and the dashboard's variables, replaced before parsing.
var grafanaVars = regexp.MustCompile(`\$(__rate_interval|__interval|__range)\b|\$\{[a-zA-Z_][a-zA-Z0-9_:]*\}|\$[a-zA-Z_][a-zA-Z0-9_]*`)

// promql is expr with Grafana's macros as PromQL durations and variables as a plain value.
func promql(expr string) string {
	return grafanaVars.ReplaceAllStringFunc(expr, func(m string) string {
		if strings.HasPrefix(m, "$__") {
			return "5m"
		}
		return "value"
	})
}

var promParser = parser.NewParser(parser.Options{})

// selectorUse is a metric an expression selects and the label matchers it selects it with.
type selectorUse struct {
	metric   string
	matchers []*labels.Matcher
}

// parse parses q and returns the vector selectors it holds.
func parse(q query) ([]selectorUse, error) {
	e, err := promParser.ParseExpr(promql(q.expr))
	if err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", q.where, err, q.expr)
	}
	var out []selectorUse
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		u := selectorUse{metric: vs.Name}
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel {
				if u.metric == "" && m.Type == labels.MatchEqual {
					u.metric = m.Value
				}
				continue
			}
			u.matchers = append(u.matchers, m)
		}
		out = append(out, u)
		return nil
	})
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: selects no metric: %s", q.where, q.expr)
	}
	for _, u := range out {
		if u.metric == "" {
			return nil, fmt.Errorf("%s: a selector without a metric name: %s", q.where, q.expr)
		}
	}
	return out, nil
}

// keda returns the Prometheus trigger queries of the KEDA example's ScaledObjects.
func keda(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, kedaFile))
	if err != nil {
		t.Fatal(err)
	}
	var out []query
	for i, doc := range strings.Split(string(b), "\n---\n") {
		var so struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec struct {
				Triggers []struct {
					Type     string            `json:"type"`
					Name     string            `json:"name"`
					Metadata map[string]string `json:"metadata"`
				} `json:"triggers"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &so); err != nil {
			t.Fatalf("%s: document %d: %v", kedaFile, i, err)
		}
		for _, tr := range so.Spec.Triggers {
			if tr.Type != "prometheus" || tr.Metadata["query"] == "" {
				t.Fatalf("%s: %s trigger %s: want a prometheus trigger with a query", kedaFile, so.Metadata.Name, tr.Name)
			}
			out = append(out, query{where: fmt.Sprintf("%s: ScaledObject %s trigger %s", kedaFile, so.Metadata.Name, tr.Name), expr: tr.Metadata["query"]})
		}
	}
	if len(out) < 2 {
		t.Fatalf("%s: only %d queries", kedaFile, len(out))
	}
	return out
}

func TestExpressionsParse(t *testing.T) {
	for _, q := range slices.Concat(rules(t), dashboard(t), keda(t)) {
		if _, err := parse(q); err != nil {
			t.Error(err)
		}
	}
}

// The substitution itself: a broken expression must not parse after it.
func TestPromQLSubstitution(t *testing.T) {
	if got := promql(`rate(x{a=~"$namespace", b="${pipeline}"}[$__rate_interval])`); got != `rate(x{a=~"value", b="value"}[5m])` {
		t.Fatalf("got %s", got)
	}
	if _, err := parse(query{where: "test", expr: `sum(rate(x[$__rate_interval])`}); err == nil {
		t.Fatal("an unbalanced expression parsed")
	}
}

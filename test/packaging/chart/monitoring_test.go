package chart_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/epd-dev/coordinator/internal/controller"
	"github.com/epd-dev/coordinator/internal/packaging"
)

// The monitoring objects (templates/monitoring): off by default; on, they select what the chart
// and the operator actually run, and carry the same alerts and dashboard as config/prometheus and
// config/grafana. test/packaging/monitoring checks the PromQL and the metric names.

const monitoringAPI = "monitoring.coreos.com/v1"

func TestMonitoringOffByDefault(t *testing.T) {
	g := NewWithT(t)
	r := render(t, namespace, nil)
	for _, kind := range []string{"ServiceMonitor", "PodMonitor", "PrometheusRule"} {
		g.Expect(r.count(kind)).To(BeZero(), kind)
	}
	for _, cm := range packaging.Find(r.objs, "ConfigMap") {
		g.Expect(cm.GetLabels()).NotTo(HaveKey("grafana_dashboard"))
	}
}

func TestMonitoringObjects(t *testing.T) {
	g := NewWithT(t)
	r := render(t, namespace, mustYAML(t, `
monitoring:
  labels: {release: kube-prometheus-stack}
  serviceMonitor: {enabled: true, interval: 15s, scrapeTimeout: 10s}
  podMonitor: {enabled: true, metricRelabelings: [{action: drop, regex: go_.*, sourceLabels: [__name__]}]}
  prometheusRule: {enabled: true}
  grafanaDashboard: {enabled: true, namespace: grafana}`))

	// The ServiceMonitor selects the metrics Service in the release namespace, by its port name,
	// with the token and TLS that metrics.secure (the default) needs.
	svc := r.get(t, "Service", releaseName+"-metrics")
	sm := r.get(t, "ServiceMonitor", releaseName+"-metrics")
	g.Expect(sm.GetAPIVersion()).To(Equal(monitoringAPI))
	g.Expect(sm.GetNamespace()).To(Equal(namespace))
	g.Expect(sm.GetLabels()).To(HaveKeyWithValue("release", "kube-prometheus-stack"))
	sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	g.Expect(sel).NotTo(BeEmpty())
	for k, v := range sel {
		g.Expect(svc.GetLabels()).To(HaveKeyWithValue(k, v), "the ServiceMonitor selects the metrics Service")
	}
	g.Expect(nested(sm, "spec", "namespaceSelector", "matchNames")).To(Equal([]any{namespace}))
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	g.Expect(endpoints).To(HaveLen(1))
	ep := endpoints[0].(map[string]any)
	g.Expect(ep).To(HaveKeyWithValue("port", ports[0].(map[string]any)["name"]))
	g.Expect(ep).To(HaveKeyWithValue("scheme", "https"))
	g.Expect(ep).To(HaveKeyWithValue("honorLabels", true))
	g.Expect(ep).To(HaveKeyWithValue("interval", "15s"))
	g.Expect(ep).To(HaveKeyWithValue("scrapeTimeout", "10s"))
	g.Expect(ep).To(HaveKey("bearerTokenFile"))
	g.Expect(ep).To(HaveKeyWithValue("tlsConfig", map[string]any{"insecureSkipVerify": true}))

	// The PodMonitor selects the labels the operator puts on coordinator pods, on the port it
	// names, in every namespace, and sets the pipeline label the dashboard and alerts use.
	pm := r.get(t, "PodMonitor", releaseName+"-coordinators")
	g.Expect(pm.GetAPIVersion()).To(Equal(monitoringAPI))
	g.Expect(pm.GetLabels()).To(HaveKeyWithValue("release", "kube-prometheus-stack"))
	expectCoordinatorPodMonitor(g, pm)
	g.Expect(nested(pm, "spec", "namespaceSelector", "any")).To(BeTrue())
	pmEndpoints, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	g.Expect(pmEndpoints[0]).To(HaveKeyWithValue("scheme", "http"))
	g.Expect(pmEndpoints[0]).To(HaveKey("metricRelabelings"))

	// The alerts are config/prometheus's, the dashboard config/grafana's.
	rule := r.get(t, "PrometheusRule", releaseName+"-alerts")
	g.Expect(rule.GetAPIVersion()).To(Equal(monitoringAPI))
	g.Expect(rule.Object["spec"]).To(Equal(kustomizeRuleSpec(t)))

	cm := r.get(t, "ConfigMap", releaseName+"-grafana-dashboard")
	g.Expect(cm.GetNamespace()).To(Equal("grafana"))
	g.Expect(cm.GetLabels()).To(HaveKeyWithValue("grafana_dashboard", "1"))
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	want, err := os.ReadFile(filepath.Join(root, packaging.DashboardSource))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(data["coordinator-dashboard.json"]).To(MatchJSON(want))
	var dash map[string]any
	g.Expect(json.Unmarshal([]byte(data["coordinator-dashboard.json"]), &dash)).To(Succeed())
	g.Expect(dash).To(HaveKeyWithValue("uid", "epd-coordinator"))
}

// With watchNamespace the PodMonitor looks there only; plain-HTTP metrics are scraped without a
// token; a ServiceMonitor without the metrics Service is refused.
func TestMonitoringValues(t *testing.T) {
	g := NewWithT(t)
	r := render(t, namespace, mustYAML(t, `
watchNamespace: inference
metrics: {secure: false}
monitoring: {serviceMonitor: {enabled: true}, podMonitor: {enabled: true, scheme: https, tlsConfig: {insecureSkipVerify: true}}}`))
	pm := r.get(t, "PodMonitor", "")
	g.Expect(nested(pm, "spec", "namespaceSelector", "matchNames")).To(Equal([]any{"inference"}))
	pmEndpoints, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	g.Expect(pmEndpoints[0]).To(HaveKeyWithValue("scheme", "https"))
	g.Expect(pmEndpoints[0]).To(HaveKeyWithValue("tlsConfig", map[string]any{"insecureSkipVerify": true}))
	sm := r.get(t, "ServiceMonitor", "")
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	g.Expect(endpoints[0]).To(HaveKeyWithValue("port", "http"))
	g.Expect(endpoints[0]).To(HaveKeyWithValue("scheme", "http"))
	g.Expect(endpoints[0]).NotTo(HaveKey("bearerTokenFile"))

	_, err := tryRender(loadChart(t), namespace, mustYAML(t, `{metrics: {enabled: false}, monitoring: {serviceMonitor: {enabled: true}}}`))
	g.Expect(err).To(MatchError(ContainSubstring("monitoring.serviceMonitor.enabled needs metrics.enabled")))
	_, err = tryRender(loadChart(t), namespace, mustYAML(t, `{monitoring: {podMonitor: {interval: often}}}`))
	g.Expect(err).To(HaveOccurred(), "the schema checks durations")
}

// config/prometheus: the ServiceMonitor selects config/default's metrics Service, the PodMonitor
// the coordinator pods; both render with kustomize.
func TestKustomizeMonitors(t *testing.T) {
	g := NewWithT(t)
	objs, err := packaging.Kustomize(root, "config/prometheus")
	g.Expect(err).NotTo(HaveOccurred())
	def, err := packaging.Kustomize(root, "config/default")
	g.Expect(err).NotTo(HaveOccurred())
	svcs := packaging.Find(def, "Service")
	g.Expect(svcs).To(HaveLen(1))
	svc := svcs[0]

	sms := packaging.Find(objs, "ServiceMonitor")
	g.Expect(sms).To(HaveLen(1))
	sm := sms[0]
	g.Expect(sm.GetAPIVersion()).To(Equal(monitoringAPI))
	g.Expect(sm.GetNamespace()).To(Equal(svc.GetNamespace()))
	sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	g.Expect(sel).NotTo(BeEmpty())
	for k, v := range sel {
		g.Expect(svc.GetLabels()).To(HaveKeyWithValue(k, v), "the ServiceMonitor selects config/default's metrics Service")
	}
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	g.Expect(endpoints[0]).To(HaveKeyWithValue("port", ports[0].(map[string]any)["name"]))
	g.Expect(endpoints[0]).To(HaveKeyWithValue("honorLabels", true))

	pms := packaging.Find(objs, "PodMonitor")
	g.Expect(pms).To(HaveLen(1))
	expectCoordinatorPodMonitor(g, pms[0])

	rules := packaging.Find(objs, "PrometheusRule")
	g.Expect(rules).To(HaveLen(1))
	g.Expect(rules[0].GetAPIVersion()).To(Equal(monitoringAPI))
	expectRules(g, rules[0].Object["spec"])

	cms, err := packaging.Kustomize(root, "config/grafana")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cms).To(HaveLen(1))
	g.Expect(cms[0].GetLabels()).To(HaveKeyWithValue("grafana_dashboard", "1"))
	g.Expect(cms[0].Object["data"]).To(HaveKey("coordinator-dashboard.json"))
}

// expectCoordinatorPodMonitor checks a PodMonitor against the coordinator pods the operator
// renders (controllers: labels, the admin container port's name).
func expectCoordinatorPodMonitor(g Gomega, pm *unstructured.Unstructured) {
	g.Expect(pm.GetAPIVersion()).To(Equal(monitoringAPI))
	sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	g.Expect(sel).To(Equal(map[string]string{controller.LabelName: controller.AppName, controller.LabelManagedBy: controller.ManagedBy}))
	endpoints, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	g.Expect(endpoints).To(HaveLen(1))
	ep := endpoints[0].(map[string]any)
	g.Expect(ep).To(HaveKeyWithValue("port", "metrics"))
	g.Expect(ep).To(HaveKeyWithValue("path", "/metrics"))
	g.Expect(ep["relabelings"]).To(ContainElement(map[string]any{
		"sourceLabels": []any{"__meta_kubernetes_pod_label_" + labelName(controller.LabelInstance)}, "targetLabel": "pipeline",
	}))
}

// labelName is a Kubernetes label key as Prometheus's service discovery spells it.
func labelName(key string) string {
	b := []byte(key)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	return string(b)
}

// kustomizeRuleSpec is the spec of config/prometheus's PrometheusRule.
func kustomizeRuleSpec(t *testing.T) any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, packaging.RulesSource))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	return doc["spec"]
}

// expectRules checks the shape of a PrometheusRule spec: every rule an alert with an
// expression, a severity, a summary and a description, names unique.
func expectRules(g Gomega, spec any) {
	groups := spec.(map[string]any)["groups"].([]any)
	g.Expect(groups).NotTo(BeEmpty())
	seen := map[string]bool{}
	for _, gr := range groups {
		group := gr.(map[string]any)
		g.Expect(group["name"]).NotTo(BeEmpty())
		for _, r := range group["rules"].([]any) {
			rule := r.(map[string]any)
			name, _ := rule["alert"].(string)
			g.Expect(name).NotTo(BeEmpty(), "every rule is an alert")
			g.Expect(seen).NotTo(HaveKey(name), "alert names are unique")
			seen[name] = true
			g.Expect(rule["expr"]).NotTo(BeEmpty(), name)
			g.Expect(rule["labels"]).To(HaveKeyWithValue("severity", BeElementOf("info", "warning", "critical")), name)
			g.Expect(rule["annotations"]).To(And(HaveKey("summary"), HaveKey("description")), name)
		}
	}
}

func mustYAML(t *testing.T, s string) map[string]any {
	t.Helper()
	var v map[string]any
	if err := yaml.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// nested is the field of u at path (nil when absent).
func nested(u *unstructured.Unstructured, path ...string) any {
	v, _, _ := unstructured.NestedFieldNoCopy(u.Object, path...)
	return v
}

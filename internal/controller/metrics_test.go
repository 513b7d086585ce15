package controller

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

func TestRecordOutcomeCountsConditionReasons(t *testing.T) {
	cp := &coordinatorv1alpha1.CoordinatorPipeline{}
	cp.Status.Conditions = []metav1.Condition{
		{Type: "PipelineValid", Status: metav1.ConditionFalse, Reason: "InvalidPipeline"},
		{Type: "Ready", Status: metav1.ConditionFalse, Reason: "NoValidConfig"},
	}
	before := testutil.ToFloat64(reconcileOutcomes.WithLabelValues("PipelineValid", "False", "InvalidPipeline"))
	recordOutcome(cp)
	recordOutcome(cp)
	if got := testutil.ToFloat64(reconcileOutcomes.WithLabelValues("PipelineValid", "False", "InvalidPipeline")); got != before+2 {
		t.Fatalf("count %v", got-before)
	}
	if testutil.ToFloat64(reconcileOutcomes.WithLabelValues("Ready", "False", "NoValidConfig")) < 2 {
		t.Fatal("Ready outcome not counted")
	}
}

// conditionSeries returns the coordinatorpipeline_status_condition series of namespace/name as
// "type/status" -> value.
func conditionSeries(t testing.TB, namespace, name string) map[string]float64 {
	t.Helper()
	return gatheredSeries(t, "coordinatorpipeline_status_condition", namespace, name, "type", "status")
}

// gatheredSeries reads family from the controller-runtime registry (what the manager serves)
// and returns the series of namespace/name keyed by the values of keys joined with "/".
func gatheredSeries(t testing.TB, family, namespace, name string, keys ...string) map[string]float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != family {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["namespace"] != namespace || l["name"] != name {
				continue
			}
			var key []string
			for _, k := range keys {
				key = append(key, l[k])
			}
			out[strings.Join(key, "/")] = m.GetGauge().GetValue()
		}
	}
	return out
}

func TestStatusConditionMetricFollowsTheStatus(t *testing.T) {
	cp := &coordinatorv1alpha1.CoordinatorPipeline{}
	cp.Namespace, cp.Name = "metrics-unit", "epd"
	cp.Status.ConfigRevision = "rev-1"
	cp.Status.Conditions = []metav1.Condition{
		{Type: "PipelineValid", Status: metav1.ConditionTrue, Reason: "Valid"},
		{Type: "Ready", Status: metav1.ConditionFalse, Reason: "DeploymentNotReady"},
		{Type: "RouteAccepted", Status: metav1.ConditionUnknown, Reason: "Pending"},
	}
	recordOutcome(cp)
	want := map[string]float64{
		"PipelineValid/True": 1, "PipelineValid/False": 0, "PipelineValid/Unknown": 0,
		"Ready/True": 0, "Ready/False": 1, "Ready/Unknown": 0,
		"RouteAccepted/True": 0, "RouteAccepted/False": 0, "RouteAccepted/Unknown": 1,
	}
	if got := conditionSeries(t, cp.Namespace, cp.Name); !maps.Equal(got, want) {
		t.Fatalf("series %v, want %v", got, want)
	}
	if got := gatheredSeries(t, "coordinatorpipeline_config_revision_info", cp.Namespace, cp.Name, "revision"); !maps.Equal(got, map[string]float64{"rev-1": 1}) {
		t.Fatalf("revision series %v", got)
	}

	// Ready turns True, RouteAccepted leaves the status (spec.route unset), the revision changes.
	cp.Status.ConfigRevision = "rev-2"
	cp.Status.Conditions = cp.Status.Conditions[:2]
	cp.Status.Conditions[1].Status = metav1.ConditionTrue
	recordOutcome(cp)
	want = map[string]float64{
		"PipelineValid/True": 1, "PipelineValid/False": 0, "PipelineValid/Unknown": 0,
		"Ready/True": 1, "Ready/False": 0, "Ready/Unknown": 0,
	}
	if got := conditionSeries(t, cp.Namespace, cp.Name); !maps.Equal(got, want) {
		t.Fatalf("after the change: series %v, want %v", got, want)
	}
	if got := gatheredSeries(t, "coordinatorpipeline_config_revision_info", cp.Namespace, cp.Name, "revision"); !maps.Equal(got, map[string]float64{"rev-2": 1}) {
		t.Fatalf("after the change: revision series %v", got)
	}

	// Another error than NotFound keeps the series; NotFound (the object is gone) drops them.
	key := types.NamespacedName{Namespace: cp.Namespace, Name: cp.Name}
	if err := forgetDeleted(key, errors.New("timeout")); err == nil || len(conditionSeries(t, cp.Namespace, cp.Name)) == 0 {
		t.Fatal("a read error dropped the series")
	}
	notFound := apierrors.NewNotFound(schema.GroupResource{Group: coordinatorv1alpha1.GroupVersion.Group, Resource: "coordinatorpipelines"}, cp.Name)
	if err := forgetDeleted(key, notFound); !apierrors.IsNotFound(err) {
		t.Fatalf("forgetDeleted returned %v", err)
	}
	if got := conditionSeries(t, cp.Namespace, cp.Name); len(got) != 0 {
		t.Fatalf("series left after deletion: %v", got)
	}
	if got := gatheredSeries(t, "coordinatorpipeline_config_revision_info", cp.Namespace, cp.Name, "revision"); len(got) != 0 {
		t.Fatalf("revision series left after deletion: %v", got)
	}
}

// Through the manager: a reconcile exports the pipeline's conditions (an invalid pipeline as
// PipelineValid False), and deleting the CoordinatorPipeline removes its series.
func TestStatusConditionMetricInTheManager(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ns := e.namespace(t)
	e.createPool(t, ns, "pool")
	e.createPipeline(t, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Pipeline.Steps[1].Params = params(map[string]any{"kv_conector": "kv-nixl"})
	})
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionFalse, coordinatorv1alpha1.ReasonInvalidPipeline)
	})
	g.Eventually(func(g Gomega) {
		got := conditionSeries(t, ns, "epd")
		g.Expect(got).To(HaveKeyWithValue("PipelineValid/False", 1.0))
		g.Expect(got).To(HaveKeyWithValue("PipelineValid/True", 0.0))
		g.Expect(got).To(HaveKeyWithValue("Ready/False", 1.0))
	}).Should(Succeed())

	g.Expect(e.client.Delete(context.Background(), e.get(g, ns, "epd"))).To(Succeed())
	g.Eventually(func() map[string]float64 { return conditionSeries(t, ns, "epd") }).Should(BeEmpty())
}

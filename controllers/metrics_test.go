package controllers

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

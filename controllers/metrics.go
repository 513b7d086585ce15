package controllers

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// reconcileOutcomes counts every reconcile by the conditions it left on the CoordinatorPipeline,
// next to controller-runtime's own controller_runtime_reconcile_* metrics: a rising
// {condition="PipelineValid",status="False",reason="InvalidPipeline"} is a user pushing a broken
// pipeline; {condition="Ready",status="False",reason="DeploymentNotReady"} a rollout that hangs.
var reconcileOutcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "coordinatorpipeline_reconcile_outcomes_total",
	Help: "CoordinatorPipeline reconciles by the resulting condition type, status and reason.",
}, []string{"condition", "status", "reason"})

func init() { metrics.Registry.MustRegister(reconcileOutcomes) }

// recordOutcome counts the conditions a reconcile left.
func recordOutcome(cp *coordinatorv1alpha1.CoordinatorPipeline) {
	for _, c := range cp.Status.Conditions {
		reconcileOutcomes.WithLabelValues(c.Type, string(c.Status), c.Reason).Inc()
	}
}

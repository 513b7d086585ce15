package controller

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// The operator's own metrics, served with controller-runtime's (controller_runtime_reconcile_*,
// workqueue_*, rest_client_*) on the manager's metrics endpoint. The dashboard and alerts shipped
// in config/grafana, config/prometheus and the chart query them (test/packaging/monitoring checks that
// every series they use is exported).
var (
	// reconcileOutcomes counts every reconcile by the conditions it left on the
	// CoordinatorPipeline: a rising {condition="PipelineValid",status="False",reason="InvalidPipeline"}
	// is a user pushing a broken pipeline; {condition="Ready",status="False",reason="DeploymentNotReady"}
	// a rollout that hangs.
	reconcileOutcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "coordinatorpipeline_reconcile_outcomes_total",
		Help: "CoordinatorPipeline reconciles by the resulting condition type, status and reason.",
	}, []string{"condition", "status", "reason"})

	// statusCondition is each CoordinatorPipeline's conditions as kube-state-metrics and Flux
	// export them: per object and condition type, 1 for the current status and 0 for the other
	// two, so that `== 1` selects the current one and an alert on {status="False"} resolves when
	// the series drops to 0. Set on every reconcile; deleted with the object.
	statusCondition = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "coordinatorpipeline_status_condition",
		Help: "The status of each CoordinatorPipeline condition: 1 for the current status (True, False or Unknown), 0 for the others.",
	}, []string{"namespace", "name", "type", "status"})

	// configRevision is 1 for the configuration revision in each CoordinatorPipeline's status (the
	// one in its ConfigMap); the coordinators report the revision they loaded as
	// coordinator_config_info{revision}, so the two join to find pods on another revision.
	configRevision = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "coordinatorpipeline_config_revision_info",
		Help: "1 for the configuration revision of each CoordinatorPipeline's ConfigMap (status.configRevision).",
	}, []string{"namespace", "name", "revision"})
)

func init() { metrics.Registry.MustRegister(reconcileOutcomes, statusCondition, configRevision) }

// conditionStatuses are the values of the status label of coordinatorpipeline_status_condition.
var conditionStatuses = []metav1.ConditionStatus{metav1.ConditionTrue, metav1.ConditionFalse, metav1.ConditionUnknown}

// exported remembers, per CoordinatorPipeline, the condition types and revision last exported,
// so that a type that left the status (RouteAccepted when spec.route is unset) and a previous
// revision lose their series.
var exported = struct {
	sync.Mutex
	objects map[types.NamespacedName]exportedState
}{objects: map[types.NamespacedName]exportedState{}}

type exportedState struct {
	types    map[string]bool
	revision string
}

// recordOutcome counts the conditions a reconcile left and exports the object's condition and
// revision gauges.
func recordOutcome(cp *coordinatorv1alpha1.CoordinatorPipeline) {
	for _, c := range cp.Status.Conditions {
		reconcileOutcomes.WithLabelValues(c.Type, string(c.Status), c.Reason).Inc()
	}
	recordStatus(cp)
}

// recordStatus sets cp's coordinatorpipeline_status_condition and
// coordinatorpipeline_config_revision_info series and drops the ones that no longer apply.
func recordStatus(cp *coordinatorv1alpha1.CoordinatorPipeline) {
	key := types.NamespacedName{Namespace: cp.Namespace, Name: cp.Name}
	now := exportedState{types: map[string]bool{}, revision: cp.Status.ConfigRevision}
	exported.Lock()
	defer exported.Unlock()
	for _, c := range cp.Status.Conditions {
		now.types[c.Type] = true
		for _, s := range conditionStatuses {
			v := 0.0
			if c.Status == s {
				v = 1
			}
			statusCondition.WithLabelValues(cp.Namespace, cp.Name, c.Type, string(s)).Set(v)
		}
	}
	prev := exported.objects[key]
	for t := range prev.types {
		if !now.types[t] {
			statusCondition.DeletePartialMatch(prometheus.Labels{"namespace": cp.Namespace, "name": cp.Name, "type": t})
		}
	}
	if prev.revision != "" && prev.revision != now.revision {
		configRevision.DeleteLabelValues(cp.Namespace, cp.Name, prev.revision)
	}
	if now.revision != "" {
		configRevision.WithLabelValues(cp.Namespace, cp.Name, now.revision).Set(1)
	}
	exported.objects[key] = now
}

// forgetDeleted drops the series of the CoordinatorPipeline key when err says it is gone (the
// reconcile of a deleted object reads NotFound), and returns err.
func forgetDeleted(key types.NamespacedName, err error) error {
	if apierrors.IsNotFound(err) {
		forget(key)
	}
	return err
}

// forget drops every series of the CoordinatorPipeline key.
func forget(key types.NamespacedName) {
	exported.Lock()
	defer exported.Unlock()
	match := prometheus.Labels{"namespace": key.Namespace, "name": key.Name}
	statusCondition.DeletePartialMatch(match)
	configRevision.DeletePartialMatch(match)
	delete(exported.objects, key)
}

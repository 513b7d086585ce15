package controller

import (
	"context"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// DefaultInFlightMetricName is the Pods metric the autoscaler reads the coordinators' requests in
// flight as, unless spec.autoscaling.inFlightMetricName names another: the data plane's gauge.
const DefaultInFlightMetricName = "coordinator_requests_in_flight"

// desiredHorizontalPodAutoscaler scales cp's coordinators (through cp's scale subresource, whose
// spec.replicas the operator carries to the Deployment) between spec.autoscaling's bounds on
// their CPU utilization and their requests in flight per pod.
func desiredHorizontalPodAutoscaler(cp *coordinatorv1alpha1.CoordinatorPipeline) *autoscalingv2.HorizontalPodAutoscaler {
	spec := cp.Spec.Autoscaling
	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: childMeta(cp, cp.Name),
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{
				APIVersion: coordinatorv1alpha1.GroupVersion.String(),
				Kind:       "CoordinatorPipeline",
				Name:       cp.Name,
			},
			MinReplicas: ptr.To(ptr.Deref(spec.MinReplicas, 1)),
			MaxReplicas: spec.MaxReplicas,
		},
	}
	if p := spec.TargetCPUUtilizationPercent; p != nil {
		hpa.Spec.Metrics = append(hpa.Spec.Metrics, autoscalingv2.MetricSpec{
			Type: autoscalingv2.ResourceMetricSourceType,
			Resource: &autoscalingv2.ResourceMetricSource{
				Name:   corev1.ResourceCPU,
				Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To(*p)},
			},
		})
	}
	if n := spec.TargetInFlightRequests; n != nil {
		name := spec.InFlightMetricName
		if name == "" {
			name = DefaultInFlightMetricName
		}
		hpa.Spec.Metrics = append(hpa.Spec.Metrics, autoscalingv2.MetricSpec{
			Type: autoscalingv2.PodsMetricSourceType,
			Pods: &autoscalingv2.PodsMetricSource{
				Metric: autoscalingv2.MetricIdentifier{Name: name},
				Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: resource.NewQuantity(int64(*n), resource.DecimalSI)},
			},
		})
	}
	return hpa
}

// reconcileHorizontalPodAutoscaler creates, updates or deletes the HorizontalPodAutoscaler of
// spec.autoscaling.
func (r *CoordinatorPipelineReconciler) reconcileHorizontalPodAutoscaler(ctx context.Context, s *scope) error {
	if s.cp.Spec.Autoscaling == nil {
		return deleteChild[autoscalingv2.HorizontalPodAutoscaler](ctx, r, s.cp, s.cp.Name)
	}
	_, _, err := ensureChild(ctx, r, s.cp, desiredHorizontalPodAutoscaler(s.cp))
	return err
}

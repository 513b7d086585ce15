package controller

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// spec.autoscaling renders a HorizontalPodAutoscaler owned by the pipeline that the API server
// accepts, targeting the pipeline's scale subresource; a scale written there (as the autoscaler
// writes it) reaches the Deployment and reads back through the subresource with the pods'
// selector; spec changes update the autoscaler, hand edits are reverted, and removing
// spec.autoscaling deletes it, leaving the replicas where the autoscaler put them.
func TestAutoscalingLifecycle(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ctx := context.Background()
	ns := e.namespace(t)
	cp := e.readyPipeline(t, g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Autoscaling = &coordinatorv1alpha1.AutoscalingSpec{MaxReplicas: 5, TargetCPUUtilizationPercent: ptr.To[int32](70), TargetInFlightRequests: ptr.To[int32](16)}
	})
	key := client.ObjectKey{Namespace: ns, Name: "epd"}

	hpa := &autoscalingv2.HorizontalPodAutoscaler{}
	g.Expect(e.client.Get(ctx, key, hpa)).To(Succeed())
	expectOwnedBy(g, hpa, cp)
	g.Expect(hpa.Spec.ScaleTargetRef).To(Equal(autoscalingv2.CrossVersionObjectReference{APIVersion: "coordinator.epd.dev/v1alpha1", Kind: "CoordinatorPipeline", Name: "epd"}))
	g.Expect(hpa.Spec.MinReplicas).To(Equal(ptr.To[int32](1)), "the default")
	g.Expect(hpa.Spec.MaxReplicas).To(Equal(int32(5)))
	g.Expect(hpa.Spec.Metrics).To(HaveLen(2))
	g.Expect(hpa.Spec.Metrics[0].Resource.Name).To(Equal(corev1.ResourceCPU))
	g.Expect(hpa.Spec.Metrics[0].Resource.Target.AverageUtilization).To(Equal(ptr.To[int32](70)))
	g.Expect(hpa.Spec.Metrics[1].Pods.Metric.Name).To(Equal(DefaultInFlightMetricName))
	g.Expect(hpa.Spec.Metrics[1].Pods.Target.AverageValue.Cmp(resource.MustParse("16"))).To(Equal(0))

	// The autoscaler scales through the pipeline's scale subresource: the Deployment follows,
	// and the subresource reads back the new replicas and the coordinator pods' selector.
	g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error { // the reconciler writes the status meanwhile
		scale := &autoscalingv1.Scale{}
		if err := e.client.SubResource("scale").Get(ctx, cp, scale); err != nil {
			return err
		}
		scale.Spec.Replicas = 3
		return e.client.SubResource("scale").Update(ctx, cp, client.WithSubResourceBody(scale))
	})).To(Succeed())
	dep := &appsv1.Deployment{}
	g.Eventually(func(g Gomega) {
		g.Expect(e.client.Get(ctx, key, dep)).To(Succeed())
		g.Expect(dep.Spec.Replicas).To(Equal(ptr.To[int32](3)))
	}).Should(Succeed())
	e.markDeploymentAvailable(g, ns, "epd")
	g.Eventually(func(g Gomega) {
		got := &autoscalingv1.Scale{}
		g.Expect(e.client.SubResource("scale").Get(ctx, cp, got)).To(Succeed())
		g.Expect(got.Spec.Replicas).To(Equal(int32(3)))
		g.Expect(got.Status.Replicas).To(Equal(int32(3)))
		g.Expect(got.Status.Selector).To(Equal(metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: selectorLabels(cp)})))
	}).Should(Succeed())

	// Hand edits are reverted.
	hpa.Spec.MaxReplicas = 50
	g.Expect(e.client.Update(ctx, hpa)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(e.client.Get(ctx, key, hpa)).To(Succeed())
		g.Expect(hpa.Spec.MaxReplicas).To(Equal(int32(5)))
	}).Should(Succeed())

	// Spec changes reach it.
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Autoscaling = &coordinatorv1alpha1.AutoscalingSpec{MinReplicas: ptr.To[int32](2), MaxReplicas: 8, TargetInFlightRequests: ptr.To[int32](32), InFlightMetricName: "coordinator_inflight"}
	})
	g.Eventually(func(g Gomega) {
		g.Expect(e.client.Get(ctx, key, hpa)).To(Succeed())
		g.Expect(hpa.Spec.MinReplicas).To(Equal(ptr.To[int32](2)))
		g.Expect(hpa.Spec.MaxReplicas).To(Equal(int32(8)))
		g.Expect(hpa.Spec.Metrics).To(HaveLen(1), "no CPU target any more")
		g.Expect(hpa.Spec.Metrics[0].Pods.Metric.Name).To(Equal("coordinator_inflight"))
		g.Expect(hpa.Spec.Metrics[0].Pods.Target.AverageValue.Cmp(resource.MustParse("32"))).To(Equal(0))
	}).Should(Succeed())

	// Removing spec.autoscaling deletes it; the replicas stay where the autoscaler left them.
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Autoscaling = nil })
	g.Eventually(func(g Gomega) {
		g.Expect(apierrors.IsNotFound(e.client.Get(ctx, key, &autoscalingv2.HorizontalPodAutoscaler{}))).To(BeTrue())
	}).Should(Succeed())
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionTrue, coordinatorv1alpha1.ReasonReady)
		g.Expect(cp.Spec.Replicas).To(Equal(ptr.To[int32](3)))
	})
	g.Expect(e.client.Get(ctx, key, dep)).To(Succeed())
	g.Expect(dep.Spec.Replicas).To(Equal(ptr.To[int32](3)))
}

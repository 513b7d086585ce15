package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// A phase that fails ends the reconcile with an error naming it, and the Degraded and Ready
// conditions carry that message. Every phase that can fail has a case: reading the object it
// works on fails.
func TestReconcileErrorNamesThePhase(t *testing.T) {
	tests := map[string]struct {
		failGet  client.Object     // reads of this type fail
		failList client.ObjectList // lists of this type fail
		mutate   func(*coordinatorv1alpha1.CoordinatorPipeline)
	}{
		"InferencePool reference": {failGet: &infv1.InferencePool{}},
		"gateway address": {failGet: &gatewayv1.Gateway{}, mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Gateway = coordinatorv1alpha1.GatewaySpec{GatewayRef: &coordinatorv1alpha1.GatewayReference{Name: "gw"}}
		}},
		"TLS references": {failGet: &metav1.PartialObjectMetadata{}, mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Server.TLS = &coordinatorv1alpha1.ServerTLSSpec{SecretName: "coordinator-tls"}
		}},
		// Reading the ConfigMap of a tokenizer (the reconciler has no metadata cache here: it asks
		// the API server).
		"pipeline configuration": {failGet: &corev1.ConfigMap{}, mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Tokenizers = []coordinatorv1alpha1.Tokenizer{{Name: "qwen", ConfigMap: &coordinatorv1alpha1.TokenizerConfigMapSource{Name: "qwen-tokenizer"}}}
		}},
		"ServiceAccount":          {failGet: &corev1.ServiceAccount{}},
		"ConfigMap":               {failGet: &corev1.ConfigMap{}},
		"Service":                 {failGet: &corev1.Service{}},
		"NetworkPolicy":           {failGet: &networkingv1.NetworkPolicy{}},
		"PodDisruptionBudget":     {failGet: &policyv1.PodDisruptionBudget{}},
		"HorizontalPodAutoscaler": {failGet: &autoscalingv2.HorizontalPodAutoscaler{}},
		"Deployment":              {failGet: &appsv1.Deployment{}},
		"HTTPRoute":               {failGet: &gatewayv1.HTTPRoute{}},
		"coordinator pods":        {failList: &corev1.PodList{}},
	}
	var names []string
	for _, p := range (&CoordinatorPipelineReconciler{}).phases() {
		names = append(names, p.name)
	}
	NewWithT(t).Expect(slices.Sorted(maps.Keys(tests))).To(Equal(slices.Sorted(slices.Values(names))), "one case per phase")

	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			cp := newPipeline("ns", "epd")
			if tc.mutate != nil {
				tc.mutate(cp)
			}
			boom := errors.New("boom")
			c := fake.NewClientBuilder().WithScheme(NewScheme()).
				WithObjects(cp).WithStatusSubresource(cp).
				WithInterceptorFuncs(interceptor.Funcs{
					Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
						if tc.failGet != nil && reflect.TypeOf(obj) == reflect.TypeOf(tc.failGet) {
							return boom
						}
						return c.Get(ctx, key, obj, opts...)
					},
					List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
						if tc.failList != nil && reflect.TypeOf(list) == reflect.TypeOf(tc.failList) {
							return boom
						}
						return c.List(ctx, list, opts...)
					},
				}).Build()
			r := &CoordinatorPipelineReconciler{Client: c, APIReader: c, Recorder: events.NewFakeRecorder(100),
				poolAPI: true, gatewayAPI: true, routeAPI: true}

			_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(cp)})
			g.Expect(err).To(MatchError(boom))
			g.Expect(err.Error()).To(HavePrefix(fmt.Sprintf("failed to reconcile %s: ", name)))

			got := &coordinatorv1alpha1.CoordinatorPipeline{}
			g.Expect(c.Get(ctx, client.ObjectKeyFromObject(cp), got)).To(Succeed())
			for _, typ := range []coordinatorv1alpha1.ConditionType{coordinatorv1alpha1.ConditionDegraded, coordinatorv1alpha1.ConditionReady} {
				cond := meta.FindStatusCondition(got.Status.Conditions, string(typ))
				g.Expect(cond).NotTo(BeNil(), "condition %s", typ)
				g.Expect(cond.Reason).To(Equal(string(coordinatorv1alpha1.ReasonReconcileError)), "condition %s", typ)
				g.Expect(cond.Message).To(Equal(err.Error()), "condition %s", typ)
			}
			degraded := meta.FindStatusCondition(got.Status.Conditions, string(coordinatorv1alpha1.ConditionDegraded))
			g.Expect(degraded.Status).To(Equal(metav1.ConditionTrue))
		})
	}
}

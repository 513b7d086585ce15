package controller

import (
	"context"
	"encoding/json"
	"testing"

	. "github.com/onsi/gomega"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// restartAt is `kubectl rollout restart` as the API server sees it: a strategic merge patch of
// the pod template's restartedAt annotation by a field manager of its own.
func (e *testEnv) restartAt(g *WithT, namespace, name, at string) {
	dep := e.children(g, namespace, name).dep
	restart := []byte(`{"spec":{"template":{"metadata":{"annotations":{"` + restartedAt + `":"` + at + `"}}}}}`)
	g.Expect(e.client.Patch(context.Background(), dep, client.RawPatch(types.StrategicMergePatchType, restart),
		client.FieldOwner("kubectl-rollout"))).To(Succeed())
}

// templateJSON is the Deployment's pod template as stored: a byte-equal template is no roll.
func templateJSON(g Gomega, e *testEnv, namespace, name string) string {
	b, err := json.Marshal(e.children(g, namespace, name).dep.Spec.Template)
	g.Expect(err).NotTo(HaveOccurred())
	return string(b)
}

// A CoordinatorPipeline edit that changes nothing in the pod rolls nothing: after `kubectl
// rollout restart`, `kubectl scale cpl` changes the Deployment's replicas only, and an edit the
// coordinators reload in place changes nothing of the Deployment; the pod template, the restart
// annotation included, stays byte-equal.
func TestEditsThatChangeNoPodRollNothing(t *testing.T) {
	tests := map[string]struct {
		edit func(g *WithT, e *testEnv, cp *coordinatorv1alpha1.CoordinatorPipeline)
		// applied reports that the operator acted on the edit.
		applied func(g Gomega, e *testEnv, cp *coordinatorv1alpha1.CoordinatorPipeline, revision string)
	}{
		"kubectl scale cpl --replicas=3": {
			edit: func(g *WithT, e *testEnv, cp *coordinatorv1alpha1.CoordinatorPipeline) {
				// The reconciler may write the status between the read and the update: retried on
				// the conflict.
				g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
					scale := &autoscalingv1.Scale{}
					if err := e.client.SubResource("scale").Get(context.Background(), cp, scale); err != nil {
						return err
					}
					scale.Spec.Replicas = 3
					return e.client.SubResource("scale").Update(context.Background(), cp, client.WithSubResourceBody(scale))
				})).To(Succeed())
			},
			applied: func(g Gomega, e *testEnv, cp *coordinatorv1alpha1.CoordinatorPipeline, _ string) {
				g.Expect(e.children(g, cp.Namespace, cp.Name).dep.Spec.Replicas).To(Equal(ptr.To[int32](3)))
			},
		},
		"log level (reloaded in place)": {
			edit: func(g *WithT, e *testEnv, cp *coordinatorv1alpha1.CoordinatorPipeline) {
				e.update(g, cp.Namespace, cp.Name, func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.LogLevel = 5 })
			},
			applied: func(g Gomega, e *testEnv, cp *coordinatorv1alpha1.CoordinatorPipeline, revision string) {
				live := e.get(g, cp.Namespace, cp.Name)
				g.Expect(live.Status.ObservedGeneration).To(Equal(live.Generation))
				g.Expect(live.Status.ConfigRevision).NotTo(Equal(revision))
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e, g := envSuite(t), gomega(t)
			ns := e.namespace(t)
			cp := e.readyPipeline(t, g, ns, "epd")
			e.restartAt(g, ns, "epd", "2026-12-05T18:00:00Z")
			template := templateJSON(g, e, ns, "epd")
			g.Expect(template).To(ContainSubstring(restartedAt))

			tc.edit(g, e, cp)
			g.Eventually(func(g Gomega) { tc.applied(g, e, cp, cp.Status.ConfigRevision) }).Should(Succeed())
			g.Expect(templateJSON(g, e, ns, "epd")).To(Equal(template), "the pod template changed: every pod rolls")
			// And stays so: a later reconcile (the Deployment's own status change) writes no template.
			e.markDeploymentAvailable(g, ns, "epd")
			e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
				expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionTrue, coordinatorv1alpha1.ReasonReady)
			})
			g.Expect(templateJSON(g, e, ns, "epd")).To(Equal(template))
		})
	}
}

// A field the operator sets that someone else changed (here with kubectl edit's update) is
// restored at the operator's next reconcile, which the Deployment watch triggers; the fields
// other managers own (rollout restart's annotation) stay.
func TestOperatorFieldsAreRestored(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ctx := context.Background()
	ns := e.namespace(t)
	e.readyPipeline(t, g, ns, "epd")
	e.restartAt(g, ns, "epd", "2026-12-05T18:00:00Z")
	want := e.children(g, ns, "epd").dep.Spec.Template.DeepCopy()

	edit := []byte(`{"spec":{"template":{"spec":{"terminationGracePeriodSeconds":1,"containers":[{"name":"coordinator","args":["--config","/elsewhere"]}]}}}}`)
	g.Expect(e.client.Patch(ctx, e.children(g, ns, "epd").dep, client.RawPatch(types.StrategicMergePatchType, edit),
		client.FieldOwner("kubectl-edit"))).To(Succeed())
	g.Eventually(func(g Gomega) {
		live := e.children(g, ns, "epd").dep.Spec.Template
		g.Expect(live.Spec.TerminationGracePeriodSeconds).To(Equal(want.Spec.TerminationGracePeriodSeconds))
		g.Expect(live.Spec.Containers[0].Args).To(Equal(want.Spec.Containers[0].Args))
		g.Expect(live.Annotations).To(HaveKeyWithValue(restartedAt, "2026-12-05T18:00:00Z"))
		g.Expect(live).To(Equal(*want))
	}).Should(Succeed())
}

// The CRD bounds spec.server.drainDelay: a duration with a unit, at most 5m, each refusal naming
// the field and why.
func TestDrainDelayValidation(t *testing.T) {
	e := envSuite(t)
	ns := e.namespace(t)
	tests := map[string]struct {
		value   string
		wantErr string
	}{
		"0s disables it":       {value: "0s"},
		"the default, spelled": {value: "5s"},
		"5m, the most":         {value: "5m"},
		"in other units":       {value: "299999ms"},
		"over 5m":              {value: "5m0.001s", wantErr: `spec.server.drainDelay: Invalid value: "5m0.001s": drainDelay must be at most 5m: every terminating coordinator pod waits that long before it drains`},
		"1h":                   {value: "1h", wantErr: `spec.server.drainDelay: Invalid value: "1h": drainDelay must be at most 5m`},
		"negative":             {value: "-1s", wantErr: `spec.server.drainDelay: Invalid value: "-1s": spec.server.drainDelay in body should match`},
		"without a unit":       {value: "5", wantErr: `spec.server.drainDelay: Invalid value: "5": spec.server.drainDelay in body should match`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline(ns, "drain")
			cp.UID, cp.Generation = "", 0
			obj, err := toUnstructured(cp)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(unstructured.SetNestedField(obj.Object, tc.value, "spec", "server", "drainDelay")).To(Succeed())
			err = e.client.Create(context.Background(), obj, client.DryRunAll)
			if tc.wantErr == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(err).To(HaveOccurred())
			g.Expect(err.Error()).To(ContainSubstring(tc.wantErr))
		})
	}
}

// The replica counts of the status are stored as 0, not left out, so that the printed columns
// (UPDATED) show 0 while no pod is up to date.
func TestStatusCountsShowZero(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ns := e.namespace(t)
	e.createPool(t, ns, "pool")
	e.createPipeline(t, ns, "epd")
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonDeploymentNotReady)
	})
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(coordinatorv1alpha1.GroupVersion.WithKind("CoordinatorPipeline"))
	g.Expect(e.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "epd"}, obj)).To(Succeed())
	for _, field := range []string{"replicas", "updatedReplicas", "readyReplicas"} {
		v, found, err := unstructured.NestedInt64(obj.Object, "status", field)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(found).To(BeTrue(), "status.%s is missing: the column is blank", field)
		g.Expect(v).To(BeZero(), "status.%s", field)
	}
}

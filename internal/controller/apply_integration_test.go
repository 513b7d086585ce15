package controller

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// restartedAt is the pod-template annotation kubectl rollout restart sets.
const restartedAt = "kubectl.kubernetes.io/restartedAt"

// kubectl rollout restart annotates the pod template as a manager of its own: the operator's
// steady reconcile leaves the Deployment untouched, and a change that rolls the template keeps
// the annotation (the operator applies only the fields it sets).
func TestRolloutRestartSurvivesReconciles(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ctx := context.Background()
	ns := e.namespace(t)
	e.readyPipeline(t, g, ns, "epd")
	key := types.NamespacedName{Namespace: ns, Name: "epd"}

	dep := e.children(g, ns, "epd").dep
	restart := []byte(`{"spec":{"template":{"metadata":{"annotations":{"` + restartedAt + `":"2026-12-05T18:00:00Z"}}}}}`)
	g.Expect(e.client.Patch(ctx, dep, client.RawPatch(types.StrategicMergePatchType, restart), client.FieldOwner("kubectl-rollout"))).To(Succeed())
	restarted := dep.ResourceVersion

	_, err := e.reconciler.Reconcile(ctx, ctrl.Request{NamespacedName: key})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(e.children(g, ns, "epd").dep.ResourceVersion).To(Equal(restarted), "a steady reconcile rewrote the restarted Deployment")

	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Server.ReadTimeout = duration("5s") })
	g.Eventually(func(g Gomega) {
		rolled := e.children(g, ns, "epd").dep
		g.Expect(rolled.Generation).To(BeNumerically(">", dep.Generation))
		g.Expect(rolled.Spec.Template.Annotations).To(HaveKeyWithValue(restartedAt, "2026-12-05T18:00:00Z"))
	}).Should(Succeed())
}

// A child last written by the operator before it applied server-side (as updates, under the
// legacy field manager) is adopted once: the fields the old operator set move to FieldOwner, so
// one it set and no longer wants (here a stale ConfigMap key) is removed by the apply. Later
// updates under the same name are another client's, and their fields stay.
func TestLegacyFieldsAreAdoptedOnce(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ctx := context.Background()
	ns := e.namespace(t)
	e.createPool(t, ns, "pool")
	// Invalid from the start: the operator writes no ConfigMap, the old operator's stays alone.
	e.createPipeline(t, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Pipeline.Steps[1].Params = params(map[string]any{"kv_conector": "kv-nixl"})
	})
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionFalse, coordinatorv1alpha1.ReasonInvalidPipeline)
	})
	old := desiredConfigMap(e.get(g, ns, "epd"), "log_level: 2\n", "old")
	old.Data["stale.yaml"] = "written by the old operator"
	g.Expect(e.client.Create(ctx, old, client.FieldOwner(legacyFieldManager))).To(Succeed())

	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Pipeline.Steps[1].Params = nil })
	g.Eventually(func(g Gomega) {
		cm := e.children(g, ns, "epd").cm
		g.Expect(cm.Data).To(HaveKey(ConfigKey))
		g.Expect(cm.Data).NotTo(HaveKey("stale.yaml"))
		for _, m := range cm.ManagedFields {
			g.Expect(m.Manager).NotTo(Equal(legacyFieldManager), "%s still owns fields (%s)", m.Manager, m.Operation)
		}
	}).Should(Succeed())

	cm := e.children(g, ns, "epd").cm
	cm.Labels["team"] = "inference"
	cm.Annotations[annotationDesiredHash] = "changed-by-hand"
	g.Expect(e.client.Update(ctx, cm, client.FieldOwner(legacyFieldManager))).To(Succeed())
	g.Eventually(func(g Gomega) {
		applied := e.children(g, ns, "epd").cm
		g.Expect(applied.Annotations[annotationDesiredHash]).NotTo(Equal("changed-by-hand"))
		g.Expect(applied.Labels).To(HaveKeyWithValue("team", "inference"))
	}).Should(Succeed())
}

package controller

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/epd-dev/coordinator/dataplane/base/config"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// spec.canary against a real API server: rendered into the one ConfigMap (hot-reloaded: the pod
// template does not change), reported in status.revisions, refused with the canary's key when
// invalid (the running configuration stays), and promoted by an edit that keeps its revision.
func TestCanaryLifecycle(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ns := e.namespace(t)
	good := e.readyPipeline(t, g, ns, "epd")
	before := e.children(g, ns, "epd")
	canaryPipeline := coordinatorv1alpha1.PipelineSpec{
		KVConnector: coordinatorv1alpha1.KVConnectorNIXL,
		Steps: []coordinatorv1alpha1.PipelineStep{
			{Type: coordinatorv1alpha1.StepPrefill}, {Type: coordinatorv1alpha1.StepDecode, Params: params(map[string]any{"max_resumes": 1})},
		},
	}

	// Stage at 5%.
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Canary = &coordinatorv1alpha1.CanarySpec{WeightPercent: 5, Pipeline: canaryPipeline}
	})
	cp := e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		g.Expect(cp.Status.ConfigRevision).NotTo(Equal(good.Status.ConfigRevision))
		g.Expect(cp.Status.Revisions).To(HaveLen(2))
	})
	c := expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionTrue, coordinatorv1alpha1.ReasonValid)
	g.Expect(c.Message).To(Equal("all 3 steps build with their params, and the 2 of the canary"))
	after := e.children(g, ns, "epd")
	applied, err := parseConfig(after.cm.Data[ConfigKey])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(applied.Canary).NotTo(BeNil())
	g.Expect(applied.Canary.WeightPercent).To(Equal(5))
	g.Expect(applied.Canary.Pipeline.KVConnector).To(Equal("kv-nixl"))
	g.Expect(applied.Canary.Pipeline.Steps).To(Equal([]config.Step{{Type: "prefill"}, {Type: "decode", Params: map[string]any{"max_resumes": 1}}}))
	g.Expect(applied.Revision()).To(Equal(cp.Status.ConfigRevision))
	g.Expect(after.dep.Spec.Template).To(Equal(before.dep.Spec.Template), "a canary is hot-reloaded: the pods do not roll")
	canaryRevision := applied.Canary.Pipeline.Revision()
	g.Expect(cp.Status.Revisions).To(Equal([]coordinatorv1alpha1.PipelineRevisionStatus{
		{Track: "stable", Revision: applied.Pipeline.Revision(), WeightPercent: 95},
		{Track: "canary", Revision: canaryRevision, WeightPercent: 5},
	}), "no pod reports yet (envtest runs none): no counts")

	// An invalid canary: refused with its key; the 5% canary keeps running.
	running := cp.Status.ConfigRevision
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Canary.WeightPercent = 50
		cp.Spec.Canary.Pipeline.Steps[1].Params = params(map[string]any{"max_resumes": -1})
	})
	cp = e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionFalse, coordinatorv1alpha1.ReasonInvalidPipeline)
		g.Expect(c.Message).To(HavePrefix("canary.pipeline.steps[1].params.max_resumes: "))
	})
	g.Expect(cp.Status.ConfigRevision).To(Equal(running))
	g.Expect(e.children(g, ns, "epd").cm.Data[ConfigKey]).To(Equal(after.cm.Data[ConfigKey]))

	// Promotion: the canary's pipeline becomes the pipeline; its revision stays.
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Pipeline = canaryPipeline
		cp.Spec.Canary = nil
	})
	cp = e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionTrue, coordinatorv1alpha1.ReasonValid)
		g.Expect(cp.Status.Revisions).To(HaveLen(1))
	})
	g.Expect(cp.Status.Revisions[0]).To(Equal(coordinatorv1alpha1.PipelineRevisionStatus{Track: "stable", Revision: canaryRevision, WeightPercent: 100}))
	g.Expect(strings.Contains(e.children(g, ns, "epd").cm.Data[ConfigKey], "canary")).To(BeFalse())
}

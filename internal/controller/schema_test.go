package controller

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/epd-dev/coordinator/dataplane/base/config"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

func withImage(image string, schema ...string) func(*coordinatorv1alpha1.CoordinatorPipeline) {
	return func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Image = image
		if len(schema) > 0 {
			if cp.Annotations == nil {
				cp.Annotations = map[string]string{}
			}
			cp.Annotations[AnnotationConfigSchema] = schema[0]
		}
	}
}

func TestCheckImageSchema(t *testing.T) {
	const renders = 3
	tests := map[string]struct {
		mutate  func(*coordinatorv1alpha1.CoordinatorPipeline)
		wantErr string // "" accepts
	}{
		"default image":                        {mutate: func(*coordinatorv1alpha1.CoordinatorPipeline) {}},
		"default image, annotation ignored":    {mutate: withImage("", "1")},
		"custom image, no annotation":          {mutate: withImage("registry.example.com/coordinator:v9")},
		"custom image, same schema":            {mutate: withImage("registry.example.com/coordinator:v9", "3")},
		"custom image, newer schema":           {mutate: withImage("registry.example.com/coordinator:v9", " 4 ")},
		"custom image, older schema":           {mutate: withImage("registry.example.com/coordinator:v0.1.0", "2"), wantErr: "spec.image registry.example.com/coordinator:v0.1.0 reads configuration schema 2 (annotation coordinator.epd.dev/config-schema), older than schema 3 that this operator renders: use a coordinator image of schema 3 or later (and update the annotation), or unset spec.image; the coordinators keep their current image and configuration until then"},
		"custom image from before the label":   {mutate: withImage("old:v0", "0"), wantErr: "reads configuration schema 0 "},
		"custom image, annotation not integer": {mutate: withImage("old:v0", "v2"), wantErr: `annotation coordinator.epd.dev/config-schema: "v2" is not a schema version (an integer, the image's coordinator.epd.dev/config-schema label; 0 for an image without it); spec.image old:v0 is not run until it is fixed`},
		"custom image, negative":               {mutate: withImage("old:v0", "-1"), wantErr: "is not a schema version"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := checkImageSchema(newPipeline("ns", "epd", tc.mutate), renders, "")
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("want no error, got %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("want an error containing %q, got %v", tc.wantErr, err)
			case tc.wantErr != "" && !imageRefused(err):
				t.Fatalf("%v is not a refusal of the image", err)
			}
		})
	}
	// An image of this tree's schema (its label) is accepted by this operator.
	if err := checkImageSchema(newPipeline("ns", "epd", withImage("x:v1", strconv.Itoa(config.SchemaVersion))), config.SchemaVersion, ""); err != nil {
		t.Fatal(err)
	}
	if AnnotationConfigSchema != "coordinator.epd.dev/config-schema" {
		t.Fatalf("the annotation (%s) is documented as coordinator.epd.dev/config-schema", AnnotationConfigSchema)
	}
	if imageRefused(errors.New("pipeline.steps[0]: x")) || imageRefused(nil) {
		t.Fatal("imageRefused of another error")
	}
}

// A refused image sets PipelineValid, Degraded and Ready to ConfigSchemaUnsupported with the
// refusal's message.
func TestComputeStatusSchemaRefusal(t *testing.T) {
	g := NewWithT(t)
	cp := newPipeline("ns", "epd", withImage("old:v0", "0"))
	refusal := checkImageSchema(cp, 1, "")
	g.Expect(refusal).To(HaveOccurred())
	computeStatus(cp, observed{pipeline: found(refusal)})
	c := expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionFalse, coordinatorv1alpha1.ReasonConfigSchemaUnsupported)
	g.Expect(c.Message).To(Equal(refusal.Error()))
	c = expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonConfigSchemaUnsupported)
	g.Expect(c.Message).To(Equal(refusal.Error()))
	c = expectCondition(g, cp, coordinatorv1alpha1.ConditionDegraded, metav1.ConditionTrue, coordinatorv1alpha1.ReasonConfigSchemaUnsupported)
	g.Expect(c.Message).To(HavePrefix("spec.image cannot read the configuration this operator renders (see PipelineValid)"))
}

// A running pipeline switched to a coordinator image that declares an older configuration schema
// is refused: PipelineValid=False (ConfigSchemaUnsupported) naming the annotation and both
// schemas, a Warning event, and neither the ConfigMap nor the Deployment (image included) change.
// Declaring a schema the operator renders applies the change.
func TestOlderImageSchemaIsRefused(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ns := e.namespace(t)
	good := e.readyPipeline(t, g, ns, "epd")
	before := e.children(g, ns, "epd")

	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		withImage("registry.example.com/coordinator:v0.0.9", "0")(cp)
		cp.Spec.Pipeline.Steps = cp.Spec.Pipeline.Steps[1:] // a pipeline change too: held back as well
	})
	want := (&schemaError{image: "registry.example.com/coordinator:v0.0.9", declared: "0", have: 0, renders: 1}).Error()
	g.Expect(want).To(ContainSubstring("annotation coordinator.epd.dev/config-schema"))

	cp := e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionFalse, coordinatorv1alpha1.ReasonConfigSchemaUnsupported)
		g.Expect(c.Message).To(Equal(want))
	})
	expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonConfigSchemaUnsupported)
	c := expectCondition(g, cp, coordinatorv1alpha1.ConditionDegraded, metav1.ConditionTrue, coordinatorv1alpha1.ReasonConfigSchemaUnsupported)
	g.Expect(c.Message).To(ContainSubstring("the coordinators keep their image and configuration revision " + good.Status.ConfigRevision))
	g.Expect(cp.Status.ConfigRevision).To(Equal(good.Status.ConfigRevision))

	after := e.children(g, ns, "epd")
	g.Expect(after.cm.ResourceVersion).To(Equal(before.cm.ResourceVersion), "the ConfigMap is left untouched")
	g.Expect(after.dep.ResourceVersion).To(Equal(before.dep.ResourceVersion), "the Deployment is left untouched")
	g.Expect(after.dep.Spec.Template.Spec.Containers[0].Image).To(Equal("registry.test/coordinator:test"))

	g.Eventually(func(g Gomega) {
		var list eventsv1.EventList
		g.Expect(e.client.List(context.Background(), &list, client.InNamespace(ns))).To(Succeed())
		var notes []string
		for _, ev := range list.Items {
			if ev.Regarding.Name == "epd" && ev.Reason == string(coordinatorv1alpha1.ReasonConfigSchemaUnsupported) && ev.Type == corev1.EventTypeWarning {
				notes = append(notes, ev.Note)
			}
		}
		g.Expect(notes).To(ContainElement(want))
	}).Should(Succeed())

	// An image of the operator's schema is run, with the pipeline change.
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		withImage("registry.example.com/coordinator:v9", "1")(cp)
	})
	cp = e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionTrue, coordinatorv1alpha1.ReasonValid)
		g.Expect(cp.Status.ConfigRevision).NotTo(Equal(good.Status.ConfigRevision))
	})
	dep := &appsv1.Deployment{}
	g.Expect(e.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "epd"}, dep)).To(Succeed())
	g.Expect(dep.Spec.Template.Spec.Containers[0].Image).To(Equal("registry.example.com/coordinator:v9"))
	g.Expect(cp.Status.PipelineSteps).To(Equal("prefill,decode"))

	// A canary needs schema 2: the schema-1 image is refused, naming the key; the running
	// configuration stays. Schema 2 runs it.
	running := cp.Status.ConfigRevision
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Canary = &coordinatorv1alpha1.CanarySpec{WeightPercent: 5, Pipeline: coordinatorv1alpha1.PipelineSpec{
			Steps: []coordinatorv1alpha1.PipelineStep{{Type: "decode"}}}}
	})
	cp = e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionFalse, coordinatorv1alpha1.ReasonConfigSchemaUnsupported)
		g.Expect(c.Message).To(HavePrefix("spec.image registry.example.com/coordinator:v9 reads configuration schema 1 (annotation coordinator.epd.dev/config-schema), " +
			"older than schema 2 that the key canary of this pipeline needs"))
	})
	g.Expect(cp.Status.ConfigRevision).To(Equal(running))
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		withImage("registry.example.com/coordinator:v10", "2")(cp)
	})
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionTrue, coordinatorv1alpha1.ReasonValid)
		g.Expect(cp.Status.ConfigRevision).NotTo(Equal(running))
	})
}

// A new pipeline with a refused image deploys nothing.
func TestOlderImageSchemaFromTheStartDeploysNothing(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ns := e.namespace(t)
	e.createPool(t, ns, "pool")
	e.createPipeline(t, ns, "epd", withImage("old:v0", "two"))
	cp := e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionFalse, coordinatorv1alpha1.ReasonConfigSchemaUnsupported)
		g.Expect(c.Message).To(HavePrefix(`annotation coordinator.epd.dev/config-schema: "two" is not a schema version`))
	})
	g.Expect(cp.Status.ConfigRevision).To(BeEmpty())
	ctx := context.Background()
	g.Expect(e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "epd-config"}, &corev1.ConfigMap{})).NotTo(Succeed())
	g.Expect(e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "epd"}, &appsv1.Deployment{})).NotTo(Succeed())
}

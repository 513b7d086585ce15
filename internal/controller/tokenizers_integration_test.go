package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// createTokenizerConfigMap creates a ConfigMap holding files.
func (e *testEnv) createTokenizerConfigMap(g *WithT, namespace, name string, files map[string]string) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Data: files}
	g.Expect(e.client.Create(context.Background(), cm)).To(Succeed())
	return cm
}

// renderedStep is the params of step i of the stable pipeline in the configuration the operator
// rendered into the pipeline's ConfigMap, and that configuration's revision.
func renderedStep(g Gomega, c childSet, i int) (map[string]any, string) {
	cfg, err := parseConfig(c.cm.Data[ConfigKey])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(len(cfg.Pipeline.Steps)).To(BeNumerically(">", i))
	return cfg.Pipeline.Steps[i].Params, cfg.Revision()
}

// tokenizerVolume is the pod volume named tokenizer-<name> of a Deployment, nil when absent.
func tokenizerVolume(dep *appsv1.Deployment, name string) *corev1.Volume {
	for i, v := range dep.Spec.Template.Spec.Volumes {
		if v.Name == tokenizerVolumeName(name) {
			return &dep.Spec.Template.Spec.Volumes[i]
		}
	}
	return nil
}

// A ConfigMap tokenizer: the pipeline is validated with its files and Ready; the pods mount it
// read-only at its directory and the rendered render step carries its content's fingerprint.
// Editing the ConfigMap (watched, no reconcile forced) renders a new tokenizer_revision into the
// configuration, which the pods reload, without rolling them. A new ConfigMap whose tokenizer.json
// does not load is refused with the data plane's error, and never mounted: the Deployment keeps the
// old one until the new one is fixed.
func TestConfigMapTokenizer(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ctx := context.Background()
	ns := e.namespace(t)
	files := testTokenizerFiles(t)
	v1 := e.createTokenizerConfigMap(g, ns, "qwen-tokenizer", files)

	cp := e.readyPipeline(t, g, ns, "epd", withTokenizers(qwenDir, configMapTokenizer("qwen", "qwen-tokenizer")))
	c := expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionTrue, coordinatorv1alpha1.ReasonValid)
	g.Expect(c.Message).To(Equal("all 4 steps build with their params"))
	before := e.children(g, ns, "epd")
	vol := tokenizerVolume(before.dep, "qwen")
	g.Expect(vol).NotTo(BeNil(), "volumes: %+v", before.dep.Spec.Template.Spec.Volumes)
	g.Expect(vol.ConfigMap).NotTo(BeNil())
	g.Expect(vol.ConfigMap.Name).To(Equal("qwen-tokenizer"))
	container := before.dep.Spec.Template.Spec.Containers[0]
	g.Expect(container.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "tokenizer-qwen", MountPath: qwenDir, ReadOnly: true}))
	g.Expect(container.TerminationMessagePolicy).To(Equal(corev1.TerminationMessageFallbackToLogsOnError))
	step, revision := renderedStep(g, before, 0)
	g.Expect(step).To(HaveKeyWithValue("tokenizer", qwenDir))
	g.Expect(step).To(HaveKeyWithValue("tokenizer_revision", tokenizerRevision(v1)))
	g.Expect(cp.Status.ConfigRevision).To(Equal(revision))

	// Edit the ConfigMap: the watch brings a reconcile that renders the new fingerprint.
	edited := v1.DeepCopy()
	edited.Data["tokenizer_config.json"] = strings.Replace(files["tokenizer_config.json"], `"eos_token"`, `"bos_token": null, "eos_token"`, 1)
	g.Expect(e.client.Update(ctx, edited)).To(Succeed())
	want := tokenizerRevision(edited)
	g.Expect(want).NotTo(Equal(tokenizerRevision(v1)))
	var newRevision string
	g.Eventually(func(g Gomega) {
		step, rev := renderedStep(g, e.children(g, ns, "epd"), 0)
		g.Expect(step).To(HaveKeyWithValue("tokenizer_revision", want))
		newRevision = rev
	}).Should(Succeed(), "the edit re-renders tokenizer_revision")
	g.Expect(newRevision).NotTo(Equal(revision))
	g.Eventually(func(g Gomega) {
		g.Expect(e.get(g, ns, "epd").Status.ConfigRevision).To(Equal(newRevision))
	}).Should(Succeed())
	after := e.children(g, ns, "epd")
	g.Expect(after.dep.Generation).To(Equal(before.dep.Generation), "the pods reload in place: no roll")

	// A new version of the files whose tokenizer.json does not load: refused, not mounted.
	e.createTokenizerConfigMap(g, ns, "qwen-tokenizer-v2", map[string]string{"tokenizer.json": "{", "tokenizer_config.json": files["tokenizer_config.json"]})
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Tokenizers[0].ConfigMap.Name = "qwen-tokenizer-v2"
	})
	const wantMsg = "pipeline.steps[0].params.tokenizer: tokenizer.json: unexpected end of JSON input"
	cp = e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionFalse, coordinatorv1alpha1.ReasonInvalidPipeline)
		g.Expect(c.Message).To(Equal(wantMsg))
	})
	expectCondition(g, cp, coordinatorv1alpha1.ConditionDegraded, metav1.ConditionTrue, coordinatorv1alpha1.ReasonInvalidPipeline)
	g.Expect(cp.Status.ConfigRevision).To(Equal(newRevision), "the last good configuration stays")
	held := e.children(g, ns, "epd")
	g.Expect(held.dep.Generation).To(Equal(before.dep.Generation), "the Deployment is left as it is")
	g.Expect(tokenizerVolume(held.dep, "qwen").ConfigMap.Name).To(Equal("qwen-tokenizer"), "the broken ConfigMap is not mounted")

	// Fixing the new ConfigMap in place (watched) applies it: the pods roll onto it.
	fixed := &corev1.ConfigMap{}
	g.Expect(e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "qwen-tokenizer-v2"}, fixed)).To(Succeed())
	fixed.Data["tokenizer.json"] = files["tokenizer.json"]
	g.Expect(e.client.Update(ctx, fixed)).To(Succeed())
	g.Eventually(func(g Gomega) {
		cp := e.get(g, ns, "epd")
		expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionTrue, coordinatorv1alpha1.ReasonValid)
		c := e.children(g, ns, "epd")
		g.Expect(tokenizerVolume(c.dep, "qwen").ConfigMap.Name).To(Equal("qwen-tokenizer-v2"))
		step, rev := renderedStep(g, c, 0)
		g.Expect(step).To(HaveKeyWithValue("tokenizer_revision", tokenizerRevision(fixed)))
		g.Expect(cp.Status.ConfigRevision).To(Equal(rev))
	}).Should(Succeed())
}

// A ConfigMap tokenizer that does not exist: PipelineValid, Ready and Degraded say so (reason
// TokenizerNotFound), with a Warning event, and nothing is deployed; creating it (watched) applies
// the pipeline.
func TestTokenizerConfigMapMissingThenCreated(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ctx := context.Background()
	ns := e.namespace(t)
	e.createPool(t, ns, "pool")
	e.createPipeline(t, ns, "epd", withTokenizers(qwenDir, configMapTokenizer("qwen", "qwen-tokenizer")))
	want := fmt.Sprintf("spec.tokenizers[0].configMap.name: ConfigMap qwen-tokenizer not found in namespace %s (the tokenizer of pipeline.steps[0].params.tokenizer); "+
		"the configuration and the coordinator Deployment are left as they are until it exists", ns)
	cp := e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionFalse, coordinatorv1alpha1.ReasonTokenizerNotFound)
		g.Expect(c.Message).To(Equal(want))
	})
	g.Expect(expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonTokenizerNotFound).Message).To(Equal(want))
	expectCondition(g, cp, coordinatorv1alpha1.ConditionDegraded, metav1.ConditionTrue, coordinatorv1alpha1.ReasonTokenizerNotFound)
	err := e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "epd"}, &appsv1.Deployment{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "nothing is deployed: %v", err)
	g.Eventually(func(g Gomega) {
		var events eventsv1.EventList
		g.Expect(e.client.List(ctx, &events, client.InNamespace(ns))).To(Succeed())
		g.Expect(events.Items).To(ContainElement(And(
			HaveField("Type", corev1.EventTypeWarning), HaveField("Reason", "TokenizerNotFound"), HaveField("Note", want))))
	}).Should(Succeed())

	cm := e.createTokenizerConfigMap(g, ns, "qwen-tokenizer", testTokenizerFiles(t))
	g.Eventually(func(g Gomega) {
		cp := e.get(g, ns, "epd")
		expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionTrue, coordinatorv1alpha1.ReasonValid)
		c := e.children(g, ns, "epd")
		g.Expect(tokenizerVolume(c.dep, "qwen")).NotTo(BeNil())
		step, _ := renderedStep(g, c, 0)
		g.Expect(step).To(HaveKeyWithValue("tokenizer_revision", tokenizerRevision(cm)))
	}).Should(Succeed(), "creating the ConfigMap applies the pipeline")
}

// A render step's tokenizer outside the declared tokenizers is refused, naming the param and the
// declared directories. A PersistentVolumeClaim's files are not read: the step's params are
// validated, the status says the pods check the files, the claim is mounted read-only at its
// subPath, and the spec's tokenizer_revision passes through.
func TestTokenizerPathAndClaim(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ns := e.namespace(t)
	e.createPool(t, ns, "pool")
	e.createPipeline(t, ns, "epd", withTokenizers("/models/llama", claimTokenizer("llama", "models", "llama-3")))
	cp := e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionFalse, coordinatorv1alpha1.ReasonInvalidPipeline)
		g.Expect(c.Message).To(Equal("pipeline.steps[0].params.tokenizer: /models/llama is not the directory of a tokenizer of spec.tokenizers, " +
			"which the coordinator pods mount at /var/run/coordinator/tokenizers/<name>: name one of them, or a directory below one " +
			"(declared: /var/run/coordinator/tokenizers/llama (PersistentVolumeClaim models, subPath llama-3))"))
	})
	g.Expect(cp.Status.ConfigRevision).To(BeEmpty())

	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Pipeline.Steps[0].Params = params(map[string]any{"tokenizer": llamaDir, "tokenizer_revision": "v7", "cache_size": 16})
	})
	cp = e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionTrue, coordinatorv1alpha1.ReasonValid)
		g.Expect(c.Message).To(Equal("all 4 steps build with their params; the tokenizer files of pipeline.steps[0].params.tokenizer (PersistentVolumeClaim models) " +
			"are on a volume the operator does not read: the coordinator pods check them when they load them (a pod that cannot shows in RolledOut)"))
	})
	c := e.children(g, ns, "epd")
	vol := tokenizerVolume(c.dep, "llama")
	g.Expect(vol).NotTo(BeNil())
	g.Expect(vol.PersistentVolumeClaim).To(Equal(&corev1.PersistentVolumeClaimVolumeSource{ClaimName: "models", ReadOnly: true}))
	g.Expect(c.dep.Spec.Template.Spec.Containers[0].VolumeMounts).To(ContainElement(
		corev1.VolumeMount{Name: "tokenizer-llama", MountPath: llamaDir, ReadOnly: true, SubPath: "llama-3"}))
	step, rev := renderedStep(g, c, 0)
	g.Expect(step).To(HaveKeyWithValue("tokenizer_revision", "v7"))
	g.Expect(cp.Status.ConfigRevision).To(Equal(rev))

	// A bad param is still the data plane's to refuse, without the files.
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Pipeline.Steps[0].Params = params(map[string]any{"tokenizer": llamaDir, "cache_size": -1})
	})
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionFalse, coordinatorv1alpha1.ReasonInvalidPipeline)
		g.Expect(c.Message).To(HavePrefix("pipeline.steps[0].params.cache_size: "))
	})
}

// The API server refuses tokenizers without exactly one source, with a duplicate or malformed
// name, a subPath leaving the volume, and spec volumes or mounts taking the tokenizers' place.
func TestTokenizersValidationRejects(t *testing.T) {
	e := envSuite(t)
	ns := e.namespace(t)
	cm := configMapTokenizer("qwen", "qwen-tokenizer")
	claim := claimTokenizer("llama", "models", "")
	const oneSource = `Invalid value: exactly one of configMap or persistentVolumeClaim must be set: the source of the tokenizer's files`
	tests := map[string]struct {
		tokenizers []coordinatorv1alpha1.Tokenizer
		mutate     func(*coordinatorv1alpha1.CoordinatorPipeline)
		wantErr    string
	}{
		"both sources": {
			tokenizers: []coordinatorv1alpha1.Tokenizer{{Name: "qwen", ConfigMap: cm.ConfigMap, PersistentVolumeClaim: claim.PersistentVolumeClaim}},
			wantErr:    "spec.tokenizers[0]: " + oneSource,
		},
		"no source": {
			tokenizers: []coordinatorv1alpha1.Tokenizer{cm, {Name: "bare"}},
			wantErr:    "spec.tokenizers[1]: " + oneSource,
		},
		"a duplicate name": {
			tokenizers: []coordinatorv1alpha1.Tokenizer{cm, claimTokenizer("qwen", "models", "")},
			wantErr:    `spec.tokenizers[1]: Duplicate value: {"name":"qwen"}`,
		},
		"a name that is not a DNS label": {
			tokenizers: []coordinatorv1alpha1.Tokenizer{configMapTokenizer("Qwen_3", "q")},
			wantErr:    `spec.tokenizers[0].name: Invalid value: "Qwen_3": spec.tokenizers[0].name in body should match`,
		},
		"a name too long for its volume": {
			tokenizers: []coordinatorv1alpha1.Tokenizer{configMapTokenizer(strings.Repeat("q", 54), "q")},
			wantErr:    "spec.tokenizers[0].name: Too long: may not be more than 53 bytes",
		},
		"too many": {
			tokenizers: func() []coordinatorv1alpha1.Tokenizer {
				var out []coordinatorv1alpha1.Tokenizer
				for i := range 9 {
					out = append(out, configMapTokenizer(fmt.Sprintf("t%d", i), "q"))
				}
				return out
			}(),
			wantErr: "spec.tokenizers: Too many: 9: must have at most 8 items",
		},
		"an absolute subPath": {
			tokenizers: []coordinatorv1alpha1.Tokenizer{claimTokenizer("llama", "models", "/llama")},
			wantErr:    `spec.tokenizers[0].persistentVolumeClaim.subPath: Invalid value: "/llama": subPath must be a relative path without '..' elements`,
		},
		"a subPath leaving the volume": {
			tokenizers: []coordinatorv1alpha1.Tokenizer{claimTokenizer("llama", "models", "models/../../etc")},
			wantErr:    `spec.tokenizers[0].persistentVolumeClaim.subPath: Invalid value: "models/../../etc": subPath must be a relative path without '..' elements`,
		},
		"a spec volume named like a tokenizer's": {
			tokenizers: []coordinatorv1alpha1.Tokenizer{cm},
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Volumes = []corev1.Volume{{Name: "tokenizer-qwen", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			},
			wantErr: "spec.volumes: Invalid value: volume names tokenizer-<name> of the names in spec.tokenizers are the operator's: choose another name",
		},
		"a spec mount in the tokenizers' directory": {
			tokenizers: []coordinatorv1alpha1.Tokenizer{cm},
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
				cp.Spec.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/var/run/coordinator/tokenizers/other"}}
			},
			wantErr: "spec.volumeMounts: Invalid value: volumeMounts must not mount at or under /var/run/coordinator/tokenizers when spec.tokenizers is set: the operator mounts the tokenizers there",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline(ns, "tok")
			cp.UID, cp.Generation = "", 0
			cp.Spec.Tokenizers = tc.tokenizers
			if tc.mutate != nil {
				tc.mutate(cp)
			}
			err := e.client.Create(context.Background(), cp, client.DryRunAll)
			g.Expect(err).To(HaveOccurred())
			g.Expect(err.Error()).To(ContainSubstring(tc.wantErr))
		})
	}

	// What the rules allow: both kinds, a subPath with dots in names, and spec volumes and mounts
	// next to the tokenizers'; without tokenizers the directory is the user's.
	g := NewWithT(t)
	for _, mutate := range []func(*coordinatorv1alpha1.CoordinatorPipeline){
		func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Tokenizers = []coordinatorv1alpha1.Tokenizer{cm, claimTokenizer("llama", "models", "models/..llama../v1")}
			cp.Spec.Volumes = []corev1.Volume{{Name: "tokenizer-other", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			cp.Spec.VolumeMounts = []corev1.VolumeMount{{Name: "tokenizer-other", MountPath: "/var/run/coordinator/tokenizers-extra", ReadOnly: true}}
		},
		func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Volumes = []corev1.Volume{{Name: "tokenizer-qwen", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			cp.Spec.VolumeMounts = []corev1.VolumeMount{{Name: "tokenizer-qwen", MountPath: qwenDir, ReadOnly: true}}
		},
	} {
		cp := newPipeline(ns, "tok", mutate)
		cp.UID, cp.Generation = "", 0
		g.Expect(e.client.Create(context.Background(), cp, client.DryRunAll)).To(Succeed())
	}
}

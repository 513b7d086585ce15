package controller

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/epd-dev/coordinator/dataplane/base/config"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// createPipeline creates a CoordinatorPipeline built by newPipeline (server-set fields cleared)
// and returns it as stored, CRD defaults applied.
func (e *testEnv) createPipeline(t *testing.T, namespace, name string, mutate ...func(*coordinatorv1alpha1.CoordinatorPipeline)) *coordinatorv1alpha1.CoordinatorPipeline {
	t.Helper()
	cp := newPipeline(namespace, name, mutate...)
	cp.UID, cp.Generation = "", 0
	if err := e.client.Create(context.Background(), cp); err != nil {
		t.Fatalf("creating CoordinatorPipeline: %v", err)
	}
	return cp
}

// get reads a CoordinatorPipeline.
func (e *testEnv) get(g Gomega, namespace, name string) *coordinatorv1alpha1.CoordinatorPipeline {
	cp := &coordinatorv1alpha1.CoordinatorPipeline{}
	g.Expect(e.client.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, cp)).To(Succeed())
	return cp
}

// update applies mutate to the stored CoordinatorPipeline (retrying on conflicts) and returns the
// new generation.
func (e *testEnv) update(g *WithT, namespace, name string, mutate func(*coordinatorv1alpha1.CoordinatorPipeline)) int64 {
	var gen int64
	g.Eventually(func(g Gomega) {
		cp := e.get(g, namespace, name)
		mutate(cp)
		g.Expect(e.client.Update(context.Background(), cp)).To(Succeed())
		gen = cp.Generation
	}).Should(Succeed())
	return gen
}

// expectCondition asserts a condition's status and reason, stamped with the object's generation.
func expectCondition(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline, t coordinatorv1alpha1.ConditionType, status metav1.ConditionStatus, reason coordinatorv1alpha1.ConditionReason) *metav1.Condition {
	c := meta.FindStatusCondition(cp.Status.Conditions, string(t))
	g.Expect(c).NotTo(BeNil(), "condition %s missing; conditions: %+v", t, cp.Status.Conditions)
	g.Expect(c.Status).To(Equal(status), "condition %s: %s: %s", t, c.Reason, c.Message)
	g.Expect(c.Reason).To(Equal(string(reason)), "condition %s: %s", t, c.Message)
	g.Expect(c.ObservedGeneration).To(Equal(cp.Generation), "condition %s", t)
	return c
}

// reconciled waits until the status reflects the current generation and passes check.
func (e *testEnv) reconciled(g *WithT, namespace, name string, check func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline)) *coordinatorv1alpha1.CoordinatorPipeline {
	var out *coordinatorv1alpha1.CoordinatorPipeline
	g.Eventually(func(g Gomega) {
		cp := e.get(g, namespace, name)
		g.Expect(cp.Status.ObservedGeneration).To(Equal(cp.Generation))
		check(g, cp)
		out = cp
	}).Should(Succeed())
	return out
}

// children reads the four children of a pipeline.
type childSet struct {
	cm  *corev1.ConfigMap
	dep *appsv1.Deployment
	svc *corev1.Service
	sa  *corev1.ServiceAccount
}

func (e *testEnv) children(g Gomega, namespace, name string) childSet {
	ctx := context.Background()
	c := childSet{cm: &corev1.ConfigMap{}, dep: &appsv1.Deployment{}, svc: &corev1.Service{}, sa: &corev1.ServiceAccount{}}
	g.Expect(e.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name + "-config"}, c.cm)).To(Succeed())
	g.Expect(e.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, c.dep)).To(Succeed())
	g.Expect(e.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, c.svc)).To(Succeed())
	g.Expect(e.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, c.sa)).To(Succeed())
	return c
}

func (c childSet) objects() []client.Object { return []client.Object{c.cm, c.dep, c.svc, c.sa} }

// readyPipeline creates a pool and a pipeline and drives it to Ready=True.
func (e *testEnv) readyPipeline(t *testing.T, g *WithT, namespace, name string, mutate ...func(*coordinatorv1alpha1.CoordinatorPipeline)) *coordinatorv1alpha1.CoordinatorPipeline {
	t.Helper()
	e.createPool(t, namespace, "pool")
	e.createPipeline(t, namespace, name, mutate...)
	e.reconciled(g, namespace, name, func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		g.Expect(cp.Status.ConfigRevision).NotTo(BeEmpty())
	})
	e.markDeploymentAvailable(g, namespace, name)
	return e.reconciled(g, namespace, name, func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionTrue, coordinatorv1alpha1.ReasonReady)
	})
}

// expectedConfig renders cp the way the operator should have.
func expectedConfig(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline, gatewayAddress string) config.Config {
	cfg, err := renderConfig(cp, gatewayAddress)
	g.Expect(err).NotTo(HaveOccurred())
	return cfg
}

func TestCreateRendersOwnedChildren(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ns := e.namespace(t)
	e.createPool(t, ns, "pool")
	e.createPipeline(t, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Replicas = nil // CRD default: 1
		cp.Spec.LogLevel = 0   // CRD default: 2
		cp.Spec.Pipeline.KVConnector = ""
	})

	cp := e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		g.Expect(cp.Status.ConfigRevision).NotTo(BeEmpty())
	})
	g.Expect(cp.Spec.Replicas).To(Equal(ptr.To[int32](1)), "CRD default")
	g.Expect(cp.Spec.LogLevel).To(BeEquivalentTo(2), "CRD default")
	g.Expect(cp.Spec.Pipeline.KVConnector).To(Equal(coordinatorv1alpha1.KVConnectorSharedStorage), "CRD default")

	c := e.children(g, ns, "epd")
	for _, obj := range c.objects() {
		g.Expect(metav1.IsControlledBy(obj, cp)).To(BeTrue(), "%T %s is controlled by the pipeline", obj, obj.GetName())
		g.Expect(obj.GetLabels()).To(HaveKeyWithValue(LabelManagedBy, ManagedBy))
	}

	want := expectedConfig(g, cp, testGateway)
	got, err := parseConfig(c.cm.Data[ConfigKey])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(want))
	g.Expect(got.Server.ListenAddr).To(Equal(":8080"))
	g.Expect(c.cm.Annotations).To(HaveKeyWithValue(AnnotationConfigRevision, want.Revision()))

	pod := c.dep.Spec.Template
	g.Expect(pod.Annotations).To(HaveKeyWithValue(AnnotationRestartHash, restartHash(want)))
	g.Expect(pod.Spec.Containers[0].Image).To(Equal("registry.test/coordinator:test"))
	g.Expect(pod.Spec.Containers[0].Args).To(Equal([]string{"--config", "/etc/coordinator/coordinator.yaml"}))
	g.Expect(pod.Spec.Volumes[0].ConfigMap.Name).To(Equal("epd-config"))
	g.Expect(*pod.Spec.TerminationGracePeriodSeconds).To(BeNumerically(">", int64(want.Server.ShutdownTimeout.Std().Seconds())))
	g.Expect(c.svc.Spec.Ports[0].Port).To(BeEquivalentTo(8080))
	g.Expect(c.sa.AutomountServiceAccountToken).To(Equal(ptr.To(false)))

	g.Expect(cp.Status.ConfigRevision).To(Equal(want.Revision()))
	g.Expect(cp.Status.PipelineSteps).To(Equal("conditional-decode,prefill,decode"))
	g.Expect(cp.Status.GatewayAddress).To(Equal(testGateway))
	g.Expect(cp.Status.Selector).To(Equal("app.kubernetes.io/instance=epd,app.kubernetes.io/name=coordinator"))
	expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionTrue, coordinatorv1alpha1.ReasonValid)
	expectCondition(g, cp, coordinatorv1alpha1.ConditionInferencePoolResolved, metav1.ConditionTrue, coordinatorv1alpha1.ReasonResolved)
	expectCondition(g, cp, coordinatorv1alpha1.ConditionGatewayResolved, metav1.ConditionTrue, coordinatorv1alpha1.ReasonAddressSet)
	expectCondition(g, cp, coordinatorv1alpha1.ConditionDegraded, metav1.ConditionFalse, coordinatorv1alpha1.ReasonAsExpected)
	expectCondition(g, cp, coordinatorv1alpha1.ConditionProgressing, metav1.ConditionTrue, coordinatorv1alpha1.ReasonRollingOut)
	expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonDeploymentNotReady)

	e.markDeploymentAvailable(g, ns, "epd")
	cp = e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionTrue, coordinatorv1alpha1.ReasonReady)
	})
	expectCondition(g, cp, coordinatorv1alpha1.ConditionProgressing, metav1.ConditionFalse, coordinatorv1alpha1.ReasonRolloutComplete)
	g.Expect(cp.Status.Replicas).To(BeEquivalentTo(1))
	g.Expect(cp.Status.ReadyReplicas).To(BeEquivalentTo(1))
}

func TestPipelineChangeUpdatesConfigMapOnlyServerChangeRolls(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ns := e.namespace(t)
	e.readyPipeline(t, g, ns, "epd")
	before := e.children(g, ns, "epd")

	// Pipeline-only: new steps, connector and params. The ConfigMap changes, the pod template not.
	gen := e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Pipeline.KVConnector = coordinatorv1alpha1.KVConnectorSharedStorage
		cp.Spec.Pipeline.Steps = []coordinatorv1alpha1.PipelineStep{
			{Type: coordinatorv1alpha1.StepRender, Params: params(map[string]any{"address": "http://render:8000"})},
			{Type: coordinatorv1alpha1.StepEncode, Params: params(map[string]any{"max_parallel": 4})},
			{Type: coordinatorv1alpha1.StepPrefill},
			{Type: coordinatorv1alpha1.StepDecode},
		}
	})
	cp := e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		g.Expect(cp.Status.PipelineSteps).To(Equal("render,encode,prefill,decode"))
	})
	g.Expect(cp.Generation).To(Equal(gen))
	want := expectedConfig(g, cp, testGateway)
	g.Expect(cp.Status.ConfigRevision).To(Equal(want.Revision()))
	after := e.children(g, ns, "epd")
	g.Expect(after.cm.ResourceVersion).NotTo(Equal(before.cm.ResourceVersion))
	got, err := parseConfig(after.cm.Data[ConfigKey])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.Revision()).To(Equal(want.Revision()))
	g.Expect(after.dep.Generation).To(Equal(before.dep.Generation), "a pipeline-only change must not roll the Deployment")
	g.Expect(after.dep.Spec.Template).To(Equal(before.dep.Spec.Template))
	expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionTrue, coordinatorv1alpha1.ReasonReady)

	// Server-level: the data plane cannot reload it, so the restart hash changes and the
	// Deployment rolls.
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Server.ReadTimeout = duration("5s")
	})
	cp = e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionProgressing, metav1.ConditionTrue, coordinatorv1alpha1.ReasonRollingOut)
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonDeploymentNotReady)
	})
	rolled := e.children(g, ns, "epd")
	want = expectedConfig(g, cp, testGateway)
	g.Expect(rolled.dep.Generation).To(BeNumerically(">", after.dep.Generation))
	g.Expect(rolled.dep.Spec.Template.Annotations[AnnotationRestartHash]).To(Equal(restartHash(want)))
	g.Expect(rolled.dep.Spec.Template.Annotations[AnnotationRestartHash]).NotTo(Equal(after.dep.Spec.Template.Annotations[AnnotationRestartHash]))
	g.Expect(cp.Status.ConfigRevision).To(Equal(want.Revision()))

	e.markDeploymentAvailable(g, ns, "epd")
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionTrue, coordinatorv1alpha1.ReasonReady)
		expectCondition(g, cp, coordinatorv1alpha1.ConditionProgressing, metav1.ConditionFalse, coordinatorv1alpha1.ReasonRolloutComplete)
	})

	// Pod settings reach the template too.
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Image = "registry.test/coordinator:v2" })
	g.Eventually(func(g Gomega) {
		g.Expect(e.children(g, ns, "epd").dep.Spec.Template.Spec.Containers[0].Image).To(Equal("registry.test/coordinator:v2"))
	}).Should(Succeed())
}

func TestInvalidPipelineKeepsLastGoodConfig(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ns := e.namespace(t)
	good := e.readyPipeline(t, g, ns, "epd")
	before := e.children(g, ns, "epd")

	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Pipeline.Steps = []coordinatorv1alpha1.PipelineStep{
			{Type: coordinatorv1alpha1.StepReplaceMediaURLs},
			{Type: coordinatorv1alpha1.StepRender, Params: params(map[string]any{"address": "http://render:8000"})},
			{Type: coordinatorv1alpha1.StepEncode, Params: params(map[string]any{"max_parallel": 0})},
			{Type: coordinatorv1alpha1.StepPrefill},
			{Type: coordinatorv1alpha1.StepDecode},
		}
	})
	const wantMsg = "pipeline.steps[2].params.max_parallel: must be at least 1, got 0"

	cp := e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionFalse, coordinatorv1alpha1.ReasonInvalidPipeline)
		g.Expect(c.Message).To(Equal(wantMsg))
	})
	expectCondition(g, cp, coordinatorv1alpha1.ConditionDegraded, metav1.ConditionTrue, coordinatorv1alpha1.ReasonInvalidPipeline)
	expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonInvalidPipeline)
	g.Expect(cp.Status.ConfigRevision).To(Equal(good.Status.ConfigRevision), "status keeps the last applied revision")
	g.Expect(cp.Status.PipelineSteps).To(Equal(good.Status.PipelineSteps))

	after := e.children(g, ns, "epd")
	g.Expect(after.cm.ResourceVersion).To(Equal(before.cm.ResourceVersion), "the last good ConfigMap is left untouched")
	g.Expect(after.dep.ResourceVersion).To(Equal(before.dep.ResourceVersion))

	g.Eventually(func(g Gomega) {
		var list eventsv1.EventList
		g.Expect(e.client.List(context.Background(), &list, client.InNamespace(ns))).To(Succeed())
		var notes []string
		for _, ev := range list.Items {
			if ev.Regarding.Name == "epd" && ev.Reason == "InvalidPipeline" && ev.Type == corev1.EventTypeWarning {
				notes = append(notes, ev.Note)
			}
		}
		g.Expect(notes).To(ContainElement(wantMsg))
	}).Should(Succeed())

	// Fixing the pipeline applies it.
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Pipeline.Steps[2].Params = params(map[string]any{"max_parallel": 2})
	})
	cp = e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionTrue, coordinatorv1alpha1.ReasonValid)
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionTrue, coordinatorv1alpha1.ReasonReady)
	})
	g.Expect(cp.Status.ConfigRevision).To(Equal(expectedConfig(g, cp, testGateway).Revision()))
	g.Expect(cp.Status.PipelineSteps).To(Equal("replace-media-urls,render,encode,prefill,decode"))
}

func TestInvalidPipelineFromTheStartDeploysNothing(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ns := e.namespace(t)
	e.createPool(t, ns, "pool")
	e.createPipeline(t, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Pipeline.Steps[1].Params = params(map[string]any{"kv_conector": "kv-nixl"})
	})
	cp := e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionFalse, coordinatorv1alpha1.ReasonInvalidPipeline)
		g.Expect(c.Message).To(HavePrefix("pipeline.steps[1].params.kv_conector: unknown parameter"))
	})
	expectCondition(g, cp, coordinatorv1alpha1.ConditionProgressing, metav1.ConditionFalse, coordinatorv1alpha1.ReasonNoValidConfig)
	expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonInvalidPipeline)
	g.Expect(cp.Status.ConfigRevision).To(BeEmpty())

	ctx := context.Background()
	g.Expect(e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "epd-config"}, &corev1.ConfigMap{})).NotTo(Succeed())
	g.Expect(e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "epd"}, &appsv1.Deployment{})).NotTo(Succeed())
	g.Expect(e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "epd"}, &corev1.Service{})).To(Succeed())
}

// A gateway setting the CRD admits but the data plane refuses (the CEL rule compares the backoffs
// only when both are set) surfaces like an invalid step param: PipelineValid=False naming the
// data-plane key, and the coordinators keep the last good configuration.
func TestInvalidGatewayRetryNamesTheKey(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ns := e.namespace(t)
	good := e.readyPipeline(t, g, ns, "epd")
	before := e.children(g, ns, "epd")

	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{MaxBackoff: duration("10ms")}
	})
	cp := e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionFalse, coordinatorv1alpha1.ReasonInvalidPipeline)
		g.Expect(c.Message).To(Equal("gateway.retry.max_backoff: must not be below gateway.retry.initial_backoff (25ms), got 10ms"))
	})
	g.Expect(cp.Status.ConfigRevision).To(Equal(good.Status.ConfigRevision), "status keeps the last applied revision")
	g.Expect(e.children(g, ns, "epd").cm.ResourceVersion).To(Equal(before.cm.ResourceVersion), "the last good ConfigMap is left untouched")

	// Fixing it applies it, in the ConfigMap only: retries are reloaded in place.
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Gateway.Retry.InitialBackoff = duration("5ms")
		cp.Spec.Pipeline.OnPoolFailure = coordinatorv1alpha1.PoolFailureFail
	})
	cp = e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionTrue, coordinatorv1alpha1.ReasonValid)
	})
	want := expectedConfig(g, cp, testGateway)
	g.Expect(want.Gateway.Retry.MaxBackoff).To(Equal(config.Duration(10 * time.Millisecond)))
	g.Expect(want.Pipeline.OnPoolFailure).To(Equal(config.OnPoolFailureFail))
	g.Eventually(func(g Gomega) {
		g.Expect(e.get(g, ns, "epd").Status.ConfigRevision).To(Equal(want.Revision()))
		rendered, err := parseConfig(e.children(g, ns, "epd").cm.Data[ConfigKey])
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(rendered.Gateway.Retry).To(Equal(want.Gateway.Retry))
		g.Expect(rendered.Revision()).To(Equal(want.Revision()))
	}).Should(Succeed())
	g.Expect(e.children(g, ns, "epd").dep.Spec.Template).To(Equal(before.dep.Spec.Template), "the pod template does not change")
}

func TestInferencePoolMissingThenCreated(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ns := e.namespace(t)
	e.createPipeline(t, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.InferencePoolRef.Name = "later" })

	cp := e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionInferencePoolResolved, metav1.ConditionFalse, coordinatorv1alpha1.ReasonNotFound)
		g.Expect(c.Message).To(Equal("InferencePool later not found in namespace " + ns))
	})
	expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonInferencePoolNotResolved)
	e.children(g, ns, "epd") // the coordinators run regardless: the pool is the gateway's business

	pool := e.createPool(t, ns, "later")
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionInferencePoolResolved, metav1.ConditionTrue, coordinatorv1alpha1.ReasonResolved)
	})

	// The pool's parents' conditions are mirrored.
	pool.Status.Parents = []infv1.ParentStatus{{
		ParentRef: infv1.ParentReference{Name: "inference-gateway"},
		Conditions: []metav1.Condition{{
			Type: "Accepted", Status: metav1.ConditionFalse, Reason: "NotSupportedByParent", Message: "gateway class does not support InferencePool",
			LastTransitionTime: metav1.Now(),
		}},
	}}
	g.Expect(e.client.Status().Update(context.Background(), pool)).To(Succeed())
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionInferencePoolResolved, metav1.ConditionFalse, coordinatorv1alpha1.ReasonNotAccepted)
		g.Expect(c.Message).To(Equal("InferencePool later: parent Gateway " + ns + "/inference-gateway reports Accepted=False (NotSupportedByParent): gateway class does not support InferencePool"))
	})
}

func TestGatewayRefAddressFromStatus(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ctx := context.Background()
	ns := e.namespace(t)
	e.createPool(t, ns, "pool")
	gw := e.createGateway(g, ns, "inference-gateway")
	e.createPipeline(t, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Gateway = coordinatorv1alpha1.GatewaySpec{GatewayRef: &coordinatorv1alpha1.GatewayReference{Name: "inference-gateway"}}
	})

	cp := e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionGatewayResolved, metav1.ConditionFalse, coordinatorv1alpha1.ReasonAddressPending)
	})
	expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionTrue, coordinatorv1alpha1.ReasonValid)
	expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonGatewayNotResolved)
	g.Expect(e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "epd-config"}, &corev1.ConfigMap{})).NotTo(Succeed(),
		"no configuration without a gateway address")

	e.setGatewayAddress(g, gw, "10.1.2.3")
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionGatewayResolved, metav1.ConditionTrue, coordinatorv1alpha1.ReasonResolved)
		g.Expect(cp.Status.GatewayAddress).To(Equal("http://10.1.2.3:80"))
	})
	first := e.children(g, ns, "epd")
	cfg, err := parseConfig(first.cm.Data[ConfigKey])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg.Gateway.Address).To(Equal("http://10.1.2.3:80"))

	// A new Gateway address is a reloadable change: ConfigMap only.
	e.setGatewayAddress(g, gw, "10.1.2.4")
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		g.Expect(cp.Status.GatewayAddress).To(Equal("http://10.1.2.4:80"))
	})
	second := e.children(g, ns, "epd")
	g.Expect(second.cm.Data[ConfigKey]).To(ContainSubstring("http://10.1.2.4:80"))
	g.Expect(second.dep.Generation).To(Equal(first.dep.Generation))
}

func TestDeletedChildrenAreRestored(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ctx := context.Background()
	ns := e.namespace(t)
	e.readyPipeline(t, g, ns, "epd")
	before := e.children(g, ns, "epd")

	for _, obj := range before.objects() {
		g.Expect(e.client.Delete(ctx, obj)).To(Succeed(), "deleting %T", obj)
	}
	g.Eventually(func(g Gomega) {
		after := e.children(g, ns, "epd")
		for i, obj := range after.objects() {
			g.Expect(obj.GetUID()).NotTo(Equal(before.objects()[i].GetUID()), "%T recreated", obj)
		}
		g.Expect(after.cm.Data).To(Equal(before.cm.Data))
		g.Expect(after.dep.Spec.Template).To(Equal(before.dep.Spec.Template))
	}).Should(Succeed())
	// A new Deployment has no status yet: Ready follows it.
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonDeploymentNotReady)
	})
}

// A reconcile of a steady pipeline, forced or through a watch, writes nothing and emits no event.
func TestSteadyStateReconcileWritesNothing(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ctx := context.Background()
	ns := e.namespace(t)
	e.readyPipeline(t, g, ns, "epd")
	key := types.NamespacedName{Namespace: ns, Name: "epd"}

	snapshot := func(g Gomega) map[string]string {
		rv := map[string]string{"CoordinatorPipeline": e.get(g, ns, "epd").ResourceVersion}
		for _, obj := range e.children(g, ns, "epd").objects() {
			rv[typeName(obj)+"/"+obj.GetName()] = obj.GetResourceVersion()
		}
		return rv
	}
	before, events := snapshot(g), e.events.count(ns, "epd")
	for range 3 {
		_, err := e.reconciler.Reconcile(ctx, ctrl.Request{NamespacedName: key})
		g.Expect(err).NotTo(HaveOccurred())
	}
	g.Expect(snapshot(g)).To(Equal(before))
	g.Expect(e.events.count(ns, "epd")).To(Equal(events), "events emitted")

	// The pool changes in a way that does not matter to the pipeline: the manager reconciles
	// (its reconcile count moves), and a reconcile that sees the change writes nothing either.
	reconciles := reconcileTotal(g)
	pool := &infv1.InferencePool{}
	g.Expect(e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pool"}, pool)).To(Succeed())
	pool.Labels = map[string]string{"touched": "true"}
	g.Expect(e.client.Update(ctx, pool)).To(Succeed())
	g.Eventually(func(g Gomega) {
		cached := &infv1.InferencePool{}
		g.Expect(e.reconciler.Get(ctx, client.ObjectKeyFromObject(pool), cached)).To(Succeed())
		g.Expect(cached.Labels).To(HaveKeyWithValue("touched", "true"))
	}).Should(Succeed(), "the manager's cache sees the pool change")
	g.Eventually(func(g Gomega) { g.Expect(reconcileTotal(g)).To(BeNumerically(">", reconciles)) }).Should(Succeed())
	_, err := e.reconciler.Reconcile(ctx, ctrl.Request{NamespacedName: key})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(snapshot(g)).To(Equal(before))
	g.Expect(e.events.count(ns, "epd")).To(Equal(events), "events emitted")
}

func typeName(obj client.Object) string {
	switch obj.(type) {
	case *corev1.ConfigMap:
		return "ConfigMap"
	case *appsv1.Deployment:
		return "Deployment"
	case *corev1.Service:
		return "Service"
	case *corev1.ServiceAccount:
		return "ServiceAccount"
	}
	return "?"
}

func TestForeignObjectIsAConflict(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ns := e.namespace(t)
	e.createPool(t, ns, "pool")
	foreign := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "epd"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}
	g.Expect(e.client.Create(context.Background(), foreign)).To(Succeed())
	e.createPipeline(t, ns, "epd")
	cp := e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionDegraded, metav1.ConditionTrue, coordinatorv1alpha1.ReasonChildConflict)
		g.Expect(c.Message).To(ContainSubstring("Service epd exists and is not controlled by this CoordinatorPipeline"))
	})
	expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonChildConflict)

	g.Expect(e.client.Delete(context.Background(), foreign)).To(Succeed())
	e.markDeploymentAvailable(g, ns, "epd")
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionDegraded, metav1.ConditionFalse, coordinatorv1alpha1.ReasonAsExpected)
	})
}

// The scale subresource (what an HPA or `kubectl scale` uses) drives the Deployment.
func TestScaleSubresource(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ctx := context.Background()
	ns := e.namespace(t)
	cp := e.readyPipeline(t, g, ns, "epd")

	scale := &autoscalingv1.Scale{}
	g.Expect(e.client.SubResource("scale").Get(ctx, cp, scale)).To(Succeed())
	g.Expect(scale.Spec.Replicas).To(BeEquivalentTo(1))
	g.Expect(scale.Status.Replicas).To(BeEquivalentTo(1))
	g.Expect(scale.Status.Selector).To(Equal("app.kubernetes.io/instance=epd,app.kubernetes.io/name=coordinator"))

	scale.Spec.Replicas = 3
	g.Expect(e.client.SubResource("scale").Update(ctx, cp, client.WithSubResourceBody(scale))).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(e.children(g, ns, "epd").dep.Spec.Replicas).To(Equal(ptr.To[int32](3)))
	}).Should(Succeed())
	e.markDeploymentAvailable(g, ns, "epd")
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		g.Expect(cp.Status.Replicas).To(BeEquivalentTo(3))
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionTrue, coordinatorv1alpha1.ReasonReady)
	})
}

package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
	"github.com/epd-dev/coordinator/test/harness/cluster"
)

// Pod stand-ins. Envtest runs no Deployment controller and no kubelet: a test plays both for
// the coordinator processes it runs. Each process gets a Pod object carrying the Deployment's
// pod-template labels and container, with status.podIP 127.0.0.1, Ready=True, and the container
// port named "metrics" set to the process's admin port, which is where the operator asks it
// (GET /debug/pipeline) which revision it serves: the operator's real HTTP path, against the
// real coordinator binary.

// podFor registers co as a ready pod of the Deployment namespace/deployment (cluster.StandInPod).
func (e *env) podFor(namespace, deployment, pod string, co *cluster.Coordinator) {
	e.t.Helper()
	if err := e.cluster.StandInPod(e.ctx, namespace, deployment, pod, co); err != nil {
		e.t.Fatal(err)
	}
}

// deploymentReady plays the Deployment controller: every desired replica is ready.
func (e *env) deploymentReady(namespace, name string) {
	e.t.Helper()
	if err := e.cluster.DeploymentReady(e.ctx, namespace, name); err != nil {
		e.t.Fatal(err)
	}
}

// pipeline reads namespace/name.
func (e *env) pipeline(namespace, name string) *coordinatorv1alpha1.CoordinatorPipeline {
	e.t.Helper()
	var cp coordinatorv1alpha1.CoordinatorPipeline
	if err := e.cluster.Client.Get(e.ctx, client.ObjectKey{Namespace: namespace, Name: name}, &cp); err != nil {
		e.t.Fatal(err)
	}
	return &cp
}

// updatePipeline edits namespace/name's spec, retrying on conflicts, and returns the generation.
func (e *env) updatePipeline(namespace, name string, edit func(*coordinatorv1alpha1.CoordinatorPipelineSpec)) int64 {
	e.t.Helper()
	var gen int64
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cp := e.pipeline(namespace, name)
		edit(&cp.Spec)
		if err := e.cluster.Client.Update(e.ctx, cp); err != nil {
			return err
		}
		gen = cp.Generation
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return gen
}

// rolledOut is the RolledOut condition of cp ("" fields when absent).
func rolledOut(cp *coordinatorv1alpha1.CoordinatorPipeline) metav1.Condition {
	if c := meta.FindStatusCondition(cp.Status.Conditions, string(coordinatorv1alpha1.ConditionRolledOut)); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// waitRollout waits until namespace/name has observed generation gen and its RolledOut condition
// has status and reason with updatedReplicas updated (and a message containing each of saying),
// and returns it.
func (e *env) waitRollout(namespace, name string, gen int64, status metav1.ConditionStatus, reason coordinatorv1alpha1.ConditionReason, updated int32,
	saying ...string,
) *coordinatorv1alpha1.CoordinatorPipeline {
	e.t.Helper()
	var cp *coordinatorv1alpha1.CoordinatorPipeline
	e.waitFor(fmt.Sprintf("RolledOut=%s (%s) with %d updated, saying %q", status, reason, updated, saying), 30*time.Second, func() (bool, error) {
		cp = e.pipeline(namespace, name)
		c := rolledOut(cp)
		says := true
		for _, s := range saying {
			says = says && strings.Contains(c.Message, s)
		}
		return cp.Status.ObservedGeneration >= gen && c.ObservedGeneration >= gen && c.Status == status &&
				c.Reason == string(reason) && cp.Status.UpdatedReplicas == updated && says,
			fmt.Errorf("RolledOut=%s (%s) %q, updated %d", c.Status, c.Reason, c.Message, cp.Status.UpdatedReplicas)
	})
	return cp
}

// TestRolloutTruth: the operator asks each ready coordinator pod which revision it serves and
// reports it (status.updatedReplicas, RolledOut), against real coordinator processes: both on the
// current revision; a CR update the pods have not loaded yet, then converging with no pod event;
// a pod whose environment makes the new revision invalid for it (it keeps the old one and says
// why); a pod that cannot be reached.
func TestRolloutTruth(t *testing.T) {
	e := setUp(t)
	const namespace, name = "rollout", "truth"
	k := e.cluster.Client
	pool := e.simPool(namespace)
	cp := &coordinatorv1alpha1.CoordinatorPipeline{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: coordinatorv1alpha1.CoordinatorPipelineSpec{
			Replicas:         ptr.To[int32](2),
			InferencePoolRef: coordinatorv1alpha1.InferencePoolReference{Name: pool.Name},
			Gateway:          coordinatorv1alpha1.GatewaySpec{Address: e.gateway.url},
			Pipeline: coordinatorv1alpha1.PipelineSpec{
				KVConnector: "kv-nixl",
				Steps:       []coordinatorv1alpha1.PipelineStep{{Type: "decode"}},
			},
		},
	}
	if err := k.Create(e.ctx, cp); err != nil {
		t.Fatal(err)
	}
	// No pods yet: not rolled out, waiting for replicas (pod events, no polling).
	first := e.waitRollout(namespace, name, 1, metav1.ConditionFalse, coordinatorv1alpha1.ReasonProgressing, 0)
	if first.Status.URL != "http://truth.rollout.svc:8080" {
		t.Fatalf("status.url %q", first.Status.URL)
	}

	dir := filepath.Join(t.TempDir(), "etc-coordinator")
	mount, err := e.cluster.MountConfigMap(e.ctx, namespace, name+"-config", dir, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "coordinator.yaml")
	a, err := cluster.StartCoordinator(e.ctx, e.bin, config, "", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Stop(10 * time.Second) }()
	// b's environment forces kv-sglang: fine for a decode-only pipeline, invalid with prefill.
	b, err := cluster.StartCoordinator(e.ctx, e.bin, config, "", []string{"COORDINATOR_PIPELINE_KV_CONNECTOR=kv-sglang"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Stop(10 * time.Second) }()
	e.podFor(namespace, name, name+"-a", a)
	e.podFor(namespace, name, name+"-b", b)
	e.deploymentReady(namespace, name)

	// Both pods serve the current revision.
	got := e.waitRollout(namespace, name, 1, metav1.ConditionTrue, coordinatorv1alpha1.ReasonRolledOut, 2)
	if got.Status.ReadyFraction != "2/2" {
		t.Fatalf("readyFraction %q", got.Status.ReadyFraction)
	}
	rev1 := got.Status.ConfigRevision

	// A CR update the pods have not seen (the kubelet stand-in is paused): Progressing.
	mount.Stop()
	gen := e.updatePipeline(namespace, name, func(s *coordinatorv1alpha1.CoordinatorPipelineSpec) { s.LogLevel = 3 })
	got = e.waitRollout(namespace, name, gen, metav1.ConditionFalse, coordinatorv1alpha1.ReasonProgressing, 0)
	rev2 := got.Status.ConfigRevision
	if rev2 == rev1 {
		t.Fatal("the update did not change the revision")
	}
	if msg := rolledOut(got).Message; !strings.Contains(msg, name+"-a serves "+rev1) || !strings.Contains(msg, name+"-b serves "+rev1) {
		t.Fatalf("Progressing message %q does not name the pods on %s", msg, rev1)
	}
	// The kubelet refreshes the file, the coordinators reload it: no pod object changes, the
	// operator's polling sees it.
	if mount, err = e.cluster.MountConfigMap(e.ctx, namespace, name+"-config", dir, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	defer func() { mount.Stop() }()
	e.waitRollout(namespace, name, gen, metav1.ConditionTrue, coordinatorv1alpha1.ReasonRolledOut, 2)

	// prefill + decode: a accepts it, b rejects it and keeps rev2.
	gen = e.updatePipeline(namespace, name, func(s *coordinatorv1alpha1.CoordinatorPipelineSpec) {
		s.Pipeline.Steps = []coordinatorv1alpha1.PipelineStep{{Type: "prefill"}, {Type: "decode"}}
	})
	got = e.waitRollout(namespace, name, gen, metav1.ConditionFalse, coordinatorv1alpha1.ReasonConfigRejected, 1)
	msg := rolledOut(got).Message
	if !strings.Contains(msg, name+"-b serves "+rev2) || !strings.Contains(msg, "kv-sglang needs prefill and decode in flight together") ||
		strings.Contains(msg, name+"-a") {
		t.Fatalf("ConfigRejected message %q", msg)
	}

	// b goes away while its pod object still says Ready; a third pod was never reachable.
	if err := b.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	e.podFor(namespace, name, name+"-c", nil)
	// Until the operator has seen the third pod, the message counts 1 of 2: wait for 2 of 3.
	got = e.waitRollout(namespace, name, gen, metav1.ConditionUnknown, coordinatorv1alpha1.ReasonRevisionUnknown, 1, "2 of 3 ready pods")
	msg = rolledOut(got).Message
	if !strings.Contains(msg, "2 of 3 ready pods could not be asked") || !strings.Contains(msg, name+"-b: ") || !strings.Contains(msg, name+"-c: ") {
		t.Fatalf("Unknown message %q", msg)
	}
}

package controller

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// The rollout probe asks only the pods that a ReplicaSet of the pipeline's Deployment controls
// (the current one and an older one): pods with the coordinator's labels that have no owner, are
// controlled by a ReplicaSet of another Deployment or by the Deployment itself, or merely list
// the ReplicaSet as a non-controlling owner are neither asked nor counted. Envtest runs no
// Deployment or ReplicaSet controller: the test creates the ReplicaSets and pods, with their owner
// references, and plays the kubelet (pod IP and readiness); each pod's admin port is a server of
// its own that counts the requests.
func TestRolloutProbeAsksOnlyOwnedPods(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ctx := context.Background()
	ns := e.namespace(t)
	cp := e.readyPipeline(t, g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Replicas = ptr.To[int32](2) })
	dep := e.children(g, ns, "epd").dep
	revision := cp.Status.ConfigRevision

	controller := func(kind, name string, uid types.UID) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: name, UID: uid, Controller: ptr.To(true)}}
	}
	replicaSet := func(name, hash string, owners []metav1.OwnerReference) *appsv1.ReplicaSet {
		labels := podLabels(cp)
		labels["pod-template-hash"] = hash
		rs := &appsv1.ReplicaSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, OwnerReferences: owners},
			Spec: appsv1.ReplicaSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: containerName, Image: "registry.test/coordinator:test"}}}},
			},
		}
		g.Expect(e.client.Create(ctx, rs)).To(Succeed())
		return rs
	}
	current := replicaSet("epd-new", "new", controller("Deployment", dep.Name, dep.UID))
	older := replicaSet("epd-old", "old", controller("Deployment", dep.Name, dep.UID))
	other := replicaSet("impostor-1", "imp", controller("Deployment", "impostor", "4f1b3a52-0000-4000-8000-000000000001"))

	tests := map[string]struct {
		pod    string
		owners []metav1.OwnerReference
		asked  bool
	}{
		"controlled by the current ReplicaSet":          {pod: "epd-new-a", owners: controller("ReplicaSet", current.Name, current.UID), asked: true},
		"controlled by an older ReplicaSet":             {pod: "epd-old-a", owners: controller("ReplicaSet", older.Name, older.UID), asked: true},
		"no owner":                                      {pod: "stray"},
		"controlled by another Deployment's ReplicaSet": {pod: "impostor-1-a", owners: controller("ReplicaSet", other.Name, other.UID)},
		"controlled by the Deployment itself":           {pod: "epd-direct", owners: controller("Deployment", dep.Name, dep.UID)},
		"owned by the current ReplicaSet, not as its controller": {pod: "epd-new-b", owners: []metav1.OwnerReference{
			{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: current.Name, UID: current.UID}}},
	}
	hits := map[string]*atomic.Int32{}
	for name, tc := range tests {
		var n atomic.Int32
		hits[name] = &n
		// A pod that should not be asked answers with another revision: counted, it would keep
		// RolledOut from being True.
		answer := "stale"
		if tc.asked {
			answer = revision
		}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			n.Add(1)
			w.Header().Set("Content-Type", "application/json")
			_, _ = fmt.Fprintf(w, `{"revision":%q,"reload":{}}`, answer)
		}))
		t.Cleanup(srv.Close)
		_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
		g.Expect(err).NotTo(HaveOccurred())
		metricsPort, err := strconv.Atoi(port)
		g.Expect(err).NotTo(HaveOccurred())

		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: tc.pod, Labels: podLabels(cp), OwnerReferences: tc.owners},
			Spec: corev1.PodSpec{
				ServiceAccountName:           "epd",
				AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{
					Name: containerName, Image: "registry.test/coordinator:test",
					Ports: []corev1.ContainerPort{{Name: metricsPortName, ContainerPort: int32(metricsPort)}},
				}},
			},
		}
		g.Expect(e.client.Create(ctx, pod)).To(Succeed(), name)
		pod.Status = corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: "127.0.0.1", PodIPs: []corev1.PodIP{{IP: "127.0.0.1"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		}
		g.Expect(e.client.Status().Update(ctx, pod)).To(Succeed(), name)
	}

	want := fmt.Sprintf("2 of 2 desired replicas serve revision %s (2 ready)", revision)
	g.Eventually(func(g Gomega) {
		cp := e.get(g, ns, "epd")
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionRolledOut, metav1.ConditionTrue, coordinatorv1alpha1.ReasonRolledOut)
		g.Expect(c.Message).To(Equal(want))
		g.Expect(cp.Status.UpdatedReplicas).To(Equal(int32(2)))
		g.Expect(cp.Status.Revisions).NotTo(BeEmpty())
	}).Should(Succeed(), "the two controlled pods, and only they, are counted")
	for name, tc := range tests {
		if tc.asked {
			g.Expect(hits[name].Load()).To(BeNumerically(">", 0), "%s: asked", name)
		} else {
			g.Expect(hits[name].Load()).To(BeZero(), "%s: never asked", name)
		}
	}
}

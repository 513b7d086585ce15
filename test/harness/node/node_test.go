package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestStartStop brings the node up, runs a pod on it (the pause image, as a non-root user with a
// ConfigMap volume), checks it reaches Running and Ready, then stops the cluster and checks the
// host is as it was: no process, mount, bridge, iptables chain, sysctl, cgroup or path left.
func TestStartStop(t *testing.T) {
	Require(t)
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "node")
	// Whatever a killed run left in the default place is not ours to compare against.
	if err := Teardown(DefaultDir, nil); err != nil {
		t.Fatal(err)
	}
	before, err := Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c, err := Start(context.Background(), Options{Root: root, Dir: dir, Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			c.Stop()
		}
	})
	t.Logf("cluster up in %s", time.Since(start).Round(time.Millisecond))
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg", Namespace: "default"}, Data: map[string]string{"k": "v"}}
	if err := c.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}, Spec: corev1.PodSpec{
		SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](NonRootUID)},
		Containers: []corev1.Container{{Name: "c", Image: PauseImage, ImagePullPolicy: corev1.PullNever,
			VolumeMounts: []corev1.VolumeMount{{Name: "cfg", MountPath: "/cfg"}}}},
		Volumes: []corev1.Volume{{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}}},
	}}
	if err := c.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	if err := c.wait(ctx, "pod p Ready", 60*time.Second, func() error {
		if err := c.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return os.ErrNotExist
	}); err != nil {
		t.Fatalf("%v\nkubelet:\n%s", err, c.Log("kubelet", 40))
	}
	t.Logf("pod Ready in %s, IP %s", time.Since(created).Round(time.Millisecond), pod.Status.PodIP)
	if pod.Status.PodIP == "" {
		t.Fatal("the pod has no IP")
	}
	start = time.Now()
	c.Stop()
	stopped = true
	t.Logf("stopped in %s", time.Since(start).Round(time.Millisecond))
	if left := Leftovers(dir, before); len(left) > 0 {
		t.Fatalf("the host is not clean after Stop:\n%v", left)
	}
}

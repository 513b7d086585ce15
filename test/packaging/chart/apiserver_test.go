package chart_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/epd-dev/coordinator/test/harness/cluster"
)

// The rendered chart is accepted by a real kube-apiserver (envtest): the CRD is created, every
// other object passes a server-side dry-run apply (schema, defaulting, validation, RBAC objects).
func TestChartAppliesToAPIServer(t *testing.T) {
	c := cluster.APIServer(t)
	for name, vals := range map[string]map[string]any{
		"defaults": nil,
		"non-default": {
			"logLevel": "debug", "nodeSelector": map[string]any{"kubernetes.io/os": "linux"},
			"tolerations": []any{map[string]any{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}},
			"metrics":     map[string]any{"secure": false}, "leaderElection": map[string]any{"enabled": false},
		},
		"watch namespace": {"watchNamespace": "inference"},
	} {
		t.Run(name, func(t *testing.T) {
			if ns, ok := vals["watchNamespace"].(string); ok {
				createNamespace(t, c, ns)
			}
			applyAll(t, c, namespace, render(t, namespace, vals).objs)
		})
	}
}

// The `helm test` hooks pass a server-side dry-run apply in a namespace that enforces the
// restricted Pod Security Standard.
func TestHelmTestHooksApplyRestricted(t *testing.T) {
	c := cluster.APIServer(t)
	const ns = "chart-hooks-restricted"
	n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest",
	}}}
	if err := c.Create(context.Background(), n); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	hooks := render(t, ns, nil).hooks
	if len(hooks) == 0 {
		t.Fatal("no hooks rendered")
	}
	for _, err := range cluster.ApplyManifests(context.Background(), c, "chart-test", hooks) {
		t.Error(err)
	}
}

func createNamespace(t *testing.T, c client.Client, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// applyAll creates namespace and applies objs (see cluster.ApplyManifests).
func applyAll(t *testing.T, c client.Client, namespace string, objs []*unstructured.Unstructured) {
	t.Helper()
	createNamespace(t, c, namespace)
	for _, err := range cluster.ApplyManifests(context.Background(), c, "chart-test", objs) {
		t.Error(err)
	}
}

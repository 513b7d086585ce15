package chart_test

import (
	"context"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// The rendered chart is accepted by a real kube-apiserver (envtest): the CRD is created, every
// other object passes a server-side dry-run apply (schema, defaulting, validation, RBAC objects).
func TestChartAppliesToAPIServer(t *testing.T) {
	c := apiServer(t)
	for name, vals := range map[string]map[string]any{
		"defaults": nil,
		"non-default": {
			"logLevel": "debug", "nodeSelector": map[string]any{"kubernetes.io/os": "linux"},
			"tolerations": []any{map[string]any{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}},
			"metrics":     map[string]any{"secure": false}, "leaderElection": map[string]any{"enabled": false},
		},
	} {
		t.Run(name, func(t *testing.T) { applyAll(t, c, namespace, render(t, namespace, vals).objs) })
	}
}

// apiServer starts an envtest kube-apiserver (KUBEBUILDER_ASSETS, set by `make test`) for the
// test. Without it the test is skipped, except in CI.
func apiServer(t *testing.T) client.Client {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("KUBEBUILDER_ASSETS is not set; run `make test`")
		}
		t.Skip("KUBEBUILDER_ASSETS is not set: KUBEBUILDER_ASSETS=$(hack/setup-envtest-assets.sh) go test ./test/chart/...")
	}
	env := &envtest.Environment{}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("envtest: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// applyAll creates namespace and applies objs: CustomResourceDefinitions and Namespaces for real,
// the rest as a server-side dry run.
func applyAll(t *testing.T, c client.Client, namespace string, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, obj := range objs {
		opts := []client.ApplyOption{client.FieldOwner("chart-test"), client.ForceOwnership}
		if k := obj.GetKind(); k != "CustomResourceDefinition" && k != "Namespace" {
			opts = append(opts, client.DryRunAll)
		}
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), opts...); err != nil {
			t.Errorf("applying %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
}

package cluster

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/epd-dev/coordinator/test/harness/prereq"
)

// APIServer starts a bare kube-apiserver + etcd (KUBEBUILDER_ASSETS, set by `make test`) for the
// test and stops it at the end. Without assets the test fails under CI and is skipped otherwise
// (package prereq).
func APIServer(t testing.TB) client.Client {
	t.Helper()
	prereq.KubebuilderAssets(t)
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

// ApplyManifests applies objs in order like `kubectl apply --server-side`: Namespaces and
// CustomResourceDefinitions for real, everything else as a server-side dry run (envtest runs no
// controllers, but the API server still validates each object against its schema). It returns one
// error per object that was refused.
func ApplyManifests(ctx context.Context, c client.Client, fieldOwner string, objs []*unstructured.Unstructured) []error {
	var errs []error
	for _, obj := range objs {
		opts := []client.ApplyOption{client.FieldOwner(fieldOwner), client.ForceOwnership}
		if k := obj.GetKind(); k != "CustomResourceDefinition" && k != "Namespace" {
			opts = append(opts, client.DryRunAll)
		}
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), opts...); err != nil {
			errs = append(errs, fmt.Errorf("applying %s %s: %w", obj.GetKind(), obj.GetName(), err))
		}
	}
	return errs
}

package samples

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// kedaExample is the shipped KEDA example (docs/operations.md, "Autoscaling").
const kedaExample = "config/samples/keda/scaledobjects.yaml"

// loadKEDA decodes the objects of the KEDA example.
func loadKEDA(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), kedaExample))
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", kedaExample, err)
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
	if len(out) != 2 {
		t.Fatalf("%s: %d objects, want the prefill and decode ScaledObjects", kedaExample, len(out))
	}
	return out
}

// The KEDA example passes KEDA's own ScaledObject schema (KEDA v2.21.1's CRD on a real API
// server, strict field validation), scales the worker Deployments of the pd-nixl example, and
// queries the coordinators' per-phase series of the pool it scales; the same API server refuses
// ScaledObjects KEDA's schema forbids, so the check is real.
func TestKEDAExample(t *testing.T) {
	c := apiServer(t)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "samples-keda"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	var pd *example
	for _, ex := range loadExamples(t) {
		if ex.dir == "pd-nixl" {
			pd = ex
		}
	}
	if pd == nil {
		t.Fatal("no pd-nixl example")
	}
	objs := loadKEDA(t)
	for _, o := range objs {
		t.Run(o.GetName(), func(t *testing.T) {
			if o.GetAPIVersion() != "keda.sh/v1alpha1" || o.GetKind() != "ScaledObject" {
				t.Fatalf("%s %s, want keda.sh/v1alpha1 ScaledObject", o.GetAPIVersion(), o.GetKind())
			}
			u := o.DeepCopy()
			u.SetNamespace(ns.Name)
			if err := c.Create(ctx, u, client.DryRunAll, client.FieldValidation("Strict")); err != nil {
				t.Fatalf("the API server refuses it: %v", err)
			}
			target, _, _ := unstructured.NestedString(o.Object, "spec", "scaleTargetRef", "name")
			if _, ok := pd.deploys[target]; !ok {
				t.Fatalf("scaleTargetRef %q is no Deployment of config/samples/pd-nixl", target)
			}
			phase := strings.TrimPrefix(target, "qwen3-pd-")
			triggers, _, _ := unstructured.NestedSlice(o.Object, "spec", "triggers")
			if len(triggers) == 0 {
				t.Fatal("no triggers")
			}
			for i, tr := range triggers {
				query, _, _ := unstructured.NestedString(tr.(map[string]any), "metadata", "query")
				if !strings.Contains(query, `phase="`+phase+`"`) {
					t.Errorf("trigger %d of the %s pool queries another phase: %s", i, phase, query)
				}
			}
		})
	}

	refused := map[string]func(u *unstructured.Unstructured){
		"a numeric threshold": func(u *unstructured.Unstructured) {
			tr, _, _ := unstructured.NestedSlice(u.Object, "spec", "triggers")
			_ = unstructured.SetNestedField(tr[0].(map[string]any), int64(8), "metadata", "threshold")
			_ = unstructured.SetNestedSlice(u.Object, tr, "spec", "triggers")
		},
		"no triggers": func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedSlice(u.Object, []any{}, "spec", "triggers")
		},
		"unknown field": func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, int64(1), "spec", "minReplicas")
		},
	}
	for name, mutate := range refused {
		t.Run("refused: "+name, func(t *testing.T) {
			u := objs[0].DeepCopy()
			u.SetNamespace(ns.Name)
			mutate(u)
			err := c.Create(ctx, u, client.DryRunAll, client.FieldValidation("Strict"))
			if err == nil {
				t.Fatal("accepted")
			}
			t.Log(err)
		})
	}
}

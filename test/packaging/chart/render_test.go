package chart_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/epd-dev/coordinator/internal/packaging"
)

// The chart is tested the way `helm lint` and `helm template` would (helm.sh/helm/v3 as a
// library, no cluster): lint, then client-only installs with default and non-default values.

const (
	root        = "../../.."
	releaseName = "coordinator-operator"
	namespace   = "coordinator-system"
	// kubeVersion is what the client-only render pretends to target (the chart's kubeVersion
	// constraint is checked against it).
	kubeVersion = "v1.33.0"
)

var chartDir = filepath.Join(root, packaging.ChartDir)

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading %s: %v", chartDir, err)
	}
	return c
}

// rendered is the output of one client-only install.
type rendered struct {
	objs []*unstructured.Unstructured
	// hooks are the hook objects (templates/tests), which Helm keeps out of the manifest.
	hooks []*unstructured.Unstructured
	notes string
}

// render runs `helm install --dry-run=client` of the chart with vals in the given namespace.
func render(t *testing.T, ns string, vals map[string]any) rendered {
	t.Helper()
	r, err := tryRender(loadChart(t), ns, vals)
	if err != nil {
		t.Fatalf("rendering the chart: %v", err)
	}
	return r
}

func tryRender(c *chart.Chart, ns string, vals map[string]any) (rendered, error) {
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		return rendered{}, err
	}
	install := action.NewInstall(&action.Configuration{})
	install.DryRun, install.ClientOnly, install.Replace = true, true, true
	install.ReleaseName, install.Namespace = releaseName, ns
	install.KubeVersion = kv
	install.IncludeCRDs = true
	rel, err := install.Run(c, vals)
	if err != nil {
		return rendered{}, err
	}
	objs, err := packaging.SplitYAML([]byte(rel.Manifest))
	if err != nil {
		return rendered{}, err
	}
	var hooks []*unstructured.Unstructured
	for _, h := range rel.Hooks {
		hs, err := packaging.SplitYAML([]byte(h.Manifest))
		if err != nil {
			return rendered{}, fmt.Errorf("hook %s: %w", h.Path, err)
		}
		hooks = append(hooks, hs...)
	}
	return rendered{objs: objs, hooks: hooks, notes: rel.Info.Notes}, nil
}

// get returns the one object of kind named name ("" matches any name).
func (r rendered) get(t *testing.T, kind, name string) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range packaging.Find(r.objs, kind) {
		if name == "" || o.GetName() == name {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %s %q in the render, found %d", kind, name, len(found))
	}
	return found[0]
}

func (r rendered) count(kind string) int { return len(packaging.Find(r.objs, kind)) }

// deployment returns the operator Deployment, typed.
func (r rendered) deployment(t *testing.T) *appsv1.Deployment {
	t.Helper()
	dep := &appsv1.Deployment{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(r.get(t, "Deployment", "").Object, dep); err != nil {
		t.Fatal(err)
	}
	return dep
}

func fromUnstructured[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return out
}

// appVersion is the chart's appVersion.
func appVersion(t *testing.T) string {
	t.Helper()
	return loadChart(t).Metadata.AppVersion
}

// Package packaging renders the operator's install artifacts from the one source of truth, the
// kustomize tree under config/ (whose CRD and manager ClusterRole controller-gen generates):
// the Helm chart's generated templates (chart.go) and the OLM bundle (bundle.go). `make helm-chart`
// and `make bundle` run it through hack/chartgen and hack/bundlegen; the tests in test/packaging/chart and
// test/packaging/bundle run it again and fail when the checked-in output is stale.
package packaging

import (
	"fmt"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Names shared by the kustomize tree, the chart and the bundle.
const (
	// PackageName is the OLM package and the chart name.
	PackageName = "coordinator-operator"
	// ManagerContainer is the manager's container in the operator Deployment.
	ManagerContainer = "manager"
	// CoordinatorImageEnv is the manager's environment variable naming the default coordinator
	// image (the manager's --coordinator-image default; OLM's RELATED_IMAGE_ convention).
	CoordinatorImageEnv = "RELATED_IMAGE_COORDINATOR"
	// kustomizeNamePrefix is config/default's namePrefix.
	kustomizeNamePrefix = "coordinator-"
)

// Kustomize builds the kustomization in dir (relative to the repository root) with the kustomize
// API, the library behind `go tool kustomize build`, and returns its objects in output order.
func Kustomize(root, dir string) ([]*unstructured.Unstructured, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(root, dir))
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var objs []*unstructured.Unstructured
	for _, r := range res.Resources() {
		// Through JSON, so numbers are int64 like in every other unstructured object.
		b, err := r.MarshalJSON()
		obj := &unstructured.Unstructured{}
		if err == nil {
			err = obj.UnmarshalJSON(b)
		}
		if err != nil {
			return nil, fmt.Errorf("kustomize build %s: %s: %w", dir, r.CurId(), err)
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

// SplitYAML parses a multi-document YAML stream (kustomize or helm output) into objects,
// skipping empty documents.
func SplitYAML(data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	for i, doc := range strings.Split("\n"+string(data), "\n---") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if string(j) == "null" || string(j) == "{}" {
			continue
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(j); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

// Find returns the objects of kind, in order.
func Find(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// SetImages points the manager container of a Deployment (as an unstructured object) at
// operatorImage and its RELATED_IMAGE_COORDINATOR variable at coordinatorImage; an empty value
// leaves that image alone. It is what `make build-installer` does with kustomize edit.
func SetImages(dep *unstructured.Unstructured, operatorImage, coordinatorImage string) error {
	containers, _, err := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	if err != nil {
		return err
	}
	found := false
	for i, c := range containers {
		cm, ok := c.(map[string]any)
		if !ok || cm["name"] != ManagerContainer {
			continue
		}
		found = true
		if operatorImage != "" {
			cm["image"] = operatorImage
		}
		if coordinatorImage == "" {
			continue
		}
		env, _ := cm["env"].([]any)
		set := false
		for _, e := range env {
			if em, ok := e.(map[string]any); ok && em["name"] == CoordinatorImageEnv {
				em["value"], set = coordinatorImage, true
			}
		}
		if !set {
			return fmt.Errorf("Deployment %s: container %s has no %s variable", dep.GetName(), ManagerContainer, CoordinatorImageEnv) //nolint:staticcheck // ST1005: a Kubernetes kind
		}
		containers[i] = cm
	}
	if !found {
		return fmt.Errorf("Deployment %s has no container %s", dep.GetName(), ManagerContainer) //nolint:staticcheck // ST1005: a Kubernetes kind
	}
	return unstructured.SetNestedSlice(dep.Object, containers, "spec", "template", "spec", "containers")
}

// ContainerEnv returns the value of variable name in the manager container of a Deployment.
func ContainerEnv(dep *unstructured.Unstructured, name string) (string, bool) {
	containers, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	for _, c := range containers {
		cm, _ := c.(map[string]any)
		if cm["name"] != ManagerContainer {
			continue
		}
		env, _ := cm["env"].([]any)
		for _, e := range env {
			if em, ok := e.(map[string]any); ok && em["name"] == name {
				v, ok := em["value"].(string)
				return v, ok
			}
		}
	}
	return "", false
}

// ContainerImage returns the image of the manager container of a Deployment.
func ContainerImage(dep *unstructured.Unstructured) string {
	containers, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	for _, c := range containers {
		if cm, _ := c.(map[string]any); cm["name"] == ManagerContainer {
			img, _ := cm["image"].(string)
			return img
		}
	}
	return ""
}

package v1alpha1_test

import (
	"os"
	"sort"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

const crdPath = "../../config/crd/bases/coordinator.epd.dev_coordinatorpipelines.yaml"

func loadCRD(t *testing.T) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	data, err := os.ReadFile(crdPath)
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(data, crd); err != nil {
		t.Fatalf("%s: %v", crdPath, err)
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Schema == nil {
		t.Fatalf("%s: want one version with a schema", crdPath)
	}
	return crd
}

// Every property of the generated schema carries a description, so `kubectl explain
// coordinatorpipeline.spec...` documents every field. The root metadata is the only exception:
// controller-gen emits ObjectMeta as a bare object and the API server documents it.
func TestEveryCRDFieldHasADescription(t *testing.T) {
	root := loadCRD(t).Spec.Versions[0].Schema.OpenAPIV3Schema
	var missing []string
	var walk func(path string, s *apiextensionsv1.JSONSchemaProps)
	walk = func(path string, s *apiextensionsv1.JSONSchemaProps) {
		for name, prop := range s.Properties {
			p := path + "." + name
			if strings.TrimSpace(prop.Description) == "" && p != ".metadata" {
				missing = append(missing, p)
			}
			walk(p, &prop)
		}
		if s.Items != nil && s.Items.Schema != nil {
			walk(path+"[]", s.Items.Schema)
		}
		if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
			walk(path+"{}", s.AdditionalProperties.Schema)
		}
	}
	if strings.TrimSpace(root.Description) == "" {
		missing = append(missing, "(root)")
	}
	walk("", root)
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("%d schema properties have no description (add a doc comment to the Go field, then `make manifests`):\n  %s",
			len(missing), strings.Join(missing, "\n  "))
	}
}

// kubectl discovery: the short name, the category, and the printer columns users rely on.
func TestCRDDiscoveryAndPrinterColumns(t *testing.T) {
	crd := loadCRD(t)
	names := crd.Spec.Names
	if got := strings.Join(names.ShortNames, ","); got != "cpl" {
		t.Errorf("shortNames = %q, want cpl", got)
	}
	if got := strings.Join(names.Categories, ","); got != "epd" {
		t.Errorf("categories = %q, want epd", got)
	}
	v := crd.Spec.Versions[0]
	if v.Subresources == nil || v.Subresources.Status == nil || v.Subresources.Scale == nil {
		t.Errorf("want status and scale subresources, got %+v", v.Subresources)
	}
	cols := map[string]apiextensionsv1.CustomResourceColumnDefinition{}
	var order []string
	for _, c := range v.AdditionalPrinterColumns {
		cols[c.Name] = c
		if c.Priority == 0 {
			order = append(order, c.Name)
		}
	}
	if got, want := strings.Join(order, ","), "Ready,Updated,URL,Revision,Age"; got != want {
		t.Errorf("default printer columns = %s, want %s", got, want)
	}
	for name, path := range map[string]string{
		"Ready":    ".status.readyFraction",
		"Updated":  ".status.updatedReplicas",
		"URL":      ".status.url",
		"Revision": ".status.configRevision",
	} {
		if c, ok := cols[name]; !ok || c.JSONPath != path {
			t.Errorf("printer column %s = %+v, want JSONPath %s", name, c, path)
		}
	}
	for name, path := range map[string]string{
		"Status":  `.status.conditions[?(@.type=="Ready")].status`,
		"Reason":  `.status.conditions[?(@.type=="Ready")].reason`,
		"Rollout": `.status.conditions[?(@.type=="RolledOut")].reason`,
		"Pool":    ".spec.inferencePoolRef.name",
		"Steps":   ".status.pipelineSteps",
		"Gateway": ".status.gatewayAddress",
		"Route":   `.status.conditions[?(@.type=="RouteAccepted")].status`,
	} {
		c, ok := cols[name]
		if !ok || c.JSONPath != path || c.Priority != 1 {
			t.Errorf("wide printer column %s = %+v, want JSONPath %s at priority 1", name, c, path)
		}
	}
}

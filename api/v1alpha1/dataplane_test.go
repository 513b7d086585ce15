package v1alpha1_test

import (
	"encoding/json"
	"regexp"
	"slices"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/epd-dev/coordinator/dataplane/config"
	"github.com/epd-dev/coordinator/dataplane/connectors/ec"
	"github.com/epd-dev/coordinator/dataplane/connectors/kv"
	"github.com/epd-dev/coordinator/dataplane/pipeline/registry"
	_ "github.com/epd-dev/coordinator/dataplane/steps" // registers every step type, async-broker included

	v1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// strs converts a list of string-typed API values.
func strs[S ~string](in []S) []string {
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = string(s)
	}
	return out
}

// enumOf decodes a schema's enum values.
func enumOf(t *testing.T, s apiextensionsv1.JSONSchemaProps) []string {
	t.Helper()
	out := make([]string, len(s.Enum))
	for i, v := range s.Enum {
		if err := json.Unmarshal(v.Raw, &out[i]); err != nil {
			t.Fatalf("enum value %s: %v", v.Raw, err)
		}
	}
	return out
}

// The names the API accepts are the data plane's: for step types and both connector kinds, the
// CRD enum (generated from the +kubebuilder:validation:Enum marker) lists the API's list in the
// same order, and as a set that list is what the data plane registers or implements. The CRD
// defaults of the connectors are the data plane's defaults.
func TestNamesMatchTheDataPlane(t *testing.T) {
	pl := loadCRD(t).Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["pipeline"]
	tests := map[string]struct {
		schema      apiextensionsv1.JSONSchemaProps
		api         []string // the API's list (StepTypes, KVConnectors, ECConnectors)
		dataPlane   []string // what the data plane knows
		wantDefault string   // the CRD default, when the field has one
	}{
		"step types": {
			schema:    pl.Properties["steps"].Items.Schema.Properties["type"],
			api:       strs(v1alpha1.StepTypes),
			dataPlane: registry.Names(),
		},
		"KV connectors": {
			schema:      pl.Properties["kvConnector"],
			api:         strs(v1alpha1.KVConnectors),
			dataPlane:   kv.Names(),
			wantDefault: config.DefaultKVConnector,
		},
		"EC connectors": {
			schema:      pl.Properties["ecConnector"],
			api:         strs(v1alpha1.ECConnectors),
			dataPlane:   ec.Names(),
			wantDefault: config.DefaultECConnector,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if enum := enumOf(t, tc.schema); !slices.Equal(enum, tc.api) {
				t.Errorf("CRD enum %q, API list %q: the Enum marker and the list must agree (then `make manifests`)", enum, tc.api)
			}
			if api, dp := slices.Sorted(slices.Values(tc.api)), slices.Sorted(slices.Values(tc.dataPlane)); !slices.Equal(api, dp) {
				t.Errorf("the API accepts %q, the data plane knows %q", api, dp)
			}
			var def string
			if tc.schema.Default != nil {
				if err := json.Unmarshal(tc.schema.Default.Raw, &def); err != nil {
					t.Fatal(err)
				}
			}
			if def != tc.wantDefault {
				t.Errorf("CRD default %q, want the data plane's %q", def, tc.wantDefault)
			}
		})
	}
}

// The CEL rules on the pipeline and its steps name step types only as literals of StepTypes (the
// duplicate check derives the types from the steps themselves instead of listing them), so a
// renamed or removed step type cannot linger in a rule.
func TestCELRulesNameOnlyKnownStepTypes(t *testing.T) {
	pl := loadCRD(t).Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["pipeline"]
	rules := append(slices.Clone(pl.XValidations), pl.Properties["steps"].XValidations...)
	if len(rules) < 5 {
		t.Fatalf("%d CEL rules on spec.pipeline and its steps, want at least 5: %+v", len(rules), rules)
	}
	literal := regexp.MustCompile(`'([^']*)'`)
	for _, r := range rules {
		for _, m := range literal.FindAllStringSubmatch(r.Rule, -1) {
			if !slices.Contains(strs(v1alpha1.StepTypes), m[1]) {
				t.Errorf("rule %q names %q, which is not a step type", r.Rule, m[1])
			}
		}
	}
}

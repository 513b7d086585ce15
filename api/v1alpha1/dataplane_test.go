package v1alpha1_test

import (
	"crypto/tls"
	"encoding/json"
	"regexp"
	"slices"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/connectors/ec"
	"github.com/epd-dev/coordinator/dataplane/connectors/kv"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
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
			dataPlane: builder.Types.Names(),
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
		// No CRD default: the data plane's applies (TestPoolFailurePoliciesMatchTheDataPlane).
		"pool failure policies": {
			schema:    pl.Properties["onPoolFailure"],
			api:       strs(v1alpha1.PoolFailurePolicies),
			dataPlane: []string{config.OnPoolFailureAggregate, config.OnPoolFailureFail},
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

// The CEL rules on the pipeline and its steps name step types and KV connectors only as literals
// of StepTypes and KVConnectors (the duplicate check derives the types from the steps themselves
// instead of listing them), so a renamed or removed one cannot linger in a rule.
func TestCELRulesNameOnlyKnownStepTypes(t *testing.T) {
	pl := loadCRD(t).Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["pipeline"]
	rules := append(slices.Clone(pl.XValidations), pl.Properties["steps"].XValidations...)
	if len(rules) < 5 {
		t.Fatalf("%d CEL rules on spec.pipeline and its steps, want at least 5: %+v", len(rules), rules)
	}
	literal := regexp.MustCompile(`'([^']*)'`)
	for _, r := range rules {
		for _, m := range literal.FindAllStringSubmatch(r.Rule, -1) {
			if !slices.Contains(strs(v1alpha1.StepTypes), m[1]) && !slices.Contains(strs(v1alpha1.KVConnectors), m[1]) {
				t.Errorf("rule %q names %q, which is neither a step type nor a KV connector", r.Rule, m[1])
			}
		}
	}
}

// The TLS versions and cipher suites the API accepts are ones the data plane accepts (its
// server.tls_min_version and server.tls_cipher_suites validation), the versions from TLS 1.2 on,
// the suites exactly Go's secure TLS 1.2 ones (crypto/tls.CipherSuites; TLS 1.3 suites are not
// configurable); and the CRD enums list the API's lists.
func TestTLSNamesMatchTheDataPlane(t *testing.T) {
	tlsSchema := loadCRD(t).Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["server"].Properties["tls"]
	if enum, api := enumOf(t, tlsSchema.Properties["minVersion"]), strs(v1alpha1.TLSVersions); !slices.Equal(enum, api) {
		t.Errorf("CRD enum %q, API list %q: the Enum marker and the list must agree (then `make manifests`)", enum, api)
	}
	if enum, api := enumOf(t, *tlsSchema.Properties["cipherSuites"].Items.Schema), strs(v1alpha1.TLSCipherSuites); !slices.Equal(enum, api) {
		t.Errorf("CRD enum %q, API list %q: the Enum marker and the list must agree (then `make manifests`)", enum, api)
	}
	for _, v := range v1alpha1.TLSVersions {
		id, ok := config.TLSVersionNames[string(v)]
		if !ok || id < tls.VersionTLS12 {
			t.Errorf("TLS version %s: the data plane knows %v (id %#x); the API offers TLS 1.2 and later only", v, ok, id)
		}
		cfg := config.Default()
		cfg.Server.TLSMinVersion = string(v)
		if got := cfg.Server.TLSMinVersionID(); got != id {
			t.Errorf("TLS version %s: the data plane would use %#x", v, got)
		}
	}
	var goSuites []string
	for _, c := range tls.CipherSuites() {
		if slices.Contains(c.SupportedVersions, tls.VersionTLS12) {
			goSuites = append(goSuites, c.Name)
		}
	}
	if api := slices.Sorted(slices.Values(strs(v1alpha1.TLSCipherSuites))); !slices.Equal(api, slices.Sorted(slices.Values(goSuites))) {
		t.Errorf("the API accepts the cipher suites %q, Go's secure TLS 1.2 suites are %q", api, goSuites)
	}
	for _, c := range v1alpha1.TLSCipherSuites {
		cfg := config.Default()
		cfg.Gateway.Address = "http://gw"
		cfg.Pipeline.Steps = []config.Step{{Type: "decode"}}
		cfg.Server.TLSCipherSuites = []string{string(c)}
		if err := cfg.Validate(); err != nil {
			t.Errorf("cipher suite %s: the data plane refuses it: %v", c, err)
		}
		if ids := cfg.Server.TLSCipherSuiteIDs(); len(ids) != 1 {
			t.Errorf("cipher suite %s: the data plane would use %v", c, ids)
		}
	}
}

// validConfig is the smallest configuration config.Validate accepts.
func validConfig() config.Config {
	cfg := config.Default()
	cfg.Gateway.Address = "http://gw"
	cfg.Pipeline.Steps = []config.Step{{Type: "decode"}}
	return cfg
}

// Every pool failure policy the API offers is one the data plane accepts, and the data plane's
// default (what an unset spec.pipeline.onPoolFailure means) is one of them.
func TestPoolFailurePoliciesMatchTheDataPlane(t *testing.T) {
	for _, p := range v1alpha1.PoolFailurePolicies {
		cfg := validConfig()
		cfg.Pipeline.OnPoolFailure = string(p)
		if err := cfg.Validate(); err != nil {
			t.Errorf("pool failure policy %s: the data plane refuses it: %v", p, err)
		}
	}
	if !slices.Contains(strs(v1alpha1.PoolFailurePolicies), config.DefaultOnPoolFailure) {
		t.Errorf("the data plane's default pool failure policy %q is not one the API offers", config.DefaultOnPoolFailure)
	}
}

// The bounds of spec.gateway.maxResponseSizeMiB and spec.gateway.retry in the CRD are inside the
// data plane's (config.Validate accepts both ends, as the operator renders them), and where the
// data plane has the same bound the CRD does not accept more (one step out is refused).
func TestGatewayBoundsMatchTheDataPlane(t *testing.T) {
	gw := loadCRD(t).Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["gateway"]
	retry := gw.Properties["retry"]
	tests := map[string]struct {
		schema apiextensionsv1.JSONSchemaProps
		set    func(*config.Config, float64) // sets the rendered value of the API's v
		// minRefused, maxRefused: the data plane refuses one step below the minimum, above the maximum.
		minRefused, maxRefused bool
	}{
		"maxResponseSizeMiB": {
			schema: gw.Properties["maxResponseSizeMiB"],
			set:    func(c *config.Config, v float64) { c.Gateway.MaxResponseSize = int(v) },
			// 0 is the data plane's "default"; its maximum is far above the CRD's 64 GiB.
		},
		"retry.maxAttempts": {
			schema:     retry.Properties["maxAttempts"],
			set:        func(c *config.Config, v float64) { c.Gateway.Retry.MaxAttempts = int(v) },
			minRefused: true, maxRefused: true,
		},
		"retry.budgetPercent": {
			schema:     retry.Properties["budgetPercent"],
			set:        func(c *config.Config, v float64) { c.Gateway.Retry.BudgetRatio = v / 100 },
			minRefused: true, maxRefused: true,
		},
		"retry.budgetMinPerSecond": {
			schema:     retry.Properties["budgetMinPerSecond"],
			set:        func(c *config.Config, v float64) { c.Gateway.Retry.BudgetMinPerSecond = v },
			minRefused: true, maxRefused: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if tc.schema.Minimum == nil || tc.schema.Maximum == nil {
				t.Fatalf("the CRD has no minimum or maximum: %+v", tc.schema)
			}
			check := func(v float64, wantOK bool) {
				t.Helper()
				cfg := validConfig()
				tc.set(&cfg, v)
				if err := cfg.Validate(); (err == nil) != wantOK {
					t.Errorf("value %v: data plane error %v, want accepted=%v", v, err, wantOK)
				}
			}
			lo, hi := *tc.schema.Minimum, *tc.schema.Maximum
			check(lo, true)
			check(hi, true)
			if tc.minRefused {
				check(lo-1, false)
			}
			if tc.maxRefused {
				check(hi+1, false)
			}
		})
	}
}

// Package samples checks the deployment examples under config/samples/<example>/ (docs/install.md):
// every object is a valid object of its kind (strict typed decoding, then a server-side dry-run
// create against a real kube-apiserver carrying our CRD, GAIE's InferencePool CRD and Gateway API's
// CRDs); the endpoint picker configuration follows the llm-d router's documented schema; and the
// names and protocol choices agree across the objects (pool, picker, gateway, profile header, roles,
// connectors).
package samples

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
	dpconfig "github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/test/harness/prereq"
)

// examples are the example directories under config/samples and the profiles their endpoint
// picker must offer (one per kind of leg their pipelines send). A new directory with a
// kustomization.yaml must be listed here (TestExamplesAreListed).
var examples = []struct {
	dir      string
	profiles []string
}{
	{dir: "pd-nixl", profiles: []string{"prefill", "decode"}},
	{dir: "epd-nixl", profiles: []string{"encode", "prefill", "decode"}},
}

// ---------------------------------------------------------------------------------------------
// The llm-d router's EndpointPickerConfig, mirrored from llm-d/llm-d-router
// apix/config/v1alpha1/endpointpickerconfig_types.go (commit 0443359281459419930a4a724ade4aa35b046035).
// GAIE v1.6.0 (go.mod) no longer carries these types. The EPP decodes the file strictly
// (pkg/epp/config/loader/configloader.go, commit 03fdf9197a30892cac458515df5139b4267d4c40:
// serializer.EnableStrict) and each plugin's parameters strictly too (fwkplugin.StrictDecoder), so
// unknown fields are errors here as well.

type eppConfig struct {
	APIVersion         string          `json:"apiVersion"`
	Kind               string          `json:"kind"`
	FeatureGates       []string        `json:"featureGates,omitempty"`
	Plugins            []eppPlugin     `json:"plugins"`
	SchedulingProfiles []eppProfile    `json:"schedulingProfiles"`
	DataLayer          json.RawMessage `json:"dataLayer,omitempty"`
	FlowControl        json.RawMessage `json:"flowControl,omitempty"`
	RequestHandler     json.RawMessage `json:"requestHandler,omitempty"`
	SaturationDetector json.RawMessage `json:"saturationDetector,omitempty"`
	Parser             json.RawMessage `json:"parser,omitempty"`
}

type eppPlugin struct {
	Name       string          `json:"name,omitempty"`
	Type       string          `json:"type"`
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// name is the plugin's reference name: its type when unnamed (PluginSpec.Name).
func (p eppPlugin) name() string {
	if p.Name != "" {
		return p.Name
	}
	return p.Type
}

type eppProfile struct {
	Name    string             `json:"name"`
	Plugins []eppProfilePlugin `json:"plugins"`
}

type eppProfilePlugin struct {
	PluginRef string   `json:"pluginRef"`
	Weight    *float64 `json:"weight,omitempty"`
}

// eppAPIVersion is the current group; the loader still accepts (and warns about) the deprecated
// inference.networking.x-k8s.io/v1alpha1. The examples use the current one.
const eppAPIVersion = "llm-d.ai/v1alpha1"

// Plugin categories.
const (
	profileHandler = "profile-handler"
	filter         = "filter"
	scorer         = "scorer"
	picker         = "picker"
	producer       = "producer"
	decider        = "decider"
)

type pluginType struct {
	category string
	alpha    bool // registered with fwkplugin.StabilityAlpha: needs --allow-experimental-plugins
	source   string
}

// Plugin types and where they are documented (llm-d/llm-d-router unless noted). Stability from
// cmd/epp/runner/runner.go (commit cbdffab04d2333f5479d173be05ff25d829e403b, registerInTreePlugins).
const (
	srcHeaderProfile = "pkg/epp/framework/plugins/scheduling/profilehandler/headerprofile/header_profile_handler.go@52f21d78c95fbdd6c0d3b1d05e910c9d7d591307"
	srcRoles         = "pkg/epp/framework/plugins/scheduling/filter/bylabel/roles.go@533a218d927b055aa9d057cf3e15e51d23caaec8"
	srcByLabel       = "pkg/epp/framework/plugins/scheduling/filter/bylabel/README.md@5b5d2ead72de9e127b4039d79ad632d865003bf2"
	srcPDConfig      = "deploy/config/pd-epp-config.yaml@e068babb6e59cde83464bb7139660f18787348a6"
	srcCoordGuide    = "llm-d/llm-d guides/coord-disaggregation/router/coord-disaggregation.values.yaml@04ca2548d780e2d48d6831f951c34a89be7775c8"
	srcRunner        = "cmd/epp/runner/runner.go@cbdffab04d2333f5479d173be05ff25d829e403b"
)

var pluginTypes = map[string]pluginType{
	"header-profile-handler":       {profileHandler, true, srcHeaderProfile},
	"single-profile-handler":       {profileHandler, false, srcRunner},
	"disagg-profile-handler":       {profileHandler, false, srcPDConfig},
	"encode-filter":                {filter, false, srcRoles},
	"prefill-filter":               {filter, false, srcRoles},
	"decode-filter":                {filter, false, srcRoles},
	"label-selector-filter":        {filter, false, srcByLabel},
	"prefix-cache-affinity-filter": {filter, false, srcCoordGuide},
	"approx-prefix-cache-producer": {producer, false, srcPDConfig},
	"inflight-load-producer":       {producer, false, srcCoordGuide},
	"prefix-cache-scorer":          {scorer, false, srcPDConfig},
	"queue-scorer":                 {scorer, false, srcPDConfig},
	"active-request-scorer":        {scorer, false, srcCoordGuide},
	"token-load-scorer":            {scorer, false, srcCoordGuide},
	"max-score-picker":             {picker, false, srcPDConfig},
	"prefix-based-pd-decider":      {decider, false, srcPDConfig},
}

// headerProfileParams are header-profile-handler's parameters (srcHeaderProfile) and its defaults.
type headerProfileParams struct {
	HeaderName     string `json:"headerName,omitempty"`
	DefaultProfile string `json:"defaultProfile,omitempty"`
}

const (
	defaultEPPProfileHeader  = "EPP-Profile"
	defaultEPPDefaultProfile = "decode"
)

// labelSelectorParams are label-selector-filter's parameters (srcByLabel).
type labelSelectorParams struct {
	MatchLabels      map[string]string                 `json:"matchLabels,omitempty"`
	MatchExpressions []metav1.LabelSelectorRequirement `json:"matchExpressions,omitempty"`
}

// roleLabel and the roles each role filter keeps (srcRoles); decode-filter also keeps pods
// without the label.
const roleLabel = "llm-d.ai/role"

var roleFilters = map[string]struct {
	roles     []string
	unlabeled bool
}{
	"encode-filter":  {roles: []string{"encode", "encode-prefill", "encode-prefill-decode"}},
	"prefill-filter": {roles: []string{"prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode"}},
	"decode-filter":  {roles: []string{"decode", "prefill-decode", "both", "encode-prefill-decode"}, unlabeled: true},
}

// servesPhase reports whether a pod of role (an llm-d.ai/role value) runs phase.
func servesPhase(role, phase string) bool {
	if role == "both" {
		return phase == "prefill" || phase == "decode"
	}
	return slices.Contains(strings.Split(role, "-"), phase)
}

// strictJSON decodes data into v, refusing unknown fields and trailing data.
func strictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	return nil
}

// parseEPPConfig strictly decodes an EndpointPickerConfig file.
func parseEPPConfig(text string) (*eppConfig, error) {
	j, err := yaml.YAMLToJSON([]byte(text))
	if err != nil {
		return nil, err
	}
	cfg := &eppConfig{}
	return cfg, strictJSON(j, cfg)
}

// validateEPPConfig checks cfg against the documented schema and returns every problem.
func validateEPPConfig(cfg *eppConfig) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if cfg.APIVersion != eppAPIVersion || cfg.Kind != "EndpointPickerConfig" {
		bad("apiVersion/kind %s/%s, want %s/EndpointPickerConfig", cfg.APIVersion, cfg.Kind, eppAPIVersion)
	}
	if len(cfg.Plugins) == 0 || len(cfg.SchedulingProfiles) == 0 {
		bad("plugins and schedulingProfiles are required")
	}
	declared := map[string]eppPlugin{}
	handlers := 0
	for i, p := range cfg.Plugins {
		pt, ok := pluginTypes[p.Type]
		if !ok {
			bad("plugins[%d]: type %q is not a documented plugin type", i, p.Type)
			continue
		}
		if _, dup := declared[p.name()]; dup {
			bad("plugins[%d]: name %q declared twice", i, p.name())
		}
		declared[p.name()] = p
		if pt.category == profileHandler {
			handlers++
		}
		if err := checkParameters(p); err != nil {
			bad("plugins[%d] (%s): parameters: %v", i, p.name(), err)
		}
	}
	// The loader requires exactly one profile handler (buildSchedulerConfig).
	if handlers != 1 {
		bad("%d profile handlers, the EPP needs exactly one", handlers)
	}
	profiles := map[string]bool{}
	for i, sp := range cfg.SchedulingProfiles {
		if sp.Name == "" || profiles[sp.Name] {
			bad("schedulingProfiles[%d]: empty or duplicate name %q", i, sp.Name)
		}
		profiles[sp.Name] = true
		pickers := 0
		for j, ref := range sp.Plugins {
			p, ok := declared[ref.PluginRef]
			if !ok {
				bad("schedulingProfiles[%d] (%s).plugins[%d]: pluginRef %q names no declared plugin", i, sp.Name, j, ref.PluginRef)
				continue
			}
			cat := pluginTypes[p.Type].category
			switch cat {
			case filter, scorer, picker:
			default:
				bad("schedulingProfiles[%d] (%s): %q is a %s, not a filter, scorer or picker", i, sp.Name, ref.PluginRef, cat)
			}
			if cat == picker {
				pickers++
			}
			if ref.Weight != nil && (cat != scorer || *ref.Weight <= 0) {
				bad("schedulingProfiles[%d] (%s): weight %v on %q: weights are for scorers and positive", i, sp.Name, *ref.Weight, ref.PluginRef)
			}
		}
		if pickers > 1 {
			bad("schedulingProfiles[%d] (%s): %d pickers", i, sp.Name, pickers)
		}
	}
	// header-profile-handler's defaultProfile must be a profile (else headerless calls fail).
	if h, ok := headerHandler(cfg); ok && !profiles[h.DefaultProfile] {
		bad("header-profile-handler defaultProfile %q is not a scheduling profile", h.DefaultProfile)
	}
	return errs
}

// checkParameters strictly decodes the parameters of the plugin types that take any; the others
// must have none.
func checkParameters(p eppPlugin) error {
	if len(p.Parameters) == 0 || string(p.Parameters) == "null" {
		return nil
	}
	switch p.Type {
	case "header-profile-handler":
		return strictJSON(p.Parameters, &headerProfileParams{})
	case "label-selector-filter":
		return strictJSON(p.Parameters, &labelSelectorParams{})
	}
	return fmt.Errorf("this test knows no parameters of %q: add their schema (from its README) before setting any", p.Type)
}

// headerHandler returns the header-profile-handler's effective parameters.
func headerHandler(cfg *eppConfig) (headerProfileParams, bool) {
	for _, p := range cfg.Plugins {
		if p.Type != "header-profile-handler" {
			continue
		}
		var hp headerProfileParams
		if len(p.Parameters) > 0 {
			_ = json.Unmarshal(p.Parameters, &hp)
		}
		hp.HeaderName = strings.TrimSpace(hp.HeaderName)
		if hp.HeaderName == "" {
			hp.HeaderName = defaultEPPProfileHeader
		}
		if strings.TrimSpace(hp.DefaultProfile) == "" {
			hp.DefaultProfile = defaultEPPDefaultProfile
		}
		return hp, true
	}
	return headerProfileParams{}, false
}

// The mirror itself refuses what the EPP refuses, so the checks above mean something.
func TestEPPConfigValidatorRejects(t *testing.T) {
	const base = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: header-profile-handler
- type: decode-filter
- type: max-score-picker
- type: queue-scorer
schedulingProfiles:
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
`
	cfg, err := parseEPPConfig(base)
	if err != nil {
		t.Fatal(err)
	}
	if errs := validateEPPConfig(cfg); len(errs) != 0 {
		t.Fatalf("base config refused: %v", errs)
	}
	tests := map[string]struct {
		old, new string
		parseErr bool
	}{
		"unknown top-level field":   {old: "plugins:\n", new: "plugin:\n- type: x\nplugins:\n", parseErr: true},
		"unknown plugin field":      {old: "- type: decode-filter\n", new: "- type: decode-filter\n  param: {}\n", parseErr: true},
		"unknown profile field":     {old: "  - pluginRef: decode-filter\n", new: "  - pluginRef: decode-filter\n    weigth: 2\n", parseErr: true},
		"undocumented type":         {old: "- type: queue-scorer\n", new: "- type: queue-scorer\n- type: teleport-scorer\n"},
		"dangling pluginRef":        {old: "  - pluginRef: decode-filter\n", new: "  - pluginRef: prefill-filter\n"},
		"no profile handler":        {old: "- type: header-profile-handler\n", new: ""},
		"two profile handlers":      {old: "- type: header-profile-handler\n", new: "- type: header-profile-handler\n- type: single-profile-handler\n"},
		"deprecated apiVersion":     {old: "llm-d.ai/v1alpha1", new: "inference.networking.x-k8s.io/v1alpha1"},
		"unknown handler parameter": {old: "- type: header-profile-handler\n", new: "- type: header-profile-handler\n  parameters: {header: x}\n"},
		"weight on a filter":        {old: "  - pluginRef: decode-filter\n", new: "  - pluginRef: decode-filter\n    weight: 1\n"},
		"default profile missing":   {old: "- type: header-profile-handler\n", new: "- type: header-profile-handler\n  parameters: {defaultProfile: prefill}\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			text := strings.Replace(base, tc.old, tc.new, 1)
			if text == base {
				t.Fatal("replacement did not apply")
			}
			cfg, err := parseEPPConfig(text)
			if tc.parseErr {
				if err == nil {
					t.Fatal("parsed, want a strict decoding error")
				}
				return
			}
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if errs := validateEPPConfig(cfg); len(errs) == 0 {
				t.Fatal("accepted")
			}
		})
	}
}

// ---------------------------------------------------------------------------------------------
// Loading the examples.

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}

// kustomize builds dir with the kustomize API (the library behind `kubectl apply -k`).
func kustomize(dir string) ([]*unstructured.Unstructured, error) {
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, err
	}
	var objs []*unstructured.Unstructured
	for _, r := range res.Resources() {
		b, err := r.MarshalJSON()
		if err != nil {
			return nil, err
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(b); err != nil {
			return nil, err
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(coordinatorv1alpha1.AddToScheme(s))
	utilruntime.Must(infv1.Install(s))
	utilruntime.Must(gatewayv1.Install(s))
	return s
}

// example is one built example with its objects decoded into their Go types.
type example struct {
	dir       string
	profiles  []string
	objs      []*unstructured.Unstructured
	pipelines []*coordinatorv1alpha1.CoordinatorPipeline
	pools     map[string]*infv1.InferencePool
	gateways  map[string]*gatewayv1.Gateway
	services  map[string]*corev1.Service
	deploys   map[string]*appsv1.Deployment
	configMap map[string]*corev1.ConfigMap
}

var (
	loadOnce sync.Once
	loaded   []*example
	loadErr  error
)

// loadExamples builds and strictly decodes every example once for all tests.
func loadExamples(t *testing.T) []*example {
	t.Helper()
	root := repoRoot(t)
	loadOnce.Do(func() {
		scheme := newScheme()
		for _, e := range examples {
			ex := &example{
				dir: e.dir, profiles: e.profiles,
				pools: map[string]*infv1.InferencePool{}, gateways: map[string]*gatewayv1.Gateway{},
				services: map[string]*corev1.Service{}, deploys: map[string]*appsv1.Deployment{},
				configMap: map[string]*corev1.ConfigMap{},
			}
			ex.objs, loadErr = kustomize(filepath.Join(root, "config", "samples", e.dir))
			if loadErr != nil {
				loadErr = fmt.Errorf("kustomize build config/samples/%s: %w", e.dir, loadErr)
				return
			}
			for _, u := range ex.objs {
				typed, err := scheme.New(u.GroupVersionKind())
				if err != nil {
					loadErr = fmt.Errorf("%s: %s %s: %w", e.dir, u.GetKind(), u.GetName(), err)
					return
				}
				b, _ := u.MarshalJSON()
				if err := strictJSON(b, typed); err != nil {
					loadErr = fmt.Errorf("%s: %s %s does not decode strictly into its Go type: %w", e.dir, u.GetKind(), u.GetName(), err)
					return
				}
				switch o := typed.(type) {
				case *coordinatorv1alpha1.CoordinatorPipeline:
					ex.pipelines = append(ex.pipelines, o)
				case *infv1.InferencePool:
					ex.pools[o.Name] = o
				case *gatewayv1.Gateway:
					ex.gateways[o.Name] = o
				case *corev1.Service:
					ex.services[o.Name] = o
				case *appsv1.Deployment:
					ex.deploys[o.Name] = o
				case *corev1.ConfigMap:
					ex.configMap[o.Name] = o
				}
			}
			loaded = append(loaded, ex)
		}
	})
	if loadErr != nil {
		t.Fatal(loadErr)
	}
	return loaded
}

// Every example directory is in the table, and config/samples itself still builds to the one
// CoordinatorPipeline the OLM bundle's alm-examples and `make demo` use (the examples live in
// subdirectories so that neither picks them up).
func TestExamplesAreListed(t *testing.T) {
	root := repoRoot(t)
	dirs, err := filepath.Glob(filepath.Join(root, "config", "samples", "*", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var found, listed []string
	for _, d := range dirs {
		found = append(found, filepath.Base(filepath.Dir(d)))
	}
	for _, e := range examples {
		listed = append(listed, e.dir)
	}
	sort.Strings(found)
	sort.Strings(listed)
	if !slices.Equal(found, listed) {
		t.Errorf("example directories %v, table %v", found, listed)
	}
	objs, err := kustomize(filepath.Join(root, "config", "samples"))
	if err != nil {
		t.Fatalf("kustomize build config/samples: %v", err)
	}
	if len(objs) != 1 || objs[0].GetKind() != "CoordinatorPipeline" {
		t.Errorf("config/samples builds %d objects, want the one CoordinatorPipeline of alm-examples", len(objs))
	}
}

// ---------------------------------------------------------------------------------------------
// The API server: one for every test of the package.

var (
	envOnce   sync.Once
	envClient client.Client
	envStop   func()
	envErr    error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if envStop != nil {
		envStop()
	}
	os.Exit(code)
}

func moduleDir(root, module string) (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", module)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s: %w", module, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// apiServer starts (once) a kube-apiserver and etcd with our CRD, GAIE's InferencePool CRD,
// Gateway API's standard GatewayClass, Gateway and HTTPRoute CRDs, at the versions in go.mod, and
// KEDA's ScaledObject CRD (testdata/keda).
func apiServer(t *testing.T) client.Client {
	t.Helper()
	assets := prereq.KubebuilderAssets(t)
	root := repoRoot(t)
	envOnce.Do(func() {
		gaie, err := moduleDir(root, "sigs.k8s.io/gateway-api-inference-extension")
		if err != nil {
			envErr = err
			return
		}
		gw, err := moduleDir(root, "sigs.k8s.io/gateway-api")
		if err != nil {
			envErr = err
			return
		}
		std := filepath.Join(gw, "config", "crd", "standard")
		env := &envtest.Environment{
			BinaryAssetsDirectory: assets,
			CRDDirectoryPaths: []string{
				filepath.Join(root, "config", "crd", "bases"),
				filepath.Join(gaie, "config", "crd", "bases", "inference.networking.k8s.io_inferencepools.yaml"),
				filepath.Join(std, "gateway.networking.k8s.io_gatewayclasses.yaml"),
				filepath.Join(std, "gateway.networking.k8s.io_gateways.yaml"),
				filepath.Join(std, "gateway.networking.k8s.io_httproutes.yaml"),
				filepath.Join(root, "test", "packaging", "samples", "testdata", "keda", "keda.sh_scaledobjects.yaml"),
			},
			ErrorIfCRDPathMissing: true,
		}
		cfg, err := env.Start()
		if err != nil {
			envErr = fmt.Errorf("envtest: %w", err)
			return
		}
		envStop = func() { _ = env.Stop() }
		envClient, envErr = client.New(cfg, client.Options{Scheme: newScheme()})
	})
	if envErr != nil {
		t.Fatal(envErr)
	}
	return envClient
}

// The API server accepts every object of every example, as `kubectl apply -k` would send it:
// a server-side dry-run create with strict field validation in a fresh namespace, so each object
// is checked against its kind's OpenAPI schema (built-in kinds) or CRD schema and CEL rules (ours,
// GAIE's, Gateway API's).
func TestExamplesPassAPIServerValidation(t *testing.T) {
	c := apiServer(t)
	ctx := context.Background()
	for i, ex := range loadExamples(t) {
		t.Run(ex.dir, func(t *testing.T) {
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "samples-" + strconv.Itoa(i) + "-" + ex.dir}}
			if err := c.Create(ctx, ns); err != nil {
				t.Fatal(err)
			}
			for _, o := range ex.objs {
				u := o.DeepCopy()
				u.SetNamespace(ns.Name)
				if err := c.Create(ctx, u, client.DryRunAll, client.FieldValidation("Strict")); err != nil {
					t.Errorf("%s %s: %v", u.GetKind(), u.GetName(), err)
				}
			}
		})
	}
}

// ---------------------------------------------------------------------------------------------
// The endpoint picker and the names across objects.

// eppOf is the endpoint picker of pool: its Service, Deployment, configuration file and config.
type eppOf struct {
	service *corev1.Service
	deploy  *appsv1.Deployment
	args    []string
	config  *eppConfig
}

// flagValue returns the value of --name=value or --name value in args.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

func selects(selector map[string]string, podLabels map[string]string) bool {
	return len(selector) > 0 && labels.SelectorFromSet(selector).Matches(labels.Set(podLabels))
}

// resolveEPP follows pool.spec.endpointPickerRef to the Service, the Deployment behind it, the
// ConfigMap file its --config-file names, and parses that file.
func resolveEPP(t *testing.T, ex *example, pool *infv1.InferencePool) *eppOf {
	t.Helper()
	ref := pool.Spec.EndpointPickerRef
	if ref == nil {
		t.Fatalf("InferencePool %s has no endpointPickerRef", pool.Name)
	}
	if ref.Kind != "" && ref.Kind != "Service" {
		t.Fatalf("InferencePool %s: endpointPickerRef kind %q, want Service", pool.Name, ref.Kind)
	}
	svc := ex.services[string(ref.Name)]
	if svc == nil {
		t.Fatalf("InferencePool %s: endpointPickerRef names Service %q, not in the example", pool.Name, ref.Name)
	}
	if ref.Port == nil || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == int32(ref.Port.Number) }) {
		t.Fatalf("InferencePool %s: endpointPickerRef port %v is not a port of Service %s", pool.Name, ref.Port, svc.Name)
	}
	e := &eppOf{service: svc}
	for _, d := range ex.deploys {
		if selects(svc.Spec.Selector, d.Spec.Template.Labels) {
			if e.deploy != nil {
				t.Fatalf("Service %s selects Deployments %s and %s", svc.Name, e.deploy.Name, d.Name)
			}
			e.deploy = d
		}
	}
	if e.deploy == nil {
		t.Fatalf("Service %s selects no Deployment of the example", svc.Name)
	}
	pod := e.deploy.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("EPP Deployment %s: %d containers, want 1", e.deploy.Name, len(pod.Containers))
	}
	ctr := pod.Containers[0]
	e.args = append(slices.Clone(ctr.Command), ctr.Args...)
	if v, _ := flagValue(e.args, "pool-name"); v != pool.Name {
		t.Errorf("EPP Deployment %s: --pool-name %q, want the InferencePool %s", e.deploy.Name, v, pool.Name)
	}
	if v, ok := flagValue(e.args, "pool-group"); ok && v != infv1.GroupVersion.Group {
		t.Errorf("EPP Deployment %s: --pool-group %q, want %s", e.deploy.Name, v, infv1.GroupVersion.Group)
	}
	// The svc's target port is a container port of the EPP.
	for _, sp := range svc.Spec.Ports {
		if sp.Port != int32(ref.Port.Number) {
			continue
		}
		if !slices.ContainsFunc(ctr.Ports, func(cp corev1.ContainerPort) bool {
			return cp.Name == sp.TargetPort.StrVal || cp.ContainerPort == sp.TargetPort.IntVal || (sp.TargetPort.StrVal == "" && sp.TargetPort.IntVal == 0 && cp.ContainerPort == sp.Port)
		}) {
			t.Errorf("Service %s port %d targets %s, not a port of the EPP container", svc.Name, sp.Port, sp.TargetPort.String())
		}
	}
	file, ok := flagValue(e.args, "config-file")
	if !ok {
		t.Fatalf("EPP Deployment %s has no --config-file", e.deploy.Name)
	}
	var text string
	for _, m := range ctr.VolumeMounts {
		key, ok := strings.CutPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name || v.ConfigMap == nil {
				continue
			}
			cm := ex.configMap[v.ConfigMap.Name]
			if cm == nil {
				t.Fatalf("EPP Deployment %s mounts ConfigMap %s, not in the example", e.deploy.Name, v.ConfigMap.Name)
			}
			text, ok = cm.Data[key]
			if !ok {
				t.Fatalf("--config-file %s: ConfigMap %s has no key %q", file, cm.Name, key)
			}
		}
	}
	if text == "" {
		t.Fatalf("EPP Deployment %s: --config-file %s is not in a mounted ConfigMap", e.deploy.Name, file)
	}
	cfg, err := parseEPPConfig(text)
	if err != nil {
		t.Fatalf("EPP config %s: %v", file, err)
	}
	e.config = cfg
	return e
}

// The endpoint picker configuration of every example passes the documented schema, and the EPP
// runs with the flags its plugins need.
func TestExamplesEPPConfig(t *testing.T) {
	for _, ex := range loadExamples(t) {
		t.Run(ex.dir, func(t *testing.T) {
			if len(ex.pools) == 0 {
				t.Fatal("no InferencePool")
			}
			for _, pool := range ex.pools {
				e := resolveEPP(t, ex, pool)
				for _, err := range validateEPPConfig(e.config) {
					t.Error(err)
				}
				for _, p := range e.config.Plugins {
					if pluginTypes[p.Type].alpha {
						if v, _ := flagValue(e.args, "allow-experimental-plugins"); v != "true" {
							t.Errorf("plugin %s is Alpha (%s): the EPP refuses it without --allow-experimental-plugins=true", p.Type, srcRunner)
						}
					}
				}
				for _, name := range ex.profiles {
					if !slices.ContainsFunc(e.config.SchedulingProfiles, func(sp eppProfile) bool { return sp.Name == name }) {
						t.Errorf("no scheduling profile %q", name)
					}
				}
			}
		})
	}
}

// legProfiles are the EPP profiles the legs of a pipeline's steps carry (dataplane/transport/gateway).
func legProfiles(cp *coordinatorv1alpha1.CoordinatorPipeline) []string {
	var out []string
	add := func(p string) {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	for _, s := range cp.Spec.Pipeline.Steps {
		switch string(s.Type) {
		case "encode":
			add("encode")
		case "prefill":
			add("prefill")
		case "decode", "conditional-decode":
			add("decode")
		case "prefill-decode":
			add("prefill")
			add("decode")
		}
	}
	return out
}

// transferConfig returns the JSON value of a vLLM flag such as --kv-transfer-config.
func transferConfig(t *testing.T, args []string, flag string) map[string]any {
	t.Helper()
	v, ok := flagValue(args, flag)
	if !ok {
		return nil
	}
	m := map[string]any{}
	if err := json.Unmarshal([]byte(v), &m); err != nil {
		t.Errorf("--%s %s: %v", flag, v, err)
	}
	return m
}

// Each CoordinatorPipeline points at the objects of its example: its InferencePool, whose picker
// offers a profile for every leg it sends and reads the header the coordinator sends it under;
// the pods behind each profile are of that role and run the pipeline's connectors; its Gateway and
// listener; its render service.
func TestExamplesNamesAgree(t *testing.T) {
	for _, ex := range loadExamples(t) {
		t.Run(ex.dir, func(t *testing.T) {
			if len(ex.pipelines) != 1 {
				t.Fatalf("%d CoordinatorPipelines, want 1", len(ex.pipelines))
			}
			cp := ex.pipelines[0]
			pool := ex.pools[cp.Spec.InferencePoolRef.Name]
			if pool == nil {
				t.Fatalf("inferencePoolRef %q names no InferencePool of the example", cp.Spec.InferencePoolRef.Name)
			}
			e := resolveEPP(t, ex, pool)

			// The profile header: the EPP reads the first of the coordinator's profile headers,
			// the one the operator's HTTPRoute matches (internal/controller/exposure.go).
			headers := cp.Spec.Gateway.ProfileHeaders
			if len(headers) == 0 {
				headers = dpconfig.DefaultProfileHeaders()
			}
			h, ok := headerHandler(e.config)
			if !ok {
				t.Fatal("the EPP has no header-profile-handler: the coordinator names each leg's profile in a header")
			}
			if !strings.EqualFold(h.HeaderName, headers[0]) {
				t.Errorf("the EPP reads %q, the coordinator's route matches %q (spec.gateway.profileHeaders %v)", h.HeaderName, headers[0], headers)
			}

			// The worker pods the pool selects, and its target port on each.
			poolSelector := map[string]string{}
			for k, v := range pool.Spec.Selector.MatchLabels {
				poolSelector[string(k)] = string(v)
			}
			var workers []*appsv1.Deployment
			for _, d := range ex.deploys {
				if selects(poolSelector, d.Spec.Template.Labels) {
					workers = append(workers, d)
					port := int32(pool.Spec.TargetPorts[0].Number)
					if !slices.ContainsFunc(d.Spec.Template.Spec.Containers, func(c corev1.Container) bool {
						return slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.ContainerPort == port })
					}) {
						t.Errorf("Deployment %s: no container port %d (the pool's targetPort)", d.Name, port)
					}
				}
			}
			sort.Slice(workers, func(i, j int) bool { return workers[i].Name < workers[j].Name })

			// Every leg's profile exists, narrows the pool to that role, and keeps some pods.
			profiles := map[string]eppProfile{}
			for _, sp := range e.config.SchedulingProfiles {
				profiles[sp.Name] = sp
			}
			plugins := map[string]eppPlugin{}
			for _, p := range e.config.Plugins {
				plugins[p.name()] = p
			}
			for _, phase := range legProfiles(cp) {
				sp, ok := profiles[phase]
				if !ok {
					t.Errorf("the pipeline sends %s legs, the EPP has no %q profile", phase, phase)
					continue
				}
				roleFiltered := false
				var kept []string
				for _, d := range workers {
					podLabels := d.Spec.Template.Labels
					keep := true
					for _, ref := range sp.Plugins {
						p := plugins[ref.PluginRef]
						if rf, ok := roleFilters[p.Type]; ok {
							roleFiltered = true
							role, has := podLabels[roleLabel]
							keep = keep && ((!has && rf.unlabeled) || slices.Contains(rf.roles, role))
						}
						if p.Type == "label-selector-filter" {
							var lp labelSelectorParams
							_ = json.Unmarshal(p.Parameters, &lp)
							sel, err := metav1.LabelSelectorAsSelector(&metav1.LabelSelector{MatchLabels: lp.MatchLabels, MatchExpressions: lp.MatchExpressions})
							if err != nil {
								t.Errorf("%s: %v", p.name(), err)
								continue
							}
							roleFiltered = roleFiltered || sel.String() != ""
							keep = keep && sel.Matches(labels.Set(podLabels))
						}
					}
					if keep {
						kept = append(kept, d.Name)
						if !servesPhase(podLabels[roleLabel], phase) {
							t.Errorf("profile %s keeps Deployment %s, whose %s is %q", phase, d.Name, roleLabel, podLabels[roleLabel])
						}
					}
				}
				if !roleFiltered {
					t.Errorf("profile %s has no role filter: it would pick pods of any role", phase)
				}
				if len(kept) == 0 {
					t.Errorf("profile %s keeps none of the pool's Deployments", phase)
				}
			}

			// The connectors the pipeline speaks are the ones the workers run.
			for _, d := range workers {
				role := d.Spec.Template.Labels[roleLabel]
				ctr := d.Spec.Template.Spec.Containers[0]
				args := append(slices.Clone(ctr.Command), ctr.Args...)
				kv := transferConfig(t, args, "kv-transfer-config")
				ec := transferConfig(t, args, "ec-transfer-config")
				if servesPhase(role, "prefill") || servesPhase(role, "decode") {
					if cp.Spec.Pipeline.KVConnector == coordinatorv1alpha1.KVConnectorNIXL &&
						(kv["kv_connector"] != "NixlConnector" || kv["kv_role"] != "kv_both") {
						t.Errorf("Deployment %s (%s): --kv-transfer-config %v, kvConnector kv-nixl needs NixlConnector kv_both", d.Name, role, kv)
					}
				}
				needEC := ""
				switch {
				case servesPhase(role, "encode") && slices.Contains(legProfiles(cp), "encode"):
					needEC = "ec_producer"
				case servesPhase(role, "prefill") && slices.Contains(legProfiles(cp), "encode"):
					needEC = "ec_consumer"
				}
				if needEC != "" && cp.Spec.Pipeline.ECConnector == coordinatorv1alpha1.ECConnectorNIXL {
					extra, _ := ec["ec_connector_extra_config"].(map[string]any)
					if ec["ec_connector"] != "ECCPUConnector" || ec["ec_role"] != needEC || extra["ec_enable_nixl"] != true {
						t.Errorf("Deployment %s (%s): --ec-transfer-config %v, ecConnector ec-nixl needs ECCPUConnector %s with ec_enable_nixl", d.Name, role, ec, needEC)
					}
				}
			}

			// The Gateway: its address and the HTTPRoute's parent.
			ref := cp.Spec.Gateway.GatewayRef
			if ref == nil {
				t.Fatal("spec.gateway.gatewayRef is not set: the example's Gateway is its address")
			}
			if ref.Namespace != "" {
				t.Errorf("gatewayRef namespace %q: the example's Gateway is in the pipeline's namespace", ref.Namespace)
			}
			gw := ex.gateways[ref.Name]
			if gw == nil {
				t.Fatalf("gatewayRef %q names no Gateway of the example", ref.Name)
			}
			if ref.SectionName != "" && !slices.ContainsFunc(gw.Spec.Listeners, func(l gatewayv1.Listener) bool {
				return string(l.Name) == ref.SectionName && (l.Protocol == gatewayv1.HTTPProtocolType || l.Protocol == gatewayv1.HTTPSProtocolType)
			}) {
				t.Errorf("gatewayRef sectionName %q is not an HTTP(S) listener of Gateway %s", ref.SectionName, gw.Name)
			}
			if cp.Spec.Route == nil {
				t.Error("spec.route is not set: nothing would send clients to the coordinator")
			} else if p := cp.Spec.Route.ParentRef; p != nil && p.Name != gw.Name {
				t.Errorf("route.parentRef %q is not the pipeline's Gateway %s", p.Name, gw.Name)
			}
			for _, u := range ex.objs {
				if u.GetKind() == "HTTPRoute" {
					t.Errorf("HTTPRoute %s: the operator creates the pipeline's route (spec.route); a second route would compete with it", u.GetName())
				}
			}

			// The render step's address is a Service of the example.
			for _, s := range cp.Spec.Pipeline.Steps {
				if string(s.Type) != "render" {
					continue
				}
				var params struct {
					Address string `json:"address"`
				}
				if s.Params != nil {
					_ = json.Unmarshal(s.Params.Raw, &params)
				}
				host, port, _ := strings.Cut(strings.TrimPrefix(params.Address, "http://"), ":")
				svc := ex.services[strings.Split(host, ".")[0]]
				if svc == nil || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return strconv.Itoa(int(p.Port)) == port }) {
					t.Errorf("render address %q is not host:port of a Service of the example", params.Address)
				}
			}
		})
	}
}

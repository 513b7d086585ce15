package controllers

import (
	"maps"
	"os"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/epd-dev/coordinator/dataplane/config"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/reload"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

func TestRenderConfig(t *testing.T) {
	tests := map[string]struct {
		mutate func(*coordinatorv1alpha1.CoordinatorPipeline)
		want   func(*config.Config)
	}{
		"defaults come from config.Default": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.LogLevel = 0
				cp.Spec.Pipeline.KVConnector, cp.Spec.Pipeline.ECConnector, cp.Spec.Pipeline.UseOpenAIFormat = "", "", nil
			},
			want: func(c *config.Config) { c.Pipeline.KVConnector = config.DefaultKVConnector },
		},
		"log level": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.LogLevel = 4 },
			want:   func(c *config.Config) { c.LogLevel = 4 },
		},
		"server settings": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Server = coordinatorv1alpha1.ServerSpec{
					ReadTimeout: duration("10s"), WriteTimeout: duration("0s"), ShutdownTimeout: duration("1m"),
					MaxRequestBodySizeMiB: ptr.To[int32](128),
				}
			},
			want: func(c *config.Config) {
				c.Server.ReadTimeout = config.Duration(10 * time.Second)
				c.Server.WriteTimeout = 0
				c.Server.ShutdownTimeout = config.Duration(time.Minute)
				c.Server.MaxRequestBodySize = 128
			},
		},
		"gateway client settings": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.Timeout = duration("2m")
				cp.Spec.Gateway.IdleConnTimeout = duration("30s")
				cp.Spec.Gateway.MaxIdleConnsPerHost = ptr.To[int32](7)
			},
			want: func(c *config.Config) {
				c.Gateway.Timeout = config.Duration(2 * time.Minute)
				c.Gateway.IdleConnTimeout = config.Duration(30 * time.Second)
				c.Gateway.MaxIdleConnsPerHost = 7
			},
		},
		"pipeline connectors, format and params": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Pipeline.KVConnector = coordinatorv1alpha1.KVConnectorSGLang
				cp.Spec.Pipeline.ECConnector = coordinatorv1alpha1.ECConnectorNIXL
				cp.Spec.Pipeline.UseOpenAIFormat = ptr.To(false)
				cp.Spec.Pipeline.Steps = []coordinatorv1alpha1.PipelineStep{
					{Type: coordinatorv1alpha1.StepRender, Params: params(map[string]any{"address": "http://render:8000", "n": 3})},
					{Type: coordinatorv1alpha1.StepPrefill, Params: &apiextensionsv1.JSON{Raw: []byte(`{}`)}},
					{Type: coordinatorv1alpha1.StepDecode},
				}
			},
			want: func(c *config.Config) {
				c.Pipeline.KVConnector = "kv-sglang"
				c.Pipeline.ECConnector = "ec-nixl"
				c.Pipeline.UseOpenAIFormat = false
				c.Pipeline.Steps = []config.Step{
					{Type: "render", Params: map[string]any{"address": "http://render:8000", "n": float64(3)}},
					{Type: "prefill"},
					{Type: "decode"},
				}
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline("ns", "cp", tc.mutate)
			want := config.Default()
			want.Server.ListenAddr = ":8080"
			want.Gateway.Address = testGateway
			want.Pipeline.KVConnector = "kv-nixl"
			want.Pipeline.Steps = []config.Step{{Type: "conditional-decode"}, {Type: "prefill"}, {Type: "decode"}}
			tc.want(&want)

			got, err := renderConfig(cp, testGateway)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(want))
		})
	}
}

// The data plane parses the ConfigMap and reports config.Revision of what it loaded; the
// operator reports the revision of what it rendered. They must agree.
func TestRenderedConfigRoundTripsToTheSameRevision(t *testing.T) {
	tests := map[string]func(*coordinatorv1alpha1.CoordinatorPipeline){
		"minimal": func(*coordinatorv1alpha1.CoordinatorPipeline) {},
		"every setting": func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.LogLevel = 5
			cp.Spec.Server = coordinatorv1alpha1.ServerSpec{ReadTimeout: duration("1m30s"), WriteTimeout: duration("0s"),
				ShutdownTimeout: duration("45s"), MaxRequestBodySizeMiB: ptr.To[int32](7)}
			cp.Spec.Gateway.Timeout = duration("1500ms")
			cp.Spec.Gateway.MaxIdleConnsPerHost = ptr.To[int32](0)
		},
		"params of every JSON type": func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Pipeline.Steps[1].Params = params(map[string]any{
				"int": 8, "float": 0.25, "big": 1e21, "neg": -3, "bool": false, "str": "10s", "null": nil,
				"list": []any{1, "a", true, []any{2.5}}, "nested": map[string]any{"a": map[string]any{"b": 1}},
			})
		},
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline("ns", "cp", mutate)
			cfg, err := renderConfig(cp, testGateway)
			g.Expect(err).NotTo(HaveOccurred())
			text, err := marshalConfig(cp, cfg)
			g.Expect(err).NotTo(HaveOccurred())
			back, err := parseConfig(text)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(back.Revision()).To(Equal(cfg.Revision()), "rendered:\n%s", text)
		})
	}
}

func TestValidatePipeline(t *testing.T) {
	tests := map[string]struct {
		mutate  func(*coordinatorv1alpha1.CoordinatorPipeline)
		wantErr string // exact FieldError text; "" for valid
	}{
		"valid": {mutate: func(*coordinatorv1alpha1.CoordinatorPipeline) {}},
		"invalid param type names the step and param": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Pipeline.Steps[1].Params = params(map[string]any{"use_openai_format": "yes"})
			},
			wantErr: "pipeline.steps[1].params.use_openai_format: must be a boolean, got string",
		},
		"unknown kv connector in a step": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Pipeline.Steps[2].Params = params(map[string]any{"kv_connector": "kv-carrier-pigeon"})
			},
			wantErr: "pipeline.steps[2].params.kv_connector: ",
		},
		"tokens-in without render": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Pipeline.Steps[1].Params = params(map[string]any{"use_openai_format": false})
			},
			wantErr: "pipeline.steps[1].params.use_openai_format: false (tokens-in) requires a render step in pipeline.steps",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cfg, err := renderConfig(newPipeline("ns", "cp", tc.mutate), testGateway)
			g.Expect(err).NotTo(HaveOccurred())
			err = validatePipeline(cfg)
			if tc.wantErr == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(err).To(HaveOccurred())
			g.Expect(config.KeyOf(err)).NotTo(BeEmpty(), "a *config.FieldError")
			g.Expect(err.Error()).To(HavePrefix(tc.wantErr))
		})
	}
}

// restartHash must change exactly when the data plane's reload cannot apply a change
// (reload.RestartRequired). Every configuration key is listed, so a key added to the schema needs
// a decision here.
func TestRestartHashFollowsTheDataPlaneReload(t *testing.T) {
	changed := map[string]string{ // key -> a value different from the base configuration's
		"log_level":                       "5",
		"server.listen_addr":              ":8181",
		"server.read_timeout":             "7s",
		"server.write_timeout":            "7s",
		"server.shutdown_timeout":         "7s",
		"server.max_request_body_size":    "7",
		"gateway.address":                 "http://other-gateway:80",
		"gateway.max_idle_conns_per_host": "7",
		"gateway.idle_conn_timeout":       "7s",
		"gateway.timeout":                 "7s",
		"pipeline.kv_connector":           "kv-shared-storage",
		"pipeline.ec_connector":           "ec-nixl",
		"pipeline.use_openai_format":      "false",
		"pipeline.steps":                  "[{type: render, params: {address: 'http://render:8000'}}, {type: decode}]",
		"server.metrics_port":             "9191",
		"server.server_timing":            "true",
		"tracing.enabled":                 "true",
		"tracing.endpoint":                "http://otel-collector:4318",
		"tracing.sample_ratio":            "0.5",
		"tracing.service_name":            "coordinator-b",
	}
	g := NewWithT(t)
	g.Expect(config.EnvKeys()).To(ConsistOf(slices.Collect(maps.Keys(changed))), "every configuration key has a case")

	base, err := renderConfig(newPipeline("ns", "cp"), testGateway)
	g.Expect(err).NotTo(HaveOccurred())
	doc, err := config.Marshal(base)
	g.Expect(err).NotTo(HaveOccurred())
	for key, value := range changed {
		t.Run(key, func(t *testing.T) {
			g := NewWithT(t)
			next, err := config.Parse(doc, func(name string) (string, bool) { return value, name == config.EnvName(key) })
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(next.Revision()).NotTo(Equal(base.Revision()), "the case must change the configuration")
			needsRestart := len(reload.RestartRequired(base, next)) > 0
			g.Expect(restartHash(next) != restartHash(base)).To(Equal(needsRestart))
		})
	}
}

// Every step the data plane registers must be accepted by the CRD's enum, and the enum in the
// generated CRD must be exactly v1alpha1.StepTypes.
func TestStepTypesMatchDataPlaneAndCRD(t *testing.T) {
	g := NewWithT(t)
	for _, name := range pipeline.Registered() {
		g.Expect(v1alpha1StepTypes()).To(ContainElement(name), "step %q is registered by the data plane but not in the CRD enum (api/v1alpha1 StepType)", name)
	}

	data, err := os.ReadFile("../config/crd/bases/coordinator.epd.dev_coordinatorpipelines.yaml")
	g.Expect(err).NotTo(HaveOccurred())
	var crd apiextensionsv1.CustomResourceDefinition
	g.Expect(yaml.Unmarshal(data, &crd)).To(Succeed())
	stepType := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["pipeline"].Properties["steps"].Items.Schema.Properties["type"]
	var enum []string
	for _, v := range stepType.Enum {
		enum = append(enum, string(v.Raw[1:len(v.Raw)-1]))
	}
	g.Expect(enum).To(Equal(v1alpha1StepTypes()))
}

func v1alpha1StepTypes() []string {
	out := make([]string, 0, len(coordinatorv1alpha1.StepTypes))
	for _, s := range coordinatorv1alpha1.StepTypes {
		out = append(out, string(s))
	}
	return slices.Clip(out)
}

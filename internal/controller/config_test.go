package controller

import (
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/epd-dev/coordinator/dataplane/base/config"

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
		"drain delay": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Server.DrainDelay = duration("0s") },
			want:   func(c *config.Config) { c.Server.DrainDelay = ptr.To(config.Duration(0)) },
		},
		"tenant header": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Server.MetricsTenantHeader = "x-team" },
			want:   func(c *config.Config) { c.Server.MetricsTenantHeader = "x-team" },
		},
		"rate limit with its defaults": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.RateLimit = &coordinatorv1alpha1.RateLimitSpec{RedisURL: "redis://redis:6379/0", TenantHeader: "x-team"}
			},
			want: func(c *config.Config) {
				c.RateLimit = &config.RateLimit{RedisURL: "redis://redis:6379/0", TenantHeader: "x-team", RedisTimeout: config.Duration(config.DefaultRateLimitTimeout),
					KeyPrefix: config.DefaultRateLimitKeyPrefix, OnRedisFailure: config.RedisFailureLocal}
			},
		},
		"rate limit": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				half := resource.MustParse("500m")
				cp.Spec.RateLimit = &coordinatorv1alpha1.RateLimitSpec{RedisURL: "rediss://redis:6380/1", PasswordEnv: "REDIS_PASSWORD", TenantHeader: "x-team",
					RedisTimeout: duration("20ms"), KeyPrefix: "rl:", OnRedisFailure: "closed",
					Default: &coordinatorv1alpha1.TenantLimits{RequestsPerSecond: &half},
					Tenants: []coordinatorv1alpha1.TenantSpec{
						{Name: "a", TenantLimits: coordinatorv1alpha1.TenantLimits{RequestsPerSecond: ptr.To(resource.MustParse("20")), TokensPerMinute: ptr.To[int64](90000)}, Objective: "premium"},
						{Name: "b", Objective: "batch"},
					}}
			},
			want: func(c *config.Config) {
				c.RateLimit = &config.RateLimit{RedisURL: "rediss://redis:6380/1", PasswordEnv: "REDIS_PASSWORD", TenantHeader: "x-team", RedisTimeout: config.Duration(20 * time.Millisecond),
					KeyPrefix: "rl:", OnRedisFailure: config.RedisFailureClosed, Default: &config.TenantLimits{RequestsPerSecond: 0.5},
					Tenants: []config.Tenant{{Name: "a", RequestsPerSecond: 20, TokensPerMinute: 90000, Objective: "premium"}, {Name: "b", Objective: "batch"}}}
			},
		},
		"a canary": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Canary = &coordinatorv1alpha1.CanarySpec{WeightPercent: 10, Pipeline: coordinatorv1alpha1.PipelineSpec{
					OnPoolFailure: "fail", Steps: []coordinatorv1alpha1.PipelineStep{{Type: "prefill"}, {Type: "decode", Params: params(map[string]any{"max_resumes": 0})}}}}
			},
			want: func(c *config.Config) {
				c.Canary = config.NewCanary()
				c.Canary.WeightPercent = 10
				c.Canary.Pipeline.OnPoolFailure = "fail"
				c.Canary.Pipeline.Steps = []config.Step{{Type: "prefill"}, {Type: "decode", Params: map[string]any{"max_resumes": float64(0)}}}
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
		"gateway read bounds": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.IdleTimeout = duration("0s")
				cp.Spec.Gateway.RequestTimeout = duration("30m")
				cp.Spec.Gateway.MaxResponseSizeMiB = ptr.To[int32](64)
			},
			want: func(c *config.Config) {
				c.Gateway.IdleTimeout = 0
				c.Gateway.RequestTimeout = config.Duration(30 * time.Minute)
				c.Gateway.MaxResponseSize = 64
			},
		},
		"gateway retry settings": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{
					MaxAttempts: ptr.To[int32](5), MaxRetriesPerRequest: ptr.To[int32](9), InitialBackoff: duration("50ms"), MaxBackoff: duration("2s"),
					MaxRetryAfter: duration("0s"), BudgetPercent: ptr.To[int32](35), BudgetMinPerSecond: ptr.To[int32](0),
				}
			},
			want: func(c *config.Config) {
				c.Gateway.Retry = config.Retry{
					MaxAttempts: 5, MaxRetriesPerRequest: 9, InitialBackoff: config.Duration(50 * time.Millisecond), MaxBackoff: config.Duration(2 * time.Second),
					MaxRetryAfter: 0, BudgetRatio: 0.35, BudgetMinPerSecond: 0,
				}
			},
		},
		"profile and forwarded headers": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.ProfileHeaders = []string{"x-llm-d-epp-profile"}
				cp.Spec.Pipeline.ForwardResponseHeaders = []string{"x-llm-d-disagg-revision", "x-pool-epoch"}
			},
			want: func(c *config.Config) {
				c.Gateway.ProfileHeaders = []string{"x-llm-d-epp-profile"}
				c.Pipeline.ForwardResponseHeaders = []string{"x-llm-d-disagg-revision", "x-pool-epoch"}
			},
		},
		"an empty forwardResponseHeaders disables it": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Pipeline.ForwardResponseHeaders = []string{}
			},
			want: func(c *config.Config) { c.Pipeline.ForwardResponseHeaders = []string{} },
		},
		"an empty retry keeps the data plane's defaults": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{}
			},
			want: func(*config.Config) {},
		},
		"retries off, budget at its bounds": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{
					MaxAttempts: ptr.To[int32](1), BudgetPercent: ptr.To[int32](100), BudgetMinPerSecond: ptr.To[int32](1000000),
				}
			},
			want: func(c *config.Config) {
				c.Gateway.Retry.MaxAttempts = 1
				c.Gateway.Retry.BudgetRatio = 1
				c.Gateway.Retry.BudgetMinPerSecond = 1e6
			},
		},
		"pool failure policy": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Pipeline.OnPoolFailure = coordinatorv1alpha1.PoolFailureFail
			},
			want: func(c *config.Config) { c.Pipeline.OnPoolFailure = config.OnPoolFailureFail },
		},
		"TLS: both listeners serve the mounted Secret": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Server.TLS = &coordinatorv1alpha1.ServerTLSSpec{SecretName: "coordinator-tls"}
			},
			want: func(c *config.Config) {
				c.Server.SecureServing = true
				c.Server.CertPath = "/etc/coordinator-tls"
				c.Server.MetricsCertDir = "/etc/coordinator-tls"
			},
		},
		"TLS version and cipher suites": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Server.TLS = &coordinatorv1alpha1.ServerTLSSpec{SecretName: "coordinator-tls", MinVersion: coordinatorv1alpha1.TLSVersion12,
					CipherSuites: []coordinatorv1alpha1.TLSCipherSuite{"TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"}}
			},
			want: func(c *config.Config) {
				c.Server.SecureServing, c.Server.CertPath, c.Server.MetricsCertDir = true, TLSDir, TLSDir
				c.Server.TLSMinVersion = "VersionTLS12"
				c.Server.TLSCipherSuites = []string{"TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"}
			},
		},
		"gateway CA bundle": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.CABundle = &coordinatorv1alpha1.CABundleReference{ConfigMapName: "kube-root-ca.crt"}
			},
			want: func(c *config.Config) { c.Gateway.CAFile = "/etc/coordinator-gateway-ca/ca.crt" },
		},
		"tracing: enabled by its presence, with every setting": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{
					Endpoint: "http://otel-collector.monitoring:4318", ServiceName: "epd-coordinator",
					SamplingRatePerMillion: ptr.To[int32](2500),
					ResourceAttributes:     []coordinatorv1alpha1.TracingResourceAttribute{{Name: "k8s.cluster.name", Value: "prod"}},
				}
			},
			want: func(c *config.Config) {
				c.Tracing = config.Tracing{Enabled: true, Endpoint: "http://otel-collector.monitoring:4318", ServiceName: "epd-coordinator", SampleRatio: 0.0025}
			},
		},
		"tracing: an empty section keeps the data plane's endpoint, name and ratio": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{}
			},
			want: func(c *config.Config) { c.Tracing.Enabled = true },
		},
		"tracing: disabled keeps its settings, sampling at its bounds": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{Enabled: ptr.To(false), SamplingRatePerMillion: ptr.To[int32](1000000)}
			},
			want: func(c *config.Config) { c.Tracing.Enabled, c.Tracing.SampleRatio = false, 1 },
		},
		"tracing: sampling off": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{SamplingRatePerMillion: ptr.To[int32](0)}
			},
			want: func(c *config.Config) { c.Tracing.Enabled, c.Tracing.SampleRatio = true, 0 },
		},
		"pod settings do not reach the configuration": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Env = []corev1.EnvVar{{Name: "HF_TOKEN", Value: "x"}}
				cp.Spec.PodLabels = map[string]string{"team": "a"}
				cp.Spec.Volumes = []corev1.Volume{{Name: "tok"}}
			},
			want: func(*config.Config) {},
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
			cp.Spec.Gateway.IdleTimeout = duration("0s")
			cp.Spec.Gateway.RequestTimeout = duration("2m30s")
			cp.Spec.Gateway.MaxResponseSizeMiB = ptr.To[int32](32)
			cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{
				MaxAttempts: ptr.To[int32](4), InitialBackoff: duration("10ms"), MaxBackoff: duration("750ms"),
				MaxRetryAfter: duration("5s"), BudgetPercent: ptr.To[int32](33), BudgetMinPerSecond: ptr.To[int32](12),
			}
			cp.Spec.Pipeline.OnPoolFailure = coordinatorv1alpha1.PoolFailureFail
		},
		"TLS and a gateway CA": func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Server.TLS = &coordinatorv1alpha1.ServerTLSSpec{SecretName: "tls", MinVersion: coordinatorv1alpha1.TLSVersion13}
			cp.Spec.Gateway.Address = "https://inference-gateway.infra.svc:443"
			cp.Spec.Gateway.CABundle = &coordinatorv1alpha1.CABundleReference{ConfigMapName: "ca", Key: "bundle.pem"}
		},
		"tracing": func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{Endpoint: "https://otel:4318", ServiceName: "c", SamplingRatePerMillion: ptr.To[int32](333333)}
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
		// The CRD's CEL rule compares the two backoffs only when both are set; the data plane's
		// validation catches a maxBackoff below the default initialBackoff.
		"maxBackoff below the default initialBackoff": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{MaxBackoff: duration("10ms")}
			},
			wantErr: "gateway.retry.max_backoff: must not be below gateway.retry.initial_backoff (25ms), got 10ms",
		},
		"initialBackoff above the default maxBackoff": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{InitialBackoff: duration("5s")}
			},
			wantErr: "gateway.retry.max_backoff: must not be below gateway.retry.initial_backoff (5s), got 1s",
		},
		"equal backoffs": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{InitialBackoff: duration("100ms"), MaxBackoff: duration("100ms")}
			},
		},
		// The enum keeps other values out of the API; the data plane would name the key.
		"unknown pool failure policy": {
			mutate:  func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Pipeline.OnPoolFailure = "retry" },
			wantErr: `pipeline.on_pool_failure: must be "aggregate" or "fail", got "retry"`,
		},
		"a step overrides the pool failure policy": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Pipeline.OnPoolFailure = coordinatorv1alpha1.PoolFailureFail
				cp.Spec.Pipeline.Steps[1].Params = params(map[string]any{"on_pool_failure": "aggregate"})
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cfg, err := renderConfig(newPipeline("ns", "cp", tc.mutate), testGateway)
			g.Expect(err).NotTo(HaveOccurred())
			err = validatePipeline(cfg, nil)
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

// restartHash changes exactly when one of config.RestartSettings changes, and keeps the values
// of earlier releases for the same settings: a new value would roll every coordinator when the
// operator is upgraded. (The pinned values changed with the TLS and admin-listener settings
// added to config.RestartSettings, in the release whose pod template changes anyway: /tmp got a
// sizeLimit and the pod an fsGroup.)
func TestRestartHash(t *testing.T) {
	base, err := renderConfig(newPipeline("ns", "cp"), testGateway)
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		mutate   func(*config.Config)
		wantRoll bool
		want     string // the pinned hash, when set
	}{
		"the rendered defaults": {mutate: func(*config.Config) {}, want: "5e2d31cb44e112b7"},
		"several restart settings": {mutate: func(c *config.Config) {
			c.Server.ReadTimeout = config.Duration(5 * time.Second)
			c.Server.MetricsPort = 0
			c.Tracing.Enabled, c.Tracing.Endpoint = true, "http://otel:4318"
		}, wantRoll: true, want: "7df6cf202544f9d0"},
		"listen address": {mutate: func(c *config.Config) { c.Server.ListenAddr = ":8181" }, wantRoll: true},
		"read timeout":   {mutate: func(c *config.Config) { c.Server.ReadTimeout = 0 }, wantRoll: true},
		"write timeout":  {mutate: func(c *config.Config) { c.Server.WriteTimeout = config.Duration(time.Hour) }, wantRoll: true},
		"metrics port":   {mutate: func(c *config.Config) { c.Server.MetricsPort = 9191 }, wantRoll: true},
		"tracing":        {mutate: func(c *config.Config) { c.Tracing.SampleRatio = 1 }, wantRoll: true},
		"TLS":            {mutate: func(c *config.Config) { c.Server.SecureServing, c.Server.CertPath = true, TLSDir }, wantRoll: true},
		"TLS version":    {mutate: func(c *config.Config) { c.Server.TLSMinVersion = "VersionTLS13" }, wantRoll: true},
		"cipher suites": {mutate: func(c *config.Config) {
			c.Server.TLSCipherSuites = []string{"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"}
		}, wantRoll: true},
		"metrics TLS":       {mutate: func(c *config.Config) { c.Server.MetricsCertDir = TLSDir }, wantRoll: true},
		"gateway CA":        {mutate: func(c *config.Config) { c.Gateway.CAFile = GatewayCAFile }},
		"log level":         {mutate: func(c *config.Config) { c.LogLevel = 5 }},
		"shutdown timeout":  {mutate: func(c *config.Config) { c.Server.ShutdownTimeout = config.Duration(time.Minute) }},
		"body limit":        {mutate: func(c *config.Config) { c.Server.MaxRequestBodySize = 7 }},
		"server timing":     {mutate: func(c *config.Config) { c.Server.ServerTiming = true }},
		"gateway":           {mutate: func(c *config.Config) { c.Gateway.Address = "http://other-gateway:80" }},
		"pipeline":          {mutate: func(c *config.Config) { c.Pipeline.Steps = c.Pipeline.Steps[1:] }},
		"default connector": {mutate: func(c *config.Config) { c.Pipeline.ECConnector = "ec-nixl" }},
		"gateway read bounds": {mutate: func(c *config.Config) {
			c.Gateway.IdleTimeout, c.Gateway.RequestTimeout, c.Gateway.MaxResponseSize = 0, config.Duration(time.Hour), 64
		}},
		"gateway retries": {mutate: func(c *config.Config) {
			c.Gateway.Retry = config.Retry{MaxAttempts: 1, MaxBackoff: config.Duration(time.Minute), BudgetRatio: 1}
		}},
		"pool failure policy": {mutate: func(c *config.Config) { c.Pipeline.OnPoolFailure = config.OnPoolFailureFail }},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cfg := base
			cfg.Pipeline.Steps = slices.Clone(base.Pipeline.Steps)
			tc.mutate(&cfg)
			got := restartHash(cfg)
			rolled := got != restartHash(base)
			g.Expect(rolled).To(Equal(tc.wantRoll), "pod template rolled")
			if tc.want != "" {
				g.Expect(got).To(Equal(tc.want))
			}
		})
	}
}

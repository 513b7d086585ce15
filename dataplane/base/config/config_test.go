package config

import (
	"crypto/tls"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
)

const minimal = `
gateway:
  address: http://gw:80
pipeline:
  steps:
    - type: decode
`

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestDefaults(t *testing.T) {
	cfg, err := Parse([]byte(minimal), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.Gateway.Address = "http://gw:80"
	want.Pipeline.Steps = []Step{{Type: "decode"}}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("got %+v\nwant %+v", cfg, want)
	}
	if cfg.Server.MaxRequestBodyBytes() != 64<<20 {
		t.Fatalf("body limit = %d", cfg.Server.MaxRequestBodyBytes())
	}
	// The cost limits of schema 4 are 0 (not rendered) and mean their defaults.
	if got := [...]int64{int64(cfg.Server.ContentBlocks()), cfg.Gateway.MaxEventBytes(), cfg.Gateway.Retry.MaxResumeBytes(),
		cfg.Gateway.Retry.MaxResumeMemoryBytes()}; got != [...]int64{10000, 1 << 20, 1 << 20, 64 << 20} {
		t.Fatalf("cost limits %v", got)
	}
}

func TestFileValues(t *testing.T) {
	cfg, err := Parse([]byte(`
log_level: 4
server:
  listen_addr: 127.0.0.1:9000
  read_timeout: 5s
  write_timeout: 1m
  shutdown_timeout: 1s
  max_request_body_size: 2
gateway:
  address: https://gw.example:8443/base/
  max_idle_conns_per_host: 7
  idle_conn_timeout: 10s
  timeout: 2m30s
pipeline:
  kv_connector: kv-nixl
  ec_connector: ec-nixl
  use_openai_format: false
  steps:
    - type: render
      params: {address: "http://render:8000", max_total_tokens: 8192.0}
    - type: prefill
    - type: decode
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LogLevel != 4 || cfg.Server.ListenAddr != "127.0.0.1:9000" || cfg.Server.ReadTimeout.Std() != 5*time.Second ||
		cfg.Server.WriteTimeout.Std() != time.Minute || cfg.Server.MaxRequestBodyBytes() != 2<<20 ||
		cfg.Gateway.MaxIdleConnsPerHost != 7 || cfg.Gateway.Timeout.Std() != 150*time.Second ||
		cfg.Pipeline.KVConnector != "kv-nixl" || cfg.Pipeline.UseOpenAIFormat || len(cfg.Pipeline.Steps) != 3 {
		t.Fatalf("unexpected config %+v", cfg)
	}
	if got := cfg.Pipeline.Steps[0].Params["max_total_tokens"]; got != 8192.0 {
		t.Fatalf("params kept generic: %#v", got)
	}
}

func TestEnvOverrides(t *testing.T) {
	tests := map[string]struct {
		env   map[string]string
		check func(Config) bool
	}{
		"key absent from the file": {
			env:   map[string]string{"COORDINATOR_PIPELINE_KV_CONNECTOR": "kv-sglang"},
			check: func(c Config) bool { return c.Pipeline.KVConnector == "kv-sglang" },
		},
		"key present in the file": {
			env:   map[string]string{"COORDINATOR_GATEWAY_ADDRESS": "http://other:81"},
			check: func(c Config) bool { return c.Gateway.Address == "http://other:81" },
		},
		"bool": {
			env:   map[string]string{"COORDINATOR_PIPELINE_USE_OPENAI_FORMAT": "false", "COORDINATOR_PIPELINE_STEPS": "[{type: render, params: {address: 'http://r:1'}}, {type: decode}]"},
			check: func(c Config) bool { return !c.Pipeline.UseOpenAIFormat && len(c.Pipeline.Steps) == 2 },
		},
		"int and duration": {
			env: map[string]string{"COORDINATOR_SERVER_MAX_REQUEST_BODY_SIZE": "3", "COORDINATOR_SERVER_SHUTDOWN_TIMEOUT": "90s", "COORDINATOR_LOG_LEVEL": "5"},
			check: func(c Config) bool {
				return c.Server.MaxRequestBodySize == 3 && c.Server.ShutdownTimeout.Std() == 90*time.Second && c.LogLevel == 5
			},
		},
		"list of CIDRs": {
			env: map[string]string{"COORDINATOR_GATEWAY_ALLOWED_HINT_NETWORKS": `[127.0.0.0/8, "::1/128"]`},
			check: func(c Config) bool {
				p, err := c.Gateway.HintNetworks()
				return err == nil && reflect.DeepEqual(p, []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")})
			},
		},
		"string that looks like a number stays a string": {
			env:   map[string]string{"COORDINATOR_SERVER_LISTEN_ADDR": ":9090"},
			check: func(c Config) bool { return c.Server.ListenAddr == ":9090" },
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg, err := Parse([]byte(minimal), env(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(cfg) {
				t.Fatalf("override not applied: %+v", cfg)
			}
		})
	}
}

func TestEveryKeyHasAnEnvName(t *testing.T) {
	keys := EnvKeys()
	want := []string{"log_level", "server.listen_addr", "server.read_timeout", "server.write_timeout", "server.shutdown_timeout", "server.drain_delay",
		"server.max_request_body_size", "server.metrics_port", "server.metrics_host", "server.server_timing", "server.trusted_routing_headers",
		"server.secure_serving", "server.cert_path", "server.tls_min_version", "server.tls_cipher_suites", "server.metrics_cert_dir", "server.metrics_tenant_header",
		"server.max_content_blocks", "gateway.address", "gateway.max_idle_conns_per_host", "gateway.idle_conn_timeout", "gateway.timeout",
		"gateway.idle_timeout", "gateway.request_timeout", "gateway.max_response_size", "gateway.max_event_size", "gateway.retry.max_attempts", "gateway.retry.max_retries_per_request", "gateway.retry.initial_backoff",
		"gateway.retry.max_backoff", "gateway.retry.max_retry_after", "gateway.retry.budget_ratio", "gateway.retry.budget_min_per_second",
		"gateway.retry.max_resume_size", "gateway.retry.max_resume_memory", "gateway.profile_headers", "gateway.ca_file", "gateway.allowed_hint_networks", "pipeline.kv_connector", "pipeline.ec_connector", "pipeline.use_openai_format", "pipeline.forward_response_headers", "pipeline.on_pool_failure", "pipeline.steps",
		"tracing.enabled", "tracing.endpoint", "tracing.sample_ratio", "tracing.service_name", "canary", "rate_limit"}
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("EnvKeys = %q", keys)
	}
	if EnvName("server.max_request_body_size") != "COORDINATOR_SERVER_MAX_REQUEST_BODY_SIZE" {
		t.Fatal(EnvName("server.max_request_body_size"))
	}
}

func TestInvalid(t *testing.T) {
	tests := map[string]struct {
		yaml string
		env  map[string]string
		key  string
		msg  string
	}{
		"duration without unit":      {yaml: "server: {read_timeout: \"30\"}\n" + minimal, key: "server.read_timeout", msg: "with a unit"},
		"bare number duration":       {yaml: "gateway: {timeout: 30, address: http://gw}\npipeline: {steps: [{type: decode}]}", key: "gateway.timeout", msg: "duration string"},
		"negative body":              {yaml: "server: {max_request_body_size: -1}\n" + minimal, key: "server.max_request_body_size", msg: "negative"},
		"overflowing body":           {yaml: "server: {max_request_body_size: 9007199254740991}\n" + minimal, key: "server.max_request_body_size", msg: "overflows"},
		"negative timeout":           {yaml: "server: {write_timeout: -1s}\n" + minimal, key: "server.write_timeout", msg: "negative"},
		"negative idle timeout":      {yaml: "gateway: {address: http://gw, idle_timeout: -1s}\npipeline: {steps: [{type: decode}]}", key: "gateway.idle_timeout", msg: "negative"},
		"huge response size":         {yaml: "gateway: {address: http://gw, max_response_size: 99999999999999}\npipeline: {steps: [{type: decode}]}", key: "gateway.max_response_size", msg: "between 0"},
		"zero attempts":              {yaml: "gateway: {address: http://gw, retry: {max_attempts: 0}}\npipeline: {steps: [{type: decode}]}", key: "gateway.retry.max_attempts", msg: "between 1"},
		"too many attempts":          {yaml: "gateway: {address: http://gw, retry: {max_attempts: 11}}\npipeline: {steps: [{type: decode}]}", key: "gateway.retry.max_attempts", msg: "and 10"},
		"too many request retries":   {yaml: "gateway: {address: http://gw, retry: {max_retries_per_request: 101}}\npipeline: {steps: [{type: decode}]}", key: "gateway.retry.max_retries_per_request", msg: "and 100"},
		"backoff inverted":           {yaml: "gateway: {address: http://gw, retry: {initial_backoff: 2s, max_backoff: 1s}}\npipeline: {steps: [{type: decode}]}", key: "gateway.retry.max_backoff", msg: "initial_backoff"},
		"budget ratio over 1":        {yaml: "gateway: {address: http://gw, retry: {budget_ratio: 1.5}}\npipeline: {steps: [{type: decode}]}", key: "gateway.retry.budget_ratio", msg: "between 0 and 1"},
		"budget ratio NaN":           {yaml: "gateway: {address: http://gw, retry: {budget_ratio: .nan}}\npipeline: {steps: [{type: decode}]}", key: "gateway.retry.budget_ratio", msg: "between 0 and 1"},
		"negative budget rate":       {yaml: "gateway: {address: http://gw, retry: {budget_min_per_second: -1}}\npipeline: {steps: [{type: decode}]}", key: "gateway.retry.budget_min_per_second", msg: "between 0"},
		"no profile header":          {yaml: "gateway: {address: http://gw, profile_headers: []}\npipeline: {steps: [{type: decode}]}", key: "gateway.profile_headers", msg: "at least one"},
		"profile header twice":       {yaml: "gateway: {address: http://gw, profile_headers: [EPP-Profile, epp-profile]}\npipeline: {steps: [{type: decode}]}", key: "gateway.profile_headers[1]", msg: "listed twice"},
		"profile header invalid":     {yaml: "gateway: {address: http://gw, profile_headers: [\"a b\"]}\npipeline: {steps: [{type: decode}]}", key: "gateway.profile_headers[0]", msg: "not a valid header name"},
		"profile header owned":       {yaml: "gateway: {address: http://gw, profile_headers: [Prefer]}\npipeline: {steps: [{type: decode}]}", key: "gateway.profile_headers[0]", msg: "coordinator owns"},
		"hint network not a CIDR":    {yaml: "gateway: {address: http://gw, allowed_hint_networks: [loopback]}\npipeline: {steps: [{type: decode}]}", key: "gateway.allowed_hint_networks[0]", msg: `"loopback" is not a CIDR`},
		"hint network an address":    {yaml: "gateway: {address: http://gw, allowed_hint_networks: [127.0.0.1]}\npipeline: {steps: [{type: decode}]}", key: "gateway.allowed_hint_networks[0]", msg: `"127.0.0.1" is an address, not a network: write 127.0.0.1/32`},
		"hint network empty":         {yaml: "gateway: {address: http://gw, allowed_hint_networks: ['']}\npipeline: {steps: [{type: decode}]}", key: "gateway.allowed_hint_networks[0]", msg: "must not be empty"},
		"hint network host bits":     {yaml: "gateway: {address: http://gw, allowed_hint_networks: [127.0.0.1/8]}\npipeline: {steps: [{type: decode}]}", key: "gateway.allowed_hint_networks[0]", msg: "bits set past its /8: write 127.0.0.0/8"},
		"hint network mapped":        {yaml: "gateway: {address: http://gw, allowed_hint_networks: ['::ffff:127.0.0.0/104']}\npipeline: {steps: [{type: decode}]}", key: "gateway.allowed_hint_networks[0]", msg: "IPv4-mapped"},
		"hint network zone":          {yaml: "gateway: {address: http://gw, allowed_hint_networks: ['fe80::/10%eth0']}\npipeline: {steps: [{type: decode}]}", key: "gateway.allowed_hint_networks[0]", msg: "not a CIDR"},
		"hint network bits too many": {yaml: "gateway: {address: http://gw, allowed_hint_networks: [127.0.0.0/33]}\npipeline: {steps: [{type: decode}]}", key: "gateway.allowed_hint_networks[0]", msg: "not a CIDR"},
		"hint networks not a list":   {yaml: "gateway: {address: http://gw, allowed_hint_networks: 127.0.0.0/8}\npipeline: {steps: [{type: decode}]}", key: "gateway.allowed_hint_networks", msg: "list"},
		"every bad hint network": {yaml: "gateway: {address: http://gw, allowed_hint_networks: [10.0.0.0/8, x, '::1/128', 169.254.0.1/16]}\npipeline: {steps: [{type: decode}]}",
			key: "gateway.allowed_hint_networks[1]", msg: `; gateway.allowed_hint_networks[3]: "169.254.0.1/16" has address bits set past its /16: write 169.254.0.0/16`},
		"too many hint networks": {yaml: "gateway: {address: http://gw, allowed_hint_networks: [" + strings.Repeat("10.0.0.0/8, ", 32) + "10.0.0.0/8]}\npipeline: {steps: [{type: decode}]}",
			key: "gateway.allowed_hint_networks", msg: "at most 32 networks, got 33"},
		"bad hint network env": {yaml: minimal, env: map[string]string{"COORDINATOR_GATEWAY_ALLOWED_HINT_NETWORKS": "[127.0.0.0/8, 127.0.0.1]"},
			key: "gateway.allowed_hint_networks[1]", msg: "is an address"},
		"forward header empty":   {yaml: "pipeline: {forward_response_headers: [''], steps: [{type: decode}]}", key: "pipeline.forward_response_headers[0]", msg: "must not be empty"},
		"forward header twice":   {yaml: "pipeline: {forward_response_headers: [x-a, X-A], steps: [{type: decode}]}", key: "pipeline.forward_response_headers[1]", msg: "listed twice"},
		"unknown pool policy":    {yaml: "pipeline: {on_pool_failure: retry, steps: [{type: decode}]}", key: "pipeline.on_pool_failure", msg: `"aggregate" or "fail"`},
		"negative idle conns":    {yaml: "gateway: {address: http://gw, max_idle_conns_per_host: -2}\npipeline: {steps: [{type: decode}]}", key: "gateway.max_idle_conns_per_host", msg: "negative"},
		"unknown key":            {yaml: "server: {listen_adr: ':1'}\n" + minimal, key: "server.listen_adr", msg: "unknown key"},
		"wrong type":             {yaml: "log_level: high\n" + minimal, key: "log_level", msg: "integer"},
		"log level out of range": {yaml: "log_level: 9\n" + minimal, key: "log_level", msg: "between 0 and 5"},
		"bad listen addr":        {yaml: "server: {listen_addr: 8080}\n" + minimal, key: "server.listen_addr", msg: "string"},
		"bad gateway url":        {yaml: "gateway: {address: 'gw:80'}\npipeline: {steps: [{type: decode}]}", key: "gateway.address", msg: "http://"},
		"no steps":               {yaml: "gateway: {address: http://gw}", key: "pipeline.steps", msg: "at least one step"},
		"step without type":      {yaml: "gateway: {address: http://gw}\npipeline: {steps: [{params: {}}]}", key: "pipeline.steps[0].type", msg: "required"},
		"steps not a list":       {yaml: "pipeline: {steps: decode}", key: "pipeline.steps", msg: "list"},
		"bad env":                {yaml: minimal, env: map[string]string{"COORDINATOR_SERVER_READ_TIMEOUT": "10"}, key: "server.read_timeout", msg: "with a unit"},
		"bad env type":           {yaml: minimal, env: map[string]string{"COORDINATOR_PIPELINE_USE_OPENAI_FORMAT": "maybe"}, key: "pipeline.use_openai_format", msg: "boolean"},
		"sample ratio range":     {yaml: "tracing: {sample_ratio: 1.5}\n" + minimal, key: "tracing.sample_ratio", msg: "between 0 and 1"},
		"sample ratio type":      {yaml: "tracing: {sample_ratio: all}\n" + minimal, key: "tracing.sample_ratio", msg: "number"},
		"metrics port range":     {yaml: "server: {metrics_port: 70000}\n" + minimal, key: "server.metrics_port", msg: "port"},
		"metrics host with port": {yaml: "server: {metrics_host: '127.0.0.1:9090'}\n" + minimal, key: "server.metrics_host", msg: "without a port"},
		"metrics host bracketed": {yaml: "server: {metrics_host: '[::1]'}\n" + minimal, key: "server.metrics_host", msg: "without a port"},
		"unknown TLS version":    {yaml: "server: {tls_min_version: TLS1.2}\n" + minimal, key: "server.tls_min_version", msg: "VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13"},
		"unknown cipher suite": {yaml: "server: {tls_cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_RSA_WITH_ROT13]}\n" + minimal,
			key: "server.tls_cipher_suites[1]", msg: `"TLS_RSA_WITH_ROT13" is not supported`},
		"tenant header invalid":       {yaml: "server: {metrics_tenant_header: 'x tenant'}\n" + minimal, key: "server.metrics_tenant_header", msg: "not a valid header name"},
		"tenant header owned":         {yaml: "server: {metrics_tenant_header: Authorization}\n" + minimal, key: "server.metrics_tenant_header", msg: "coordinator owns"},
		"canary weight over 100":      {yaml: minimal + "canary: {weight_percent: 101, pipeline: {steps: [{type: decode}]}}", key: "canary.weight_percent", msg: "between 0"},
		"canary weight negative":      {yaml: minimal + "canary: {weight_percent: -5, pipeline: {steps: [{type: decode}]}}", key: "canary.weight_percent", msg: "between 0"},
		"canary weight fractional":    {yaml: minimal + "canary: {weight_percent: 2.5, pipeline: {steps: [{type: decode}]}}", key: "canary.weight_percent", msg: "integer"},
		"canary without steps":        {yaml: minimal + "canary: {weight_percent: 5}", key: "canary.pipeline.steps", msg: "at least one step"},
		"canary step without type":    {yaml: minimal + "canary: {weight_percent: 5, pipeline: {steps: [{}]}}", key: "canary.pipeline.steps[0].type", msg: "required"},
		"canary unknown key":          {yaml: minimal + "canary: {weight: 5, pipeline: {steps: [{type: decode}]}}", key: "canary.weight", msg: "unknown key"},
		"canary pipeline key typo":    {yaml: minimal + "canary: {pipeline: {stepz: []}}", key: "canary.pipeline.stepz", msg: "unknown key"},
		"canary not a mapping":        {yaml: minimal + "canary: [decode]", key: "canary", msg: "mapping"},
		"canary bad pool policy":      {yaml: minimal + "canary: {pipeline: {on_pool_failure: x, steps: [{type: decode}]}}", key: "canary.pipeline.on_pool_failure", msg: `"aggregate" or "fail"`},
		"canary same as the pipeline": {yaml: minimal + "canary: {weight_percent: 5, pipeline: {steps: [{type: decode}]}}", key: "canary.pipeline", msg: "is the same as pipeline"},
		"canary env not a mapping":    {yaml: minimal, env: map[string]string{"COORDINATOR_CANARY": "5"}, key: "canary", msg: "mapping"},
		"negative content blocks":     {yaml: "server: {max_content_blocks: -1}\n" + minimal, key: "server.max_content_blocks", msg: "between 0"},
		"negative drain delay":        {yaml: "server: {drain_delay: -1s}\n" + minimal, key: "server.drain_delay", msg: "must not be negative"},
		"drain delay without unit":    {yaml: "server: {drain_delay: 5}\n" + minimal, key: "server.drain_delay", msg: "with a unit"},
		"too many content blocks":     {yaml: "server: {max_content_blocks: 1000001}\n" + minimal, key: "server.max_content_blocks", msg: "and 1000000"},
		"negative event size":         {yaml: "gateway: {address: http://gw, max_event_size: -1}\npipeline: {steps: [{type: decode}]}", key: "gateway.max_event_size", msg: "between 0"},
		"huge event size":             {yaml: "gateway: {address: http://gw, max_event_size: 1048577}\npipeline: {steps: [{type: decode}]}", key: "gateway.max_event_size", msg: "KiB"},
		"negative resume size":        {yaml: "gateway: {address: http://gw, retry: {max_resume_size: -1}}\npipeline: {steps: [{type: decode}]}", key: "gateway.retry.max_resume_size", msg: "between 0"},
		"negative resume memory":      {yaml: "gateway: {address: http://gw, retry: {max_resume_memory: -1}}\npipeline: {steps: [{type: decode}]}", key: "gateway.retry.max_resume_memory", msg: "between 0"},
		"resume size over memory": {yaml: "gateway: {address: http://gw, retry: {max_resume_size: 4096, max_resume_memory: 2}}\npipeline: {steps: [{type: decode}]}",
			key: "gateway.retry.max_resume_size", msg: "more than gateway.retry.max_resume_memory"},
		"insecure cipher suite": {yaml: minimal, env: map[string]string{"COORDINATOR_SERVER_TLS_CIPHER_SUITES": "[TLS_RSA_WITH_RC4_128_SHA]"},
			key: "server.tls_cipher_suites[0]", msg: "insecure"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), env(tc.env))
			if err == nil {
				t.Fatal("accepted")
			}
			if KeyOf(err) != tc.key || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %q: want key %s and %q", err, tc.key, tc.msg)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error spans lines: %q", err)
			}
		})
	}
}

func TestCanary(t *testing.T) {
	cfg, err := Parse([]byte(minimal+`
canary:
  weight_percent: 5
  pipeline:
    on_pool_failure: fail
    steps:
      - type: prefill
      - type: decode
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := NewCanary()
	want.WeightPercent = 5
	want.Pipeline.OnPoolFailure = OnPoolFailureFail
	want.Pipeline.Steps = []Step{{Type: "prefill"}, {Type: "decode"}}
	if !reflect.DeepEqual(cfg.Canary, want) {
		t.Fatalf("canary %+v, want %+v (the pipeline block's defaults)", cfg.Canary, want)
	}
	cc := cfg.CanaryConfig()
	if cc.Canary != nil || !reflect.DeepEqual(cc.Pipeline, want.Pipeline) || cc.Gateway.Address != cfg.Gateway.Address {
		t.Fatalf("canary config %+v: want the canary's pipeline with the shared gateway and no canary", cc)
	}
	if cfg.Pipeline.Revision() == cfg.Canary.Pipeline.Revision() {
		t.Fatal("different pipelines share a revision")
	}
	plain, _ := Parse([]byte(minimal), nil)
	if plain.Canary != nil || plain.Revision() == cfg.Revision() {
		t.Fatal("a canary must change the configuration revision")
	}
	weighted := cfg
	weighted.Canary = &Canary{WeightPercent: 50, Pipeline: cfg.Canary.Pipeline}
	if weighted.Revision() == cfg.Revision() || weighted.Canary.Pipeline.Revision() != cfg.Canary.Pipeline.Revision() {
		t.Fatal("a weight change changes the configuration, not the pipeline revision")
	}

	// Promotion: the canary's block as the pipeline keeps its revision.
	promoted, err := Parse([]byte("gateway: {address: http://gw:80}\npipeline: {on_pool_failure: fail, steps: [{type: prefill}, {type: decode}]}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if promoted.Pipeline.Revision() != cfg.Canary.Pipeline.Revision() {
		t.Fatal("a promoted canary must keep its pipeline revision")
	}

	// null removes the block; the environment sets one.
	if off, err := Parse([]byte(minimal+"canary: null\n"), nil); err != nil || off.Canary != nil {
		t.Fatalf("canary: null gave %+v, %v", off.Canary, err)
	}
	env, err := Parse([]byte(minimal), env(map[string]string{"COORDINATOR_CANARY": "{weight_percent: 100, pipeline: {steps: [{type: prefill}, {type: decode}]}}"}))
	if err != nil || env.Canary == nil || env.Canary.WeightPercent != 100 || env.Canary.Pipeline.OnPoolFailure != DefaultOnPoolFailure {
		t.Fatalf("COORDINATOR_CANARY gave %+v, %v", env.Canary, err)
	}
}

func TestMarshalRoundTripKeepsCanary(t *testing.T) {
	cfg := Default()
	cfg.Pipeline.Steps = []Step{{Type: "decode"}}
	cfg.Canary = NewCanary()
	cfg.Canary.WeightPercent = 0 // staged: kept as a canary of weight 0, not dropped
	cfg.Canary.Pipeline.Steps = []Step{{Type: "prefill"}, {Type: "decode"}}
	out, err := Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(out, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if back.Revision() != cfg.Revision() || !reflect.DeepEqual(back.Canary, cfg.Canary) {
		t.Fatalf("canary changed across a round trip:\n%s", out)
	}
}

func TestInvalidYAML(t *testing.T) {
	if _, err := Parse([]byte("server: [\n"), nil); err == nil || !strings.Contains(err.Error(), "invalid YAML") {
		t.Fatalf("err = %v", err)
	}
}

func TestMarshalRoundTripKeepsRevision(t *testing.T) {
	cfg := Default()
	cfg.Gateway.Address = "http://gw:80"
	cfg.Pipeline.Steps = []Step{
		{Type: "encode", Params: map[string]any{"max_parallel": float64(4)}}, // JSON numbers, as from a CR
		{Type: "decode"},
	}
	out, err := Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(out, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if back.Revision() != cfg.Revision() {
		t.Fatalf("revision changed across a round trip:\n%s", out)
	}
	other := cfg
	other.Pipeline.KVConnector = "kv-nixl"
	if other.Revision() == cfg.Revision() {
		t.Fatal("revision ignores the pipeline")
	}
}

func TestFileRevisionIgnoresEnvironment(t *testing.T) {
	cfg, err := Parse([]byte(minimal), env(map[string]string{"COORDINATOR_SERVER_LISTEN_ADDR": "127.0.0.1:1"}))
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := Parse([]byte(minimal), nil)
	if FileRevision([]byte(minimal)) != plain.Revision() || cfg.Revision() == plain.Revision() {
		t.Fatal("the file revision must be the revision of the file alone")
	}
	if FileRevision([]byte("pipeline: [")) == FileRevision([]byte("pipeline: {")) {
		t.Fatal("undecodable contents must still differ")
	}
}

func TestTLSSettings(t *testing.T) {
	tests := map[string]struct {
		yaml    string
		version uint16
		suites  []uint16
	}{
		"defaults": {yaml: minimal, version: tls.VersionTLS12},
		"TLS 1.3 and named suites, legacy ChaCha20 name included": {
			yaml:    "server: {tls_min_version: VersionTLS13, tls_cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305]}\n" + minimal,
			version: tls.VersionTLS13,
			suites:  []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256},
		},
		"TLS 1.0": {yaml: "server: {tls_min_version: VersionTLS10}\n" + minimal, version: tls.VersionTLS10},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg, err := Parse([]byte(tc.yaml), nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.Server.TLSMinVersionID(); got != tc.version {
				t.Errorf("min version %x, want %x", got, tc.version)
			}
			if got := cfg.Server.TLSCipherSuiteIDs(); !reflect.DeepEqual(got, tc.suites) {
				t.Errorf("suites %v, want %v", got, tc.suites)
			}
		})
	}
}

func TestMetricsAddr(t *testing.T) {
	tests := map[string]struct {
		listen, host, want string
	}{
		"follows a loopback listen_addr": {listen: "127.0.0.1:8080", want: "127.0.0.1:9090"},
		"follows an IPv6 listen_addr":    {listen: "[::1]:8080", want: "[::1]:9090"},
		"every interface, like the API":  {listen: ":8080", want: ":9090"},
		"explicit host wins":             {listen: "127.0.0.1:8080", host: "0.0.0.0", want: "0.0.0.0:9090"},
		"explicit IPv6 host":             {listen: ":8080", host: "::1", want: "[::1]:9090"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := Server{ListenAddr: tc.listen, MetricsHost: tc.host, MetricsPort: 9090}
			if err := s.validateTLS(); err != nil {
				t.Fatal(err)
			}
			if got := s.MetricsAddr(); got != tc.want {
				t.Fatalf("MetricsAddr = %q, want %q", got, tc.want)
			}
		})
	}
}

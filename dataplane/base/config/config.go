// Package config is the one schema of the coordinator: the YAML document read by the data plane
// (standalone or from the ConfigMap the operator renders), its defaults, COORDINATOR_* environment
// overrides and structural validation. Step parameters are validated by the steps themselves when
// the pipeline is built (package pipeline).
package config

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// Where a coordinator reads its configuration when --config is not given: the operator mounts
// the rendered ConfigMap there (key FileName in directory Dir), and the image carries the
// annotated example at the same path.
const (
	FileName    = "coordinator.yaml"
	Dir         = "/etc/coordinator"
	DefaultPath = Dir + "/" + FileName
)

// Defaults of the schema; docs/configuration.md lists them with their environment names.
const (
	DefaultLogLevel        = 2
	DefaultListenAddr      = ":8080"
	DefaultReadTimeout     = 30 * time.Second
	DefaultWriteTimeout    = 120 * time.Second
	DefaultShutdownTimeout = 25 * time.Second
	// DefaultDrainDelay is server.drain_delay: long enough for kube-proxy and load balancers to
	// stop sending new connections to a terminating pod (about a second on a single node).
	DefaultDrainDelay          = 5 * time.Second
	DefaultMaxRequestBodyMiB   = 64
	DefaultMaxIdleConnsPerHost = 100
	DefaultIdleConnTimeout     = 90 * time.Second
	DefaultGatewayTimeout      = 60 * time.Second
	DefaultIdleTimeout         = 60 * time.Second
	DefaultRequestTimeout      = 10 * time.Minute
	DefaultMaxResponseMiB      = 16
	// DefaultMaxEventKiB is gateway.max_event_size: a streamed chat chunk with the logprobs of a
	// long token is a few KiB.
	DefaultMaxEventKiB = 1024
	// DefaultMaxResumeKiB is gateway.retry.max_resume_size: the text of a 256K-token answer.
	DefaultMaxResumeKiB = 1024
	// DefaultMaxResumeMemoryMiB is gateway.retry.max_resume_memory.
	DefaultMaxResumeMemoryMiB = 64
	// DefaultMaxContentBlocks is server.max_content_blocks.
	DefaultMaxContentBlocks   = 10000
	DefaultMaxAttempts        = 3
	DefaultMaxRetriesPerReq   = 4
	DefaultInitialBackoff     = 25 * time.Millisecond
	DefaultMaxBackoff         = time.Second
	DefaultMaxRetryAfter      = 2 * time.Second
	DefaultRetryBudgetRatio   = 0.2
	DefaultRetryBudgetMinRate = 5.0
	DefaultOnPoolFailure      = OnPoolFailureAggregate
	// DisaggRevisionHeader is llm-d's cross-phase revision header, the default of
	// pipeline.forward_response_headers.
	DisaggRevisionHeader = "x-llm-d-disagg-revision"
	DefaultMetricsPort   = 9090
	DefaultTLSMinVersion = "VersionTLS12"
	DefaultSampleRatio   = 0.1
	DefaultServiceName   = "coordinator"
	// DefaultKVConnector and DefaultECConnector are the shared-storage protocols (kv.SharedStorage,
	// ec.SharedStorage: the connectors' tests hold them equal).
	DefaultKVConnector = "kv-shared-storage"
	DefaultECConnector = "ec-shared-storage"
	// EnvPrefix prefixes every environment override: server.listen_addr is COORDINATOR_SERVER_LISTEN_ADDR.
	EnvPrefix = "COORDINATOR_"
	// MiB is the unit of server.max_request_body_size.
	MiB = 1 << 20
)

// Config is the whole coordinator configuration.
type Config struct {
	// LogLevel is the log verbosity: 1 warn, 2 info, 3 verbose, 4 debug, 5 trace.
	LogLevel int `yaml:"log_level" json:"log_level"`
	// Server configures the inbound HTTP listener.
	Server Server `yaml:"server" json:"server"`
	// Gateway configures the client of the Inference Gateway that every worker leg goes through.
	Gateway Gateway `yaml:"gateway" json:"gateway"`
	// Pipeline is the ordered list of steps and the connector defaults.
	Pipeline Pipeline `yaml:"pipeline" json:"pipeline"`
	// Tracing configures OpenTelemetry tracing (off by default).
	Tracing Tracing `yaml:"tracing" json:"tracing"`
	// Canary is a second pipeline that serves a share of the requests (none when nil).
	Canary *Canary `yaml:"canary,omitempty" json:"canary,omitempty"`
	// RateLimit limits each tenant's requests and tokens across the replicas (off when nil).
	RateLimit *RateLimit `yaml:"rate_limit,omitempty" json:"rate_limit,omitempty"`
}

// Pipeline tracks: the pipeline a request runs on.
const (
	// TrackStable is the pipeline block.
	TrackStable = "stable"
	// TrackCanary is the canary block's pipeline.
	TrackCanary = "canary"
)

// Canary is a revision canary: a second pipeline, with the same server and gateway, that serves
// WeightPercent of the requests. Each request runs wholly on one of the two pipelines. Promoting
// the canary is moving its pipeline block to pipeline and removing the canary; its revision
// (Pipeline.Revision) stays the same.
type Canary struct {
	// WeightPercent is the share of requests the canary serves, 0 (none: staged) to 100 (all).
	WeightPercent int `yaml:"weight_percent" json:"weight_percent"`
	// Pipeline is the canary's pipeline block, with the defaults of the pipeline block.
	Pipeline Pipeline `yaml:"pipeline" json:"pipeline"`
}

// NewCanary is a canary with the schema defaults: weight 0 and the pipeline block's defaults.
func NewCanary() *Canary { return &Canary{Pipeline: Default().Pipeline} }

// CanaryConfig is the configuration the canary's pipeline runs with: c with the canary's
// pipeline block as its pipeline, and no canary. It is c itself when c has no canary.
func (c Config) CanaryConfig() Config {
	if c.Canary == nil {
		return c
	}
	out := c
	out.Pipeline, out.Canary = c.Canary.Pipeline, nil
	return out
}

// Tracing configures OpenTelemetry tracing. Trace context (traceparent) is propagated to every
// leg whether or not tracing is enabled.
type Tracing struct {
	// Enabled turns on span export.
	Enabled bool `yaml:"enabled" json:"enabled"`
	// Endpoint is the OTLP/HTTP collector URL, e.g. http://otel-collector:4318. Empty: the
	// OTEL_EXPORTER_OTLP_* environment (default localhost:4318).
	Endpoint string `yaml:"endpoint" json:"endpoint"`
	// SampleRatio is the fraction of new traces sampled (parent-based: a sampled client trace is
	// always followed).
	SampleRatio float64 `yaml:"sample_ratio" json:"sample_ratio"`
	// ServiceName is the service.name resource attribute.
	ServiceName string `yaml:"service_name" json:"service_name"`
}

// Server configures the inbound HTTP listener.
type Server struct {
	// ListenAddr is the host:port the API listens on.
	ListenAddr string `yaml:"listen_addr" json:"listen_addr"`
	// ReadTimeout bounds reading a whole request, body included. 0 disables it.
	ReadTimeout Duration `yaml:"read_timeout" json:"read_timeout"`
	// WriteTimeout bounds writing a non-streaming response. Streaming responses are exempt.
	WriteTimeout Duration `yaml:"write_timeout" json:"write_timeout"`
	// ShutdownTimeout bounds the drain of in-flight requests on SIGTERM, after DrainDelay.
	ShutdownTimeout Duration `yaml:"shutdown_timeout" json:"shutdown_timeout"`
	// DrainDelay is how long the coordinator keeps accepting and serving new connections after
	// SIGTERM, readiness failing and every answer closing its connection, before it stops
	// accepting and drains (ShutdownTimeout): the time endpoints take to stop sending it new
	// connections. Nil means DefaultDrainDelay (and is not rendered: schema 5); 0 disables it.
	DrainDelay *Duration `yaml:"drain_delay,omitempty" json:"drain_delay,omitempty"`
	// MaxRequestBodySize is the largest accepted request body, in MiB. 0 means the default.
	MaxRequestBodySize int `yaml:"max_request_body_size" json:"max_request_body_size"`
	// MetricsPort is the admin listener's port (/metrics, /debug/pipeline). 0 disables it.
	MetricsPort int `yaml:"metrics_port" json:"metrics_port"`
	// MetricsHost is the interface the admin listener binds. Empty: the host of ListenAddr (all
	// interfaces when that is empty too).
	MetricsHost string `yaml:"metrics_host" json:"metrics_host"`
	// ServerTiming adds a Server-Timing response header with each step's duration.
	ServerTiming bool `yaml:"server_timing" json:"server_timing"`
	// TrustedRoutingHeaders forwards the clients' RoutingHeaders to the gateway instead of
	// dropping them: only for clients allowed to pick endpoints and scheduling objectives.
	TrustedRoutingHeaders bool `yaml:"trusted_routing_headers" json:"trusted_routing_headers"`
	// SecureServing serves the API over TLS.
	SecureServing bool `yaml:"secure_serving" json:"secure_serving"`
	// CertPath is the directory of the API's tls.crt and tls.key, reloaded when they change.
	// Empty with SecureServing: a self-signed certificate generated at startup.
	CertPath string `yaml:"cert_path" json:"cert_path"`
	// TLSMinVersion is the lowest TLS version both listeners accept, one of TLSVersionNames.
	TLSMinVersion string `yaml:"tls_min_version" json:"tls_min_version"`
	// TLSCipherSuites are the TLS 1.0-1.2 cipher suites both listeners accept (crypto/tls
	// names); empty: Go's defaults.
	TLSCipherSuites []string `yaml:"tls_cipher_suites,omitempty" json:"tls_cipher_suites,omitempty"`
	// MetricsCertDir is the directory of the admin listener's tls.crt and tls.key, reloaded when
	// they change. Empty: the admin listener serves plain HTTP.
	MetricsCertDir string `yaml:"metrics_cert_dir" json:"metrics_cert_dir"`
	// MetricsTenantHeader names the request header whose value labels the coordinator_tenant_*
	// series (empty: none). Its values come from clients: use a header the edge sets after
	// authentication. At most observe.MaxTenants values become labels.
	MetricsTenantHeader string `yaml:"metrics_tenant_header,omitempty" json:"metrics_tenant_header,omitempty"`
	// MaxContentBlocks bounds the content blocks of one Messages API request (system, message
	// and tool_result blocks together). 0 means the default.
	MaxContentBlocks int `yaml:"max_content_blocks,omitempty" json:"max_content_blocks,omitempty"`
}

// Gateway configures the HTTP client of the Inference Gateway.
type Gateway struct {
	// Address is the gateway's base URL, e.g. http://inference-gateway:80.
	Address string `yaml:"address" json:"address"`
	// MaxIdleConnsPerHost is the keep-alive pool size towards the gateway.
	MaxIdleConnsPerHost int `yaml:"max_idle_conns_per_host" json:"max_idle_conns_per_host"`
	// IdleConnTimeout closes pooled connections idle for this long.
	IdleConnTimeout Duration `yaml:"idle_conn_timeout" json:"idle_conn_timeout"`
	// Timeout bounds the wait for a worker's response headers (each attempt).
	Timeout Duration `yaml:"timeout" json:"timeout"`
	// IdleTimeout bounds the silence between two reads of a worker's answer once its headers
	// arrived, streams included. 0 disables it.
	IdleTimeout Duration `yaml:"idle_timeout" json:"idle_timeout"`
	// RequestTimeout bounds a whole leg the coordinator reads itself or relays unstreamed
	// (encode, prefill, a non-streaming decode), headers to last byte. 0 disables it.
	RequestTimeout Duration `yaml:"request_timeout" json:"request_timeout"`
	// MaxResponseSize is the largest answer the coordinator reads itself (encode and prefill
	// legs), in MiB. 0 means the default.
	MaxResponseSize int `yaml:"max_response_size" json:"max_response_size"`
	// MaxEventSize bounds one event of a worker's stream, in KiB: a longer one breaks the stream
	// (a worker fault). 0 means the default.
	MaxEventSize int `yaml:"max_event_size,omitempty" json:"max_event_size,omitempty"`
	// Retry says when a failed leg is tried again.
	Retry Retry `yaml:"retry" json:"retry"`
	// ProfileHeaders are the request headers that carry a leg's EPP profile (all of them are
	// sent): x-llm-d-epp-profile for llm-d 0.3 and later (GAIE v1.x), EPP-Profile for earlier ones.
	ProfileHeaders []string `yaml:"profile_headers" json:"profile_headers"`
	// CAFile is a PEM bundle of the CAs an https gateway's certificate must chain to, re-read
	// when it changes. Empty: the system roots.
	CAFile string `yaml:"ca_file" json:"ca_file"`
	// AllowedHintNetworks are CIDRs whose loopback and link-local addresses the endpoints named
	// by the endpoint picker (a conditional decode's 412 hints, a prefill-decode reservation) may
	// be: those are refused otherwise, as no pod has one (HintNetworks; gateway.EndpointOf). For
	// test stacks whose workers listen on 127.0.0.1, and unusual clusters; empty by default, and
	// omitted when empty so that a configuration without it reads on schema 3 coordinators.
	AllowedHintNetworks []string `yaml:"allowed_hint_networks,omitempty" json:"allowed_hint_networks,omitempty"`
}

// Retry configures the retries of legs that failed without being served: a connection refused
// or reset before the answer's headers, no headers within the timeout, or 502, 503, 504 or 429
// from the gateway. Each attempt is a new pick by the endpoint picker.
type Retry struct {
	// MaxAttempts is the most attempts one leg makes, the first included; 1 disables retries.
	MaxAttempts int `yaml:"max_attempts" json:"max_attempts"`
	// MaxRetriesPerRequest caps the retries (and stream resumes) of all the legs of one request
	// (32 encode legs of one request do not get 64 retries); 0 disables retries.
	MaxRetriesPerRequest int `yaml:"max_retries_per_request" json:"max_retries_per_request"`
	// InitialBackoff and MaxBackoff bound the capped exponential backoff (full jitter) before
	// each retry.
	InitialBackoff Duration `yaml:"initial_backoff" json:"initial_backoff"`
	MaxBackoff     Duration `yaml:"max_backoff" json:"max_backoff"`
	// MaxRetryAfter is the longest Retry-After (of a 429 or 503) waited for; a longer one is
	// the client's answer.
	MaxRetryAfter Duration `yaml:"max_retry_after" json:"max_retry_after"`
	// BudgetRatio caps the retries of the whole process at this fraction of first attempts,
	// so that a dead pool cannot cause a retry storm.
	BudgetRatio float64 `yaml:"budget_ratio" json:"budget_ratio"`
	// BudgetMinPerSecond is the retry rate allowed whatever the ratio (a quiet process can
	// still retry).
	BudgetMinPerSecond float64 `yaml:"budget_min_per_second" json:"budget_min_per_second"`
	// MaxResumeSize bounds the output one stream keeps to be resumed from, in KiB: a longer
	// answer still streams but is not resumed. 0 means the default.
	MaxResumeSize int `yaml:"max_resume_size,omitempty" json:"max_resume_size,omitempty"`
	// MaxResumeMemory bounds what all the streams of the process keep to be resumed from, in
	// MiB; a stream that finds it used up is not resumed. 0 means the default.
	MaxResumeMemory int `yaml:"max_resume_memory,omitempty" json:"max_resume_memory,omitempty"`
}

// Degradation policies of pipeline.on_pool_failure.
const (
	// OnPoolFailureAggregate serves a request whose encode or prefill pool cannot serve it on a
	// decode worker alone (aggregated: the decode worker encodes and prefills itself).
	OnPoolFailureAggregate = "aggregate"
	// OnPoolFailureFail answers such a request 503.
	OnPoolFailureFail = "fail"
)

// Pipeline is the ordered step list and the defaults injected into every step's params.
type Pipeline struct {
	// KVConnector is the default KV transfer protocol, one of kv.Names() (e.g. kv-nixl).
	KVConnector string `yaml:"kv_connector" json:"kv_connector"`
	// ECConnector is the default encoder-cache transfer protocol, one of ec.Names() (e.g. ec-nixl).
	ECConnector string `yaml:"ec_connector" json:"ec_connector"`
	// UseOpenAIFormat selects the OpenAI wire format (true) or tokens-in /inference/v1/generate
	// (false, needs a render step) for the encode and prefill legs.
	UseOpenAIFormat bool `yaml:"use_openai_format" json:"use_openai_format"`
	// ForwardResponseHeaders are the headers a phase's answer carries that are sent on every
	// later leg of the same request (the disaggregated revision, so that the prefill and decode
	// of one request stay on one revision during a rollout). Clients' values of them are dropped
	// until a phase returns one. Case-insensitive; empty: none.
	ForwardResponseHeaders []string `yaml:"forward_response_headers" json:"forward_response_headers"`
	// OnPoolFailure is what happens when the encode or prefill pool cannot serve a request
	// after its retries: OnPoolFailureAggregate or OnPoolFailureFail.
	OnPoolFailure string `yaml:"on_pool_failure" json:"on_pool_failure"`
	// Steps run in this order.
	Steps []Step `yaml:"steps" json:"steps"`
}

// Names of the pipeline-level settings every step inherits as a param of the same name.
const (
	ParamKVConnector     = "kv_connector"
	ParamECConnector     = "ec_connector"
	ParamUseOpenAIFormat = "use_openai_format"
	ParamOnPoolFailure   = "on_pool_failure"
)

// StepDefaults are the pipeline-level settings each step inherits as params of the same names,
// unless the step sets them itself.
func (p Pipeline) StepDefaults() map[string]any {
	return map[string]any{
		ParamKVConnector:     p.KVConnector,
		ParamECConnector:     p.ECConnector,
		ParamUseOpenAIFormat: p.UseOpenAIFormat,
		ParamOnPoolFailure:   p.OnPoolFailure,
	}
}

// Step is one pipeline entry.
type Step struct {
	// Type is the registered step name, e.g. prefill.
	Type string `yaml:"type" json:"type"`
	// Params are the step's own parameters; each step documents and validates them.
	Params map[string]any `yaml:"params,omitempty" json:"params,omitempty"`
}

// Default returns the configuration with every default filled in and no steps.
func Default() Config {
	return Config{
		LogLevel: DefaultLogLevel,
		Server: Server{
			ListenAddr:         DefaultListenAddr,
			ReadTimeout:        Duration(DefaultReadTimeout),
			WriteTimeout:       Duration(DefaultWriteTimeout),
			ShutdownTimeout:    Duration(DefaultShutdownTimeout),
			MaxRequestBodySize: DefaultMaxRequestBodyMiB,
			MetricsPort:        DefaultMetricsPort,
			TLSMinVersion:      DefaultTLSMinVersion,
		},
		Gateway: Gateway{
			MaxIdleConnsPerHost: DefaultMaxIdleConnsPerHost,
			IdleConnTimeout:     Duration(DefaultIdleConnTimeout),
			Timeout:             Duration(DefaultGatewayTimeout),
			IdleTimeout:         Duration(DefaultIdleTimeout),
			ProfileHeaders:      DefaultProfileHeaders(),
			RequestTimeout:      Duration(DefaultRequestTimeout),
			MaxResponseSize:     DefaultMaxResponseMiB,
			Retry: Retry{
				MaxAttempts:          DefaultMaxAttempts,
				MaxRetriesPerRequest: DefaultMaxRetriesPerReq,
				InitialBackoff:       Duration(DefaultInitialBackoff),
				MaxBackoff:           Duration(DefaultMaxBackoff),
				MaxRetryAfter:        Duration(DefaultMaxRetryAfter),
				BudgetRatio:          DefaultRetryBudgetRatio,
				BudgetMinPerSecond:   DefaultRetryBudgetMinRate,
			},
		},
		Pipeline: Pipeline{
			KVConnector:            DefaultKVConnector,
			ECConnector:            DefaultECConnector,
			UseOpenAIFormat:        true,
			OnPoolFailure:          DefaultOnPoolFailure,
			ForwardResponseHeaders: []string{DisaggRevisionHeader},
		},
		Tracing: Tracing{SampleRatio: DefaultSampleRatio, ServiceName: DefaultServiceName},
	}
}

// MaxRequestBodyBytes is the body limit in bytes.
func (s Server) MaxRequestBodyBytes() int64 {
	if s.MaxRequestBodySize == 0 {
		return DefaultMaxRequestBodyMiB * MiB
	}
	return int64(s.MaxRequestBodySize) * MiB
}

// DefaultProfileHeaders are the profile header names sent by default: the current llm-d
// spelling and the earlier one, so that either release's endpoint picker routes the legs.
func DefaultProfileHeaders() []string { return []string{"x-llm-d-epp-profile", "epp-profile"} }

// MaxResponseBytes is the answer limit of legs read whole, in bytes.
func (g Gateway) MaxResponseBytes() int64 {
	if g.MaxResponseSize == 0 {
		return DefaultMaxResponseMiB * MiB
	}
	return int64(g.MaxResponseSize) * MiB
}

// Drain is the drain delay: DrainDelay, or DefaultDrainDelay when unset.
func (s Server) Drain() time.Duration {
	if s.DrainDelay == nil {
		return DefaultDrainDelay
	}
	return s.DrainDelay.Std()
}

// ContentBlocks is the most content blocks one Messages request may hold.
func (s Server) ContentBlocks() int { return orDefault(s.MaxContentBlocks, DefaultMaxContentBlocks) }

// MaxEventBytes is the limit of one event of a worker's stream, in bytes.
func (g Gateway) MaxEventBytes() int64 {
	return int64(orDefault(g.MaxEventSize, DefaultMaxEventKiB)) << 10
}

// MaxResumeBytes is what one stream may keep to be resumed from, in bytes.
func (r Retry) MaxResumeBytes() int64 {
	return int64(orDefault(r.MaxResumeSize, DefaultMaxResumeKiB)) << 10
}

// MaxResumeMemoryBytes is what all the streams of the process may keep to be resumed from.
func (r Retry) MaxResumeMemoryBytes() int64 {
	return int64(orDefault(r.MaxResumeMemory, DefaultMaxResumeMemoryMiB)) * MiB
}

func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// Revision is a short, stable fingerprint of the effective configuration. The operator stamps it
// in the CoordinatorPipeline status and the coordinator reports it, so the two can be compared.
func (c Config) Revision() string { return fingerprint(c) }

// Revision is the fingerprint of the pipeline block alone: the same steps and pipeline-level
// settings have the same revision whether they are the stable pipeline or the canary, so a
// promoted canary keeps its revision (and its series).
func (p Pipeline) Revision() string { return fingerprint(p) }

// fingerprint is 16 hex digits of the SHA-256 of v's JSON.
func fingerprint(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		// YAML params JSON cannot hold (.nan, .inf, non-string keys): fingerprint the Go value.
		b = fmt.Appendf(nil, "%#v", v)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// maxEventKiB (1 GiB) bounds the KiB keys: an event or a resume state larger than that is no
// answer's.
const maxEventKiB = 1 << 20

// maxContentBlocks bounds server.max_content_blocks.
const maxContentBlocks = 1_000_000

// maxBodyMiB keeps MaxRequestBodySize*MiB (+1 for the overflow probe) inside an int64.
const maxBodyMiB = (math.MaxInt64 - 1) / MiB

package controller

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	_ "github.com/epd-dev/coordinator/dataplane/steps" // registers the built-in steps pipeline.Build validates

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

const (
	// ListenPort is the coordinator's HTTP port: container port, probes and Service port.
	ListenPort = 8080
	// ConfigKey is the ConfigMap key holding the rendered data-plane configuration.
	ConfigKey = config.FileName
	// ConfigDir is where the ConfigMap is mounted in the coordinator container.
	ConfigDir = config.Dir
	// ConfigPath is the file the coordinator reads (--config), its default.
	ConfigPath = config.DefaultPath

	// validationGatewayAddress stands in for a gateway address that is not resolved yet, so the
	// pipeline can still be validated. A configuration built with it is never applied.
	validationGatewayAddress = "http://gateway.invalid"
)

// renderConfig builds the data-plane configuration of cp: config.Default() overlaid with the
// spec's log level, server (TLS included), gateway (retries included), tracing and pipeline settings, listening on
// ListenPort.
// gatewayAddress is the resolved gateway base URL. The only error is a step whose params are not
// a JSON object (the CRD schema prevents it), reported as a *config.FieldError.
func renderConfig(cp *coordinatorv1alpha1.CoordinatorPipeline, gatewayAddress string) (config.Config, error) {
	spec := &cp.Spec
	cfg := config.Default()
	if spec.LogLevel != 0 {
		cfg.LogLevel = int(spec.LogLevel)
	}

	cfg.Server.ListenAddr = fmt.Sprintf(":%d", ListenPort)
	setDuration(&cfg.Server.ReadTimeout, spec.Server.ReadTimeout)
	setDuration(&cfg.Server.WriteTimeout, spec.Server.WriteTimeout)
	setDuration(&cfg.Server.ShutdownTimeout, spec.Server.ShutdownTimeout)
	if d := spec.Server.DrainDelay; d != nil {
		// Rendered only when set (server.drain_delay needs schema 5): unset, the coordinator
		// drains for its default.
		cfg.Server.DrainDelay = ptr.To(config.Duration(d.Duration))
	}
	if v := spec.Server.MaxRequestBodySizeMiB; v != nil {
		cfg.Server.MaxRequestBodySize = int(*v)
	}
	cfg.Server.MetricsTenantHeader = spec.Server.MetricsTenantHeader

	cfg.Gateway.Address = gatewayAddress
	setDuration(&cfg.Gateway.Timeout, spec.Gateway.Timeout)
	setDuration(&cfg.Gateway.IdleConnTimeout, spec.Gateway.IdleConnTimeout)
	if v := spec.Gateway.MaxIdleConnsPerHost; v != nil {
		cfg.Gateway.MaxIdleConnsPerHost = int(*v)
	}
	setDuration(&cfg.Gateway.IdleTimeout, spec.Gateway.IdleTimeout)
	setDuration(&cfg.Gateway.RequestTimeout, spec.Gateway.RequestTimeout)
	if v := spec.Gateway.MaxResponseSizeMiB; v != nil {
		cfg.Gateway.MaxResponseSize = int(*v)
	}
	if r := spec.Gateway.Retry; r != nil {
		renderRetry(r, &cfg.Gateway.Retry)
	}
	if len(spec.Gateway.ProfileHeaders) > 0 {
		cfg.Gateway.ProfileHeaders = slices.Clone(spec.Gateway.ProfileHeaders)
	}
	renderTLS(cp, &cfg)
	if t := spec.Tracing; t != nil {
		renderTracing(t, &cfg.Tracing)
	}
	if r := spec.RateLimit; r != nil {
		cfg.RateLimit = renderRateLimit(r)
	}

	var err error
	if cfg.Pipeline, err = renderPipeline(&spec.Pipeline, "pipeline", cfg.Pipeline); err != nil {
		return config.Config{}, err
	}
	if c := spec.Canary; c != nil {
		cfg.Canary = config.NewCanary()
		cfg.Canary.WeightPercent = int(c.WeightPercent)
		if cfg.Canary.Pipeline, err = renderPipeline(&c.Pipeline, "canary.pipeline", cfg.Canary.Pipeline); err != nil {
			return config.Config{}, err
		}
	}
	return cfg, nil
}

// renderRateLimit is the rate_limit block of r, over its defaults.
func renderRateLimit(r *coordinatorv1alpha1.RateLimitSpec) *config.RateLimit {
	out := &config.RateLimit{RedisURL: r.RedisURL, PasswordEnv: r.PasswordEnv, TenantHeader: r.TenantHeader,
		RedisTimeout: config.Duration(config.DefaultRateLimitTimeout), KeyPrefix: config.DefaultRateLimitKeyPrefix, OnRedisFailure: config.RedisFailureLocal}
	setDuration(&out.RedisTimeout, r.RedisTimeout)
	if r.KeyPrefix != "" {
		out.KeyPrefix = r.KeyPrefix
	}
	if r.OnRedisFailure != "" {
		out.OnRedisFailure = r.OnRedisFailure
	}
	if d := r.Default; d != nil {
		l := renderTenantLimits(*d)
		out.Default = &l
	}
	for _, t := range r.Tenants {
		l := renderTenantLimits(t.TenantLimits)
		out.Tenants = append(out.Tenants, config.Tenant{Name: t.Name, RequestsPerSecond: l.RequestsPerSecond, TokensPerMinute: l.TokensPerMinute, Objective: t.Objective})
	}
	return out
}

func renderTenantLimits(l coordinatorv1alpha1.TenantLimits) config.TenantLimits {
	var out config.TenantLimits
	if q := l.RequestsPerSecond; q != nil {
		out.RequestsPerSecond = q.AsApproximateFloat64()
	}
	if n := l.TokensPerMinute; n != nil {
		out.TokensPerMinute = *n
	}
	return out
}

// renderPipeline overlays p on out, the data plane's pipeline block found at key.
func renderPipeline(p *coordinatorv1alpha1.PipelineSpec, key string, out config.Pipeline) (config.Pipeline, error) {
	if p.KVConnector != "" {
		out.KVConnector = string(p.KVConnector)
	}
	if p.ECConnector != "" {
		out.ECConnector = string(p.ECConnector)
	}
	if p.UseOpenAIFormat != nil {
		out.UseOpenAIFormat = *p.UseOpenAIFormat
	}
	if p.ForwardResponseHeaders != nil {
		out.ForwardResponseHeaders = slices.Clone(p.ForwardResponseHeaders)
	}
	if p.OnPoolFailure != "" {
		out.OnPoolFailure = string(p.OnPoolFailure)
	}
	out.Steps = make([]config.Step, 0, len(p.Steps))
	for i, s := range p.Steps {
		step := config.Step{Type: string(s.Type)}
		if s.Params != nil && len(s.Params.Raw) > 0 {
			var params map[string]any
			if err := json.Unmarshal(s.Params.Raw, &params); err != nil {
				return out, &config.FieldError{Key: fmt.Sprintf("%s.steps[%d].params", key, i), Reason: "must be a mapping"}
			}
			if len(params) > 0 {
				step.Params = params
			}
		}
		out.Steps = append(out.Steps, step)
	}
	return out, nil
}

// renderRetry overlays the retry settings r sets on dst (gateway.retry). budgetPercent becomes
// the data plane's budget_ratio.
func renderRetry(r *coordinatorv1alpha1.GatewayRetrySpec, dst *config.Retry) {
	if v := r.MaxAttempts; v != nil {
		dst.MaxAttempts = int(*v)
	}
	if v := r.MaxRetriesPerRequest; v != nil {
		dst.MaxRetriesPerRequest = int(*v)
	}
	setDuration(&dst.InitialBackoff, r.InitialBackoff)
	setDuration(&dst.MaxBackoff, r.MaxBackoff)
	setDuration(&dst.MaxRetryAfter, r.MaxRetryAfter)
	if v := r.BudgetPercent; v != nil {
		dst.BudgetRatio = float64(*v) / 100
	}
	if v := r.BudgetMinPerSecond; v != nil {
		dst.BudgetMinPerSecond = float64(*v)
	}
}

// renderTracing overlays spec.tracing on dst (the tracing section): enabled unless t.enabled is
// false, and the endpoint, service name and sampling ratio it sets. Its resourceAttributes go to
// the container's environment (containerEnv).
func renderTracing(t *coordinatorv1alpha1.TracingSpec, dst *config.Tracing) {
	dst.Enabled = ptr.Deref(t.Enabled, true)
	if t.Endpoint != "" {
		dst.Endpoint = t.Endpoint
	}
	if t.ServiceName != "" {
		dst.ServiceName = t.ServiceName
	}
	if v := t.SamplingRatePerMillion; v != nil {
		dst.SampleRatio = float64(*v) / 1e6
	}
}

// setDuration overwrites dst when the spec sets d.
func setDuration(dst *config.Duration, d *metav1.Duration) {
	if d != nil {
		*dst = config.Duration(d.Duration)
	}
}

// validatePipeline builds every step of cfg with the data plane's own code (no network I/O, no
// process environment) and returns its error, a *config.FieldError naming the failing key. A step
// that loads files at build time (render's tokenizer) reads them from dirs, the local copies of
// the tokenizers' directories, and checks its params alone for any other directory: the
// operator never reads a path of its own file system that the spec names. Paths of the copies in
// the error are those of the pods.
func validatePipeline(cfg config.Config, dirs localDirs) error {
	p, err := builder.Build(cfg, builder.Options{
		Getenv:    func(string) string { return "" },
		Overrides: builder.Overrides{LocalFiles: dirs.lookup},
	})
	if err != nil {
		return dirs.podPaths(err)
	}
	p.Close()
	return nil
}

// marshalConfig renders cfg as the ConfigMap's coordinator.yaml: a header comment and the
// document config.Parse reads back to the same configuration and revision.
func marshalConfig(cp *coordinatorv1alpha1.CoordinatorPipeline, cfg config.Config) (string, error) {
	body, err := config.Marshal(cfg)
	if err != nil {
		return "", err
	}
	header := fmt.Sprintf("# Rendered by the coordinator operator from CoordinatorPipeline %s/%s; edits are overwritten.\n# revision: %s\n",
		cp.Namespace, cp.Name, cfg.Revision())
	return header + string(body), nil
}

// parseConfig reads back a rendered coordinator.yaml the way the data plane does (without
// environment overrides).
func parseConfig(data string) (config.Config, error) {
	return config.Parse([]byte(data), nil)
}

// restartHash fingerprints cfg.RestartSettings(), the settings a running coordinator cannot take
// from a reloaded file. It is stamped on the pod template, so a change there rolls the
// Deployment, while everything else (pipeline, gateway, log level, body limit, drain timeout...),
// which the coordinators hot-reload from the mounted ConfigMap, leaves the pod template alone. The
// drain timeout still reaches the template through terminationGracePeriodSeconds.
//
// The hashed document is a JSON object with each setting under the last element of its key
// ({"listen_addr":...,"tracing":{...}}), the shape of earlier releases: the same settings give
// the same hash, so upgrading the operator does not roll the coordinators.
func restartHash(cfg config.Config) string {
	var doc bytes.Buffer
	doc.WriteByte('{')
	for i, s := range cfg.RestartSettings() {
		value, err := json.Marshal(s.Value)
		if err != nil {
			panic(fmt.Sprintf("restartHash: %s: %v", s.Key, err)) // strings, numbers, durations, a plain struct: cannot fail
		}
		if i > 0 {
			doc.WriteByte(',')
		}
		name, _ := json.Marshal(s.Key[strings.LastIndexByte(s.Key, '.')+1:]) // a string always marshals
		doc.Write(name)
		doc.WriteByte(':')
		doc.Write(value)
	}
	doc.WriteByte('}')
	sum := sha256.Sum256(doc.Bytes())
	return hex.EncodeToString(sum[:8])
}

// stepSummary lists cfg's step types, comma-separated (status.pipelineSteps).
func stepSummary(cfg config.Config) string {
	types := make([]string, len(cfg.Pipeline.Steps))
	for i, s := range cfg.Pipeline.Steps {
		types[i] = s.Type
	}
	return strings.Join(types, ",")
}

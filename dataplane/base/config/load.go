package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"reflect"
	"strings"

	"golang.org/x/net/http/httpguts"

	"go.yaml.in/yaml/v3"
)

// FieldError is a configuration error tied to one key.
type FieldError struct {
	// Key is the dotted path, e.g. server.read_timeout or pipeline.steps[2].params.max_parallel.
	Key string
	// Reason says what is wrong.
	Reason string
	// Retry says that the configuration is right but what it refers to is not ready yet (files
	// a volume has not been refreshed with): a reload tries the same configuration again.
	Retry bool
}

func (e *FieldError) Error() string { return e.Key + ": " + e.Reason }

func fieldErr(key, format string, args ...any) *FieldError {
	return &FieldError{Key: key, Reason: fmt.Sprintf(format, args...)}
}

// Parse decodes a YAML document over the defaults, applies overrides looked up with lookupEnv
// (nil for none) and validates the result.
func Parse(data []byte, lookupEnv func(string) (string, bool)) (Config, error) {
	cfg := Default()
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return Config{}, fmt.Errorf("config: invalid YAML: %w", err)
	}
	if doc == nil {
		doc = map[string]any{}
	}
	if lookupEnv != nil {
		if err := applyEnv(doc, lookupEnv); err != nil {
			return Config{}, err
		}
	}
	if err := decodeInto(&cfg, doc); err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// FileRevision is the revision of a configuration file's content: the file decoded over the
// defaults, without environment overrides, so that it equals the revision the operator computed
// for the ConfigMap it rendered even when a pod adds COORDINATOR_* variables. Content that does
// not decode gets a hash of its bytes.
func FileRevision(data []byte) string {
	cfg := Default()
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err == nil {
		if doc == nil {
			doc = map[string]any{}
		}
		if err := decodeInto(&cfg, doc); err == nil {
			return cfg.Revision()
		}
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}

// EnvName is the environment variable that overrides a dotted key.
func EnvName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.NewReplacer(".", "_").Replace(key))
}

// EnvKeys lists every key that an environment variable can override, in schema order.
func EnvKeys() []string {
	var keys []string
	walkKeys(reflect.TypeOf(Config{}), "", func(key string, _ reflect.Type) { keys = append(keys, key) })
	return keys
}

func walkKeys(t reflect.Type, path string, fn func(string, reflect.Type)) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		key := yamlKey(f)
		if key == "" {
			continue
		}
		if f.Type.Kind() == reflect.Struct && f.Type != durationType {
			walkKeys(f.Type, join(path, key), fn)
			continue
		}
		fn(join(path, key), f.Type)
	}
}

// applyEnv writes every COORDINATOR_* override into the generic document, creating the
// intermediate mappings, so that an override works whether or not the file has the key. String
// fields take the value verbatim; every other field parses it as YAML (numbers, booleans,
// durations, and a flow or block list for pipeline.steps).
func applyEnv(doc map[string]any, lookupEnv func(string) (string, bool)) error {
	var firstErr error
	walkKeys(reflect.TypeOf(Config{}), "", func(key string, ft reflect.Type) {
		raw, ok := lookupEnv(EnvName(key))
		if !ok || firstErr != nil {
			return
		}
		var val any = raw
		if ft.Kind() != reflect.String {
			if err := yaml.Unmarshal([]byte(raw), &val); err != nil {
				firstErr = fieldErr(key, "environment override %s is not valid YAML: %v", EnvName(key), err)
				return
			}
		}
		parts := strings.Split(key, ".")
		m := doc
		for _, p := range parts[:len(parts)-1] {
			next, ok := m[p].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[p] = next
			}
			m = next
		}
		m[parts[len(parts)-1]] = val
	})
	return firstErr
}

// Validate checks everything that does not need the step registry: limits, addresses and the
// pipeline's shape. Step params and connector names are checked when the pipeline is built.
func (c Config) Validate() error {
	if c.LogLevel < 0 || c.LogLevel > 5 {
		return fieldErr("log_level", "must be between 0 and 5 (1 warn, 2 info, 3 verbose, 4 debug, 5 trace), got %d", c.LogLevel)
	}
	if _, _, err := net.SplitHostPort(c.Server.ListenAddr); err != nil {
		return fieldErr("server.listen_addr", "must be host:port, got %q", c.Server.ListenAddr)
	}
	for _, d := range []struct {
		key string
		v   Duration
	}{
		{"server.read_timeout", c.Server.ReadTimeout},
		{"server.write_timeout", c.Server.WriteTimeout},
		{"server.shutdown_timeout", c.Server.ShutdownTimeout},
		{"gateway.idle_conn_timeout", c.Gateway.IdleConnTimeout},
		{"gateway.timeout", c.Gateway.Timeout},
		{"gateway.idle_timeout", c.Gateway.IdleTimeout},
		{"gateway.request_timeout", c.Gateway.RequestTimeout},
		{"gateway.retry.initial_backoff", c.Gateway.Retry.InitialBackoff},
		{"gateway.retry.max_backoff", c.Gateway.Retry.MaxBackoff},
		{"gateway.retry.max_retry_after", c.Gateway.Retry.MaxRetryAfter},
	} {
		if d.v < 0 {
			return fieldErr(d.key, "must not be negative, got %s", d.v)
		}
	}
	if d := c.Server.DrainDelay; d != nil && *d < 0 {
		return fieldErr("server.drain_delay", "must not be negative, got %s", *d)
	}
	if c.Server.MaxRequestBodySize < 0 {
		return fieldErr("server.max_request_body_size", "must not be negative, got %d", c.Server.MaxRequestBodySize)
	}
	if c.Server.MaxRequestBodySize > maxBodyMiB {
		return fieldErr("server.max_request_body_size", "%d MiB overflows; at most %d", c.Server.MaxRequestBodySize, maxBodyMiB)
	}
	if n := c.Server.MaxContentBlocks; n < 0 || n > maxContentBlocks {
		return fieldErr("server.max_content_blocks", "must be between 0 (the default, %d) and %d, got %d", DefaultMaxContentBlocks, maxContentBlocks, n)
	}
	if c.Server.MetricsPort < 0 || c.Server.MetricsPort > 65535 {
		return fieldErr("server.metrics_port", "must be a port (1-65535) or 0 to disable, got %d", c.Server.MetricsPort)
	}
	if err := c.Server.validateTLS(); err != nil {
		return err
	}
	if h := c.Server.MetricsTenantHeader; h != "" {
		var fe *FieldError
		if err := validateHeaderNames("server.metrics_tenant_header", []string{h}, 1); errors.As(err, &fe) {
			return fieldErr("server.metrics_tenant_header", "%s", fe.Reason)
		}
	}
	if !(c.Tracing.SampleRatio >= 0 && c.Tracing.SampleRatio <= 1) { // NaN too
		return fieldErr("tracing.sample_ratio", "must be between 0 and 1, got %v", c.Tracing.SampleRatio)
	}
	if c.Tracing.Endpoint != "" {
		if err := ValidateBaseURL(c.Tracing.Endpoint); err != nil {
			return fieldErr("tracing.endpoint", "%v", err)
		}
	}
	if c.Gateway.MaxIdleConnsPerHost < 0 {
		return fieldErr("gateway.max_idle_conns_per_host", "must not be negative, got %d", c.Gateway.MaxIdleConnsPerHost)
	}
	if err := c.Gateway.validateLimits(); err != nil {
		return err
	}
	if len(c.Gateway.ProfileHeaders) == 0 {
		return fieldErr("gateway.profile_headers", "at least one header name is required (e.g. %s)", strings.Join(DefaultProfileHeaders(), ", "))
	}
	if err := validateHeaderNames("gateway.profile_headers", c.Gateway.ProfileHeaders, 4); err != nil {
		return err
	}
	if _, err := c.Gateway.HintNetworks(); err != nil {
		return err
	}
	if c.Gateway.Address != "" {
		if err := ValidateBaseURL(c.Gateway.Address); err != nil {
			return fieldErr("gateway.address", "%v", err)
		}
	}
	if err := c.Pipeline.validate("pipeline"); err != nil {
		return err
	}
	if c.RateLimit != nil {
		if err := c.RateLimit.validate(c.Server.MetricsTenantHeader); err != nil {
			return err
		}
	}
	if c.Canary != nil {
		if w := c.Canary.WeightPercent; w < 0 || w > 100 {
			return fieldErr("canary.weight_percent", "must be between 0 (staged: no requests) and 100 (all requests), got %d", w)
		}
		if err := c.Canary.Pipeline.validate("canary.pipeline"); err != nil {
			return err
		}
		if rev := c.Pipeline.Revision(); c.Canary.Pipeline.Revision() == rev {
			return fieldErr("canary.pipeline", "is the same as pipeline (revision %s): nothing to compare; to promote a canary, "+
				"move its pipeline to pipeline and remove canary in the same edit", rev)
		}
	}
	return nil
}

// validate checks the pipeline block found at key.
func (p Pipeline) validate(key string) error {
	if err := validateHeaderNames(key+".forward_response_headers", p.ForwardResponseHeaders, 16); err != nil {
		return err
	}
	switch p.OnPoolFailure {
	case OnPoolFailureAggregate, OnPoolFailureFail:
	default:
		return fieldErr(key+".on_pool_failure", "must be %q or %q, got %q", OnPoolFailureAggregate, OnPoolFailureFail, p.OnPoolFailure)
	}
	if len(p.Steps) == 0 {
		return fieldErr(key+".steps", "at least one step is required (a pipeline ends with decode)")
	}
	for i, s := range p.Steps {
		if s.Type == "" {
			return fieldErr(fmt.Sprintf("%s.steps[%d].type", key, i), "is required")
		}
	}
	return nil
}

// reservedHeaders are headers the coordinator or the transport owns: no setting may name them.
var reservedHeaders = map[string]bool{"prefer": true, "x-request-id": true, "content-type": true, "content-length": true,
	"host": true, "connection": true, "transfer-encoding": true, "te": true, "trailer": true, "upgrade": true,
	"keep-alive": true, "proxy-connection": true, "traceparent": true, "tracestate": true, "authorization": true, "cookie": true}

// validateHeaderNames checks a list of header names: at most most, each a valid HTTP field name
// not owned by the coordinator, no two the same (case-insensitively).
func validateHeaderNames(key string, names []string, most int) error {
	if len(names) > most {
		return fieldErr(key, "at most %d names, got %d", most, len(names))
	}
	seen := map[string]bool{}
	for i, n := range names {
		k := fmt.Sprintf("%s[%d]", key, i)
		switch l := strings.ToLower(n); {
		case n == "":
			return fieldErr(k, "must not be empty")
		case !httpguts.ValidHeaderFieldName(n):
			return fieldErr(k, "%q is not a valid header name", n)
		case reservedHeaders[l]:
			return fieldErr(k, "%q is a header the coordinator owns", n)
		case seen[l]:
			return fieldErr(k, "%q is listed twice", n)
		default:
			seen[l] = true
		}
	}
	return nil
}

// validateLimits checks the response size and retry settings.
func (g Gateway) validateLimits() error {
	if g.MaxResponseSize < 0 || g.MaxResponseSize > maxBodyMiB {
		return fieldErr("gateway.max_response_size", "must be between 0 (the default, %d) and %d MiB, got %d", DefaultMaxResponseMiB, maxBodyMiB, g.MaxResponseSize)
	}
	if g.MaxEventSize < 0 || g.MaxEventSize > maxEventKiB {
		return fieldErr("gateway.max_event_size", "must be between 0 (the default, %d) and %d KiB, got %d", DefaultMaxEventKiB, maxEventKiB, g.MaxEventSize)
	}
	r := g.Retry
	if r.MaxResumeSize < 0 || r.MaxResumeSize > maxEventKiB {
		return fieldErr("gateway.retry.max_resume_size", "must be between 0 (the default, %d) and %d KiB, got %d", DefaultMaxResumeKiB, maxEventKiB, r.MaxResumeSize)
	}
	if r.MaxResumeMemory < 0 || r.MaxResumeMemory > maxBodyMiB {
		return fieldErr("gateway.retry.max_resume_memory", "must be between 0 (the default, %d) and %d MiB, got %d", DefaultMaxResumeMemoryMiB, maxBodyMiB, r.MaxResumeMemory)
	}
	if r.MaxResumeBytes() > r.MaxResumeMemoryBytes() {
		return fieldErr("gateway.retry.max_resume_size", "%d KiB is more than gateway.retry.max_resume_memory (%d MiB)", r.MaxResumeBytes()>>10, r.MaxResumeMemoryBytes()/MiB)
	}
	if r.MaxAttempts < 1 || r.MaxAttempts > 10 {
		return fieldErr("gateway.retry.max_attempts", "must be between 1 (no retries) and 10, got %d", r.MaxAttempts)
	}
	if r.MaxRetriesPerRequest < 0 || r.MaxRetriesPerRequest > 100 {
		return fieldErr("gateway.retry.max_retries_per_request", "must be between 0 (no retries) and 100, got %d", r.MaxRetriesPerRequest)
	}
	if r.MaxBackoff < r.InitialBackoff {
		return fieldErr("gateway.retry.max_backoff", "must not be below gateway.retry.initial_backoff (%s), got %s", r.InitialBackoff, r.MaxBackoff)
	}
	if !(r.BudgetRatio >= 0 && r.BudgetRatio <= 1) { // NaN too
		return fieldErr("gateway.retry.budget_ratio", "must be between 0 and 1, got %v", r.BudgetRatio)
	}
	if !(r.BudgetMinPerSecond >= 0 && r.BudgetMinPerSecond <= 1e6) {
		return fieldErr("gateway.retry.budget_min_per_second", "must be between 0 and 1000000, got %v", r.BudgetMinPerSecond)
	}
	return nil
}

// MaxHintNetworks bounds gateway.allowed_hint_networks.
const MaxHintNetworks = 32

// HintNetworks parses gateway.allowed_hint_networks: each entry a CIDR (127.0.0.0/8, ::1/128)
// without bits set past its prefix length, and IPv4 networks in their IPv4 form (endpoints are
// compared unmapped). Every bad entry is reported, on one line: the *FieldError names the first
// (key and reason), and its reason goes on with "; <key>: <reason>" for each later one.
func (g Gateway) HintNetworks() ([]netip.Prefix, error) {
	const key = "gateway.allowed_hint_networks"
	if len(g.AllowedHintNetworks) > MaxHintNetworks {
		return nil, fieldErr(key, "at most %d networks, got %d", MaxHintNetworks, len(g.AllowedHintNetworks))
	}
	var (
		out []netip.Prefix
		bad *FieldError
	)
	for i, s := range g.AllowedHintNetworks {
		p, reason := parseHintNetwork(s)
		if reason == "" {
			out = append(out, p)
			continue
		}
		k := fmt.Sprintf("%s[%d]", key, i)
		if bad == nil {
			bad = fieldErr(k, "%s", reason)
		} else {
			bad.Reason += "; " + k + ": " + reason
		}
	}
	if bad != nil {
		return nil, bad
	}
	return out, nil
}

// parseHintNetwork parses one entry of gateway.allowed_hint_networks; reason says why it is
// refused ("" when it is not).
func parseHintNetwork(s string) (p netip.Prefix, reason string) {
	p, err := netip.ParsePrefix(s)
	switch {
	case s == "":
		return p, "must not be empty (a CIDR such as 127.0.0.0/8)"
	case err != nil:
		if a, aerr := netip.ParseAddr(s); aerr == nil {
			return p, fmt.Sprintf("%q is an address, not a network: write %s/%d", s, a.WithZone(""), a.BitLen())
		}
		return p, fmt.Sprintf("%q is not a CIDR (e.g. 127.0.0.0/8 or ::1/128): %v", s, err)
	case p.Addr().Is4In6():
		return p, fmt.Sprintf("%q is an IPv4-mapped IPv6 network: write it in IPv4 (endpoints are compared unmapped)", s)
	case p != p.Masked():
		return p, fmt.Sprintf("%q has address bits set past its /%d: write %s", s, p.Bits(), p.Masked())
	}
	return p, ""
}

// ValidateBaseURL checks an http(s) base URL such as a gateway or render service address.
func ValidateBaseURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q is not a URL: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%q must start with http:// or https://", raw)
	}
	if u.Host == "" {
		return fmt.Errorf("%q has no host", raw)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q must not carry a query or fragment", raw)
	}
	return nil
}

// KeyOf returns the key named by a configuration error, or "" when err names none.
func KeyOf(err error) string {
	var fe *FieldError
	if errors.As(err, &fe) {
		return fe.Key
	}
	return ""
}

// Marshal renders cfg as the YAML document Parse reads back to the same configuration (and the
// same Revision). The operator writes its ConfigMap with it.
func Marshal(cfg Config) ([]byte, error) {
	return yaml.Marshal(cfg)
}

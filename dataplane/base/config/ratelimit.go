package config

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Defaults of the rate_limit block.
const (
	// DefaultRateLimitTimeout bounds one Redis call of the limit check (rate_limit.redis_timeout).
	DefaultRateLimitTimeout = 100 * time.Millisecond
	// DefaultRateLimitKeyPrefix prefixes the limiter's Redis keys (rate_limit.key_prefix).
	DefaultRateLimitKeyPrefix = "coordinator:ratelimit:"
	// MaxRateLimitTenants bounds rate_limit.tenants (the tenant label's cap, observe.MaxTenants).
	MaxRateLimitTenants = 1000
	// MaxTenantNameLen is the longest tenant name (the label's, observe.MaxLabelLen).
	MaxTenantNameLen = 128
)

// What the limiter does while Redis does not answer (rate_limit.on_redis_failure).
const (
	// RedisFailureLocal enforces the same limits in each coordinator process alone: with N
	// replicas a tenant may get up to N times its limits until Redis is back.
	RedisFailureLocal = "local"
	// RedisFailureOpen admits every request unlimited.
	RedisFailureOpen = "open"
	// RedisFailureClosed refuses every limited request with 503.
	RedisFailureClosed = "closed"
)

// RateLimit limits each tenant's requests per second and tokens per minute across every
// coordinator replica through a shared Redis. The tenant is the value of TenantHeader.
// Tenants not listed share the Default limits (one bucket for all of them; none when Default
// is nil).
type RateLimit struct {
	// TenantHeader names the request header whose value is the tenant (a header the edge sets
	// after authentication). Empty: server.metrics_tenant_header.
	TenantHeader string `yaml:"tenant_header,omitempty" json:"tenant_header,omitempty"`
	// RedisURL is the Redis the replicas share (redis://, rediss:// or unix://).
	RedisURL string `yaml:"redis_url" json:"redis_url"`
	// PasswordEnv names an environment variable holding the Redis password (overrides the URL's).
	PasswordEnv string `yaml:"password_env,omitempty" json:"password_env,omitempty"`
	// RedisTimeout bounds each Redis call of the check; past it the check fails over
	// (OnRedisFailure). 0 means DefaultRateLimitTimeout.
	RedisTimeout Duration `yaml:"redis_timeout" json:"redis_timeout"`
	// KeyPrefix prefixes the Redis keys, two per tenant: <prefix>{<tenant>}:r and :t.
	KeyPrefix string `yaml:"key_prefix" json:"key_prefix"`
	// OnRedisFailure is RedisFailureLocal (the default), RedisFailureOpen or RedisFailureClosed.
	OnRedisFailure string `yaml:"on_redis_failure" json:"on_redis_failure"`
	// Default limits every tenant not listed in Tenants, together (nil: unlimited).
	Default *TenantLimits `yaml:"default,omitempty" json:"default,omitempty"`
	// Tenants are the tenants with limits (or an objective) of their own.
	Tenants []Tenant `yaml:"tenants,omitempty" json:"tenants,omitempty"`
}

// TenantLimits are a tenant's limits; a zero limit is no limit.
type TenantLimits struct {
	// RequestsPerSecond is the sustained request rate; up to one second's worth may come at once
	// (at least one request).
	RequestsPerSecond float64 `yaml:"requests_per_second" json:"requests_per_second"`
	// TokensPerMinute bounds prompt plus completion tokens; a minute's worth may come at once.
	TokensPerMinute int64 `yaml:"tokens_per_minute" json:"tokens_per_minute"`
}

// Tenant is one tenant's limits and scheduling objective.
type Tenant struct {
	// Name is the tenant header's value.
	Name string `yaml:"name" json:"name"`
	// RequestsPerSecond and TokensPerMinute are its limits, as in TenantLimits (zero: none).
	RequestsPerSecond float64 `yaml:"requests_per_second,omitempty" json:"requests_per_second,omitempty"`
	TokensPerMinute   int64   `yaml:"tokens_per_minute,omitempty" json:"tokens_per_minute,omitempty"`
	// Objective, when set, is sent as the endpoint picker's objective header
	// (x-gateway-inference-objective) on every leg of the tenant's requests: its priority tier.
	Objective string `yaml:"objective,omitempty" json:"objective,omitempty"`
}

// Limits are the tenant's limits.
func (t Tenant) Limits() TenantLimits {
	return TenantLimits{RequestsPerSecond: t.RequestsPerSecond, TokensPerMinute: t.TokensPerMinute}
}

// newRateLimit is a rate_limit block with its defaults.
func newRateLimit() *RateLimit {
	return &RateLimit{RedisTimeout: Duration(DefaultRateLimitTimeout), KeyPrefix: DefaultRateLimitKeyPrefix, OnRedisFailure: RedisFailureLocal}
}

// Timeout is RedisTimeout, or its default when 0.
func (r *RateLimit) Timeout() time.Duration {
	if r.RedisTimeout <= 0 {
		return DefaultRateLimitTimeout
	}
	return r.RedisTimeout.Std()
}

// Limited reports whether l limits anything.
func (l TenantLimits) Limited() bool { return l.RequestsPerSecond > 0 || l.TokensPerMinute > 0 }

// DefaultBucket is the bucket of the tenants rate_limit.tenants does not list.
const DefaultBucket = "*"

// Lookup returns the bucket of a tenant (its name, or DefaultBucket), its limits and objective.
func (r *RateLimit) Lookup(tenant string) (bucket string, limits TenantLimits, objective string) {
	for i := range r.Tenants {
		if t := &r.Tenants[i]; t.Name == tenant {
			return t.Name, t.Limits(), t.Objective
		}
	}
	if r.Default != nil {
		return DefaultBucket, *r.Default, ""
	}
	return DefaultBucket, TenantLimits{}, ""
}

// Header is the tenant header: TenantHeader, else metricsHeader (server.metrics_tenant_header).
func (r *RateLimit) Header(metricsHeader string) string {
	if r.TenantHeader != "" {
		return r.TenantHeader
	}
	return metricsHeader
}

// validate checks the block; metricsHeader is server.metrics_tenant_header.
func (r *RateLimit) validate(metricsHeader string) error {
	const key = "rate_limit"
	if r.TenantHeader != "" {
		var fe *FieldError
		if err := validateHeaderNames(key+".tenant_header", []string{r.TenantHeader}, 1); errors.As(err, &fe) {
			return fieldErr(key+".tenant_header", "%s", fe.Reason)
		}
	} else if metricsHeader == "" {
		return fieldErr(key+".tenant_header", "is required (or server.metrics_tenant_header): it names the header whose value is the tenant")
	}
	if r.RedisURL == "" {
		return fieldErr(key+".redis_url", "is required (redis://host:6379/0)")
	}
	u, err := url.Parse(r.RedisURL)
	switch {
	case err != nil:
		return fieldErr(key+".redis_url", "%v", err)
	case u.Scheme != "redis" && u.Scheme != "rediss" && u.Scheme != "unix":
		return fieldErr(key+".redis_url", "must be a redis://, rediss:// or unix:// URL, got scheme %q", u.Scheme)
	case u.Scheme != "unix" && u.Host == "":
		return fieldErr(key+".redis_url", "has no host")
	}
	if r.RedisTimeout < 0 || r.RedisTimeout.Std() > 10*time.Second {
		return fieldErr(key+".redis_timeout", "must be between 0 (the default, %s) and 10s, got %s", DefaultRateLimitTimeout, r.RedisTimeout)
	}
	if r.KeyPrefix == "" || len(r.KeyPrefix) > 128 {
		return fieldErr(key+".key_prefix", "must be 1 to 128 bytes, got %d", len(r.KeyPrefix))
	}
	switch r.OnRedisFailure {
	case RedisFailureLocal, RedisFailureOpen, RedisFailureClosed:
	default:
		return fieldErr(key+".on_redis_failure", "must be %q, %q or %q, got %q", RedisFailureLocal, RedisFailureOpen, RedisFailureClosed, r.OnRedisFailure)
	}
	if r.Default != nil {
		if err := r.Default.validate(key + ".default"); err != nil {
			return err
		}
	}
	if len(r.Tenants) > MaxRateLimitTenants {
		return fieldErr(key+".tenants", "at most %d tenants, got %d", MaxRateLimitTenants, len(r.Tenants))
	}
	seen := make(map[string]bool, len(r.Tenants))
	for i, t := range r.Tenants {
		k := fmt.Sprintf("%s.tenants[%d]", key, i)
		if err := validTenantName(t.Name); err != "" {
			return fieldErr(k+".name", "%s", err)
		}
		if seen[t.Name] {
			return fieldErr(k+".name", "tenant %q is listed twice", t.Name)
		}
		seen[t.Name] = true
		if err := t.Limits().validate(k); err != nil {
			return err
		}
		if len(t.Objective) > 253 || strings.ContainsFunc(t.Objective, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
			return fieldErr(k+".objective", "must be at most 253 printable ASCII characters without spaces (an InferenceObjective name)")
		}
	}
	return nil
}

func (l TenantLimits) validate(key string) error {
	if !(l.RequestsPerSecond >= 0 && l.RequestsPerSecond <= 1e6) { // NaN too
		return fieldErr(key+".requests_per_second", "must be between 0 (no limit) and 1000000, got %v", l.RequestsPerSecond)
	}
	if l.TokensPerMinute < 0 || l.TokensPerMinute > math.MaxInt32 {
		return fieldErr(key+".tokens_per_minute", "must be between 0 (no limit) and %d, got %d", math.MaxInt32, l.TokensPerMinute)
	}
	return nil
}

// validTenantName returns why name cannot be a tenant ("" when it can): what the tenant label
// admits (1 to MaxTenantNameLen bytes of graphic UTF-8), and not DefaultBucket.
func validTenantName(name string) string {
	switch {
	case name == "":
		return "is required"
	case name == DefaultBucket:
		return fmt.Sprintf("%q is the bucket of the tenants not listed: use rate_limit.default", DefaultBucket)
	case len(name) > MaxTenantNameLen:
		return fmt.Sprintf("must be at most %d bytes, got %d", MaxTenantNameLen, len(name))
	case !utf8.ValidString(name) || strings.ContainsFunc(name, func(r rune) bool { return !unicode.IsGraphic(r) }):
		return "must be printable UTF-8"
	}
	return ""
}

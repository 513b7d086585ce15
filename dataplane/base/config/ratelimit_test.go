package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

const rateLimited = minimal + `
rate_limit:
  redis_url: redis://redis:6379/0
  tenant_header: x-tenant
  default: {requests_per_second: 2, tokens_per_minute: 600}
  tenants:
    - {name: team-a, requests_per_second: 10, tokens_per_minute: 100000, objective: premium}
    - {name: team-b, tokens_per_minute: 1000}
`

func TestRateLimitParse(t *testing.T) {
	cfg, err := Parse([]byte(rateLimited), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.RateLimit
	if r.Timeout() != DefaultRateLimitTimeout || r.KeyPrefix != DefaultRateLimitKeyPrefix || r.OnRedisFailure != RedisFailureLocal {
		t.Fatalf("defaults not applied: %+v", r)
	}
	if r.Header("x-metrics") != "x-tenant" {
		t.Fatalf("Header = %q", r.Header("x-metrics"))
	}
	for _, tc := range []struct {
		tenant, bucket, objective string
		limits                    TenantLimits
	}{
		{"team-a", "team-a", "premium", TenantLimits{10, 100000}},
		{"team-b", "team-b", "", TenantLimits{0, 1000}},
		{"team-c", DefaultBucket, "", TenantLimits{2, 600}},
		{"", DefaultBucket, "", TenantLimits{2, 600}},
		{"*", DefaultBucket, "", TenantLimits{2, 600}},
	} {
		b, l, o := r.Lookup(tc.tenant)
		if b != tc.bucket || l != tc.limits || o != tc.objective {
			t.Errorf("Lookup(%q) = %q %+v %q, want %q %+v %q", tc.tenant, b, l, o, tc.bucket, tc.limits, tc.objective)
		}
	}
	if v, key := cfg.NeededSchema(); v != 6 || key != "rate_limit" {
		t.Fatalf("NeededSchema = %d %q, want 6 rate_limit", v, key)
	}
	// The environment replaces the block; the file decoded over the defaults round-trips.
	cfg2, err := Parse([]byte(minimal), env(map[string]string{"COORDINATOR_RATE_LIMIT": "{redis_url: 'redis://r:6379', tenant_header: x-t, redis_timeout: 20ms, on_redis_failure: closed}"}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg2.RateLimit.Timeout() != 20*time.Millisecond || cfg2.RateLimit.OnRedisFailure != RedisFailureClosed {
		t.Fatalf("override: %+v", cfg2.RateLimit)
	}
	out, err := Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(out, nil)
	if err != nil || back.Revision() != cfg.Revision() {
		t.Fatalf("round trip: %v\n%s", err, out)
	}
}

// Every bad value is refused naming its key; the tenant list and names are bounded.
func TestRateLimitInvalid(t *testing.T) {
	many := make([]string, MaxRateLimitTenants+1)
	for i := range many {
		many[i] = fmt.Sprintf("{name: t%d}", i)
	}
	tests := map[string]struct {
		block, key string
	}{
		"no tenant header":  {"{redis_url: 'redis://r:6379'}", "rate_limit.tenant_header"},
		"bad tenant header": {"{redis_url: 'redis://r:6379', tenant_header: 'a b'}", "rate_limit.tenant_header"},
		"no url":            {"{tenant_header: x-t}", "rate_limit.redis_url"},
		"http url":          {"{tenant_header: x-t, redis_url: 'http://r:6379'}", "rate_limit.redis_url"},
		"no host":           {"{tenant_header: x-t, redis_url: 'redis://'}", "rate_limit.redis_url"},
		"negative timeout":  {"{tenant_header: x-t, redis_url: 'redis://r', redis_timeout: -1s}", "rate_limit.redis_timeout"},
		"huge timeout":      {"{tenant_header: x-t, redis_url: 'redis://r', redis_timeout: 1m}", "rate_limit.redis_timeout"},
		"empty prefix":      {"{tenant_header: x-t, redis_url: 'redis://r', key_prefix: ''}", "rate_limit.key_prefix"},
		"long prefix":       {"{tenant_header: x-t, redis_url: 'redis://r', key_prefix: '" + strings.Repeat("p", 129) + "'}", "rate_limit.key_prefix"},
		"failure mode":      {"{tenant_header: x-t, redis_url: 'redis://r', on_redis_failure: maybe}", "rate_limit.on_redis_failure"},
		"negative rps":      {"{tenant_header: x-t, redis_url: 'redis://r', default: {requests_per_second: -1}}", "rate_limit.default.requests_per_second"},
		"huge rps":          {"{tenant_header: x-t, redis_url: 'redis://r', default: {requests_per_second: 1e7}}", "rate_limit.default.requests_per_second"},
		"huge tpm":          {"{tenant_header: x-t, redis_url: 'redis://r', tenants: [{name: a, tokens_per_minute: 3000000000}]}", "rate_limit.tenants[0].tokens_per_minute"},
		"unnamed tenant":    {"{tenant_header: x-t, redis_url: 'redis://r', tenants: [{requests_per_second: 1}]}", "rate_limit.tenants[0].name"},
		"star tenant":       {"{tenant_header: x-t, redis_url: 'redis://r', tenants: [{name: '*'}]}", "rate_limit.tenants[0].name"},
		"long tenant":       {"{tenant_header: x-t, redis_url: 'redis://r', tenants: [{name: " + strings.Repeat("n", MaxTenantNameLen+1) + "}]}", "rate_limit.tenants[0].name"},
		"control tenant":    {"{tenant_header: x-t, redis_url: 'redis://r', tenants: [{name: \"a\\tb\"}]}", "rate_limit.tenants[0].name"},
		"twice":             {"{tenant_header: x-t, redis_url: 'redis://r', tenants: [{name: a}, {name: a}]}", "rate_limit.tenants[1].name"},
		"objective space":   {"{tenant_header: x-t, redis_url: 'redis://r', tenants: [{name: a, objective: 'a b'}]}", "rate_limit.tenants[0].objective"},
		"too many tenants":  {"{tenant_header: x-t, redis_url: 'redis://r', tenants: [" + strings.Join(many, ",") + "]}", "rate_limit.tenants"},
		"unknown key":       {"{tenant_header: x-t, redis_url: 'redis://r', burst: 3}", "rate_limit.burst"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(minimal+"rate_limit: "+tc.block+"\n"), nil)
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Key != tc.key {
				t.Fatalf("err = %v, want a FieldError at %s", err, tc.key)
			}
		})
	}
}

package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/ratelimit"
	"github.com/epd-dev/coordinator/test/doubles/asyncworker/redistest"
	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/harness/stack"
	"github.com/epd-dev/coordinator/test/internal/loopback"
)

// Two coordinator replicas share one Redis: a tenant over its tokens per minute gets 429 on
// both, with Retry-After and OpenAI's x-ratelimit-* headers, and no leg reaches a worker;
// another tenant's requests all pass. Each tenant's objective reaches the endpoint picker's
// header; a client's own objective never does.
func TestRateLimitTwoReplicas(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	var cfg config.Config
	s := startWith(t, stack.Options{KVConnector: "kv-nixl"}, "kv-nixl", "ec-nixl", true, steps("prefill", "decode"), func(c *config.Config) {
		c.Server.MetricsTenantHeader = "X-Tenant"
		c.RateLimit = &config.RateLimit{RedisURL: rs.URL(), RedisTimeout: config.Duration(time.Second), KeyPrefix: config.DefaultRateLimitKeyPrefix,
			OnRedisFailure: config.RedisFailureClosed, // a Redis failure answers 503, and fails this test
			Tenants: []config.Tenant{
				// 100 tokens a minute: one answer of 100 completion tokens leaves the tenant in debt
				// for more than 30 s, though its reservation up front (its body's size) is small.
				{Name: "heavy", TokensPerMinute: 100, Objective: "batch"},
				{Name: "light", TokensPerMinute: 1_000_000, RequestsPerSecond: 1000, Objective: "premium"},
			}}
		cfg = *c
	})
	second, err := stack.StartCoordinatorWith(cfg, stack.CoordinatorOptions{Log: testLogger(t), Overrides: stack.LoopbackMedia, Getenv: s.stack.Getenv})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Close)
	replicas := []string{s.coord.URL(), second.URL()}

	post := func(replica int, tenant, clientObjective string, maxTokens int) (*http.Response, []byte) {
		t.Helper()
		body := fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":"red green blue"}],"max_tokens":%d}`, maxTokens)
		req, _ := http.NewRequest(http.MethodPost, replicas[replica]+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Tenant", tenant)
		if clientObjective != "" {
			req.Header.Set("X-Gateway-Inference-Objective", clientObjective)
		}
		return loopback.Fetch(t, http.DefaultClient, req)
	}
	// The first heavy request passes (a full bucket); its answer's usage (over 100 tokens) is
	// settled after it was sent.
	resp, body := post(0, "heavy", "", 100)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("first heavy request: %d %s", resp.StatusCode, body)
	}
	if resp.Header.Get(ratelimit.HeaderLimitTokens) != "100" || resp.Header.Get(ratelimit.HeaderRemainingTokens) == "" ||
		resp.Header.Get(ratelimit.HeaderResetTokens) == "" || resp.Header.Get(ratelimit.HeaderLimitRequests) != "" {
		t.Fatalf("served answer's rate-limit headers: %v", resp.Header)
	}
	var usage struct {
		Usage struct {
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &usage); err != nil || usage.Usage.CompletionTokens != 100 {
		t.Fatalf("usage of the heavy answer: %s (%v)", body, err)
	}
	legs := len(s.stack.Gateway.Legs())
	// Over its limit: 429 on both replicas, whatever the request.
	for i := range 4 {
		resp, body := post(i%2, "heavy", "", 1)
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("heavy request %d on replica %d: %d %s, want 429", i, i%2, resp.StatusCode, body)
		}
		ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		if err != nil || ra < 1 {
			t.Fatalf("Retry-After %q", resp.Header.Get("Retry-After"))
		}
		if resp.Header.Get(ratelimit.HeaderLimitTokens) != "100" || resp.Header.Get(ratelimit.HeaderRemainingTokens) != "0" || resp.Header.Get(ratelimit.HeaderResetTokens) == "" {
			t.Fatalf("429's rate-limit headers: %v", resp.Header)
		}
		var e struct {
			Error struct{ Message, Type, Code string } `json:"error"`
		}
		if err := json.Unmarshal(body, &e); err != nil || e.Error.Type != "rate_limit_error" || e.Error.Code != "rate_limit_exceeded" ||
			!strings.Contains(e.Error.Message, "tokens per minute") {
			t.Fatalf("429 body %s", body)
		}
	}
	if n := len(s.stack.Gateway.Legs()); n != legs {
		t.Fatalf("%d legs reached the gateway for refused requests", n-legs)
	}
	// The other tenant passes on both replicas, throughout.
	for i := range 6 {
		if resp, body := post(i%2, "light", "", 4); resp.StatusCode != http.StatusOK || resp.Header.Get(ratelimit.HeaderLimitRequests) != "1000" {
			t.Fatalf("light request %d on replica %d: %d %v %s", i, i%2, resp.StatusCode, resp.Header, body)
		}
	}
	// Objectives: the tenant's on every leg, a client's never.
	for _, tc := range []struct{ tenant, client, want string }{
		{"light", "sneaky", "premium"},
		{"nobody", "sneaky", ""}, // not listed, no default: unlimited and no objective
	} {
		before := countRequests(s)
		if resp, body := post(1, tc.tenant, tc.client, 2); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", tc.tenant, resp.StatusCode, body)
		}
		got := objectivesSince(s, before)
		if len(got) != 2 { // prefill and decode
			t.Fatalf("%s: %d worker requests, want 2", tc.tenant, len(got))
		}
		for _, o := range got {
			if o != tc.want {
				t.Fatalf("%s: a leg's objective is %q, want %q (client sent %q)", tc.tenant, o, tc.want, tc.client)
			}
		}
	}
}

// countRequests counts the requests each prefill and decode worker got so far.
func countRequests(s *system) []int {
	var n []int
	for _, w := range append(append([]*simworker.Worker{}, s.stack.Prefill...), s.stack.Decode...) {
		n = append(n, len(w.Requests()))
	}
	return n
}

// objectivesSince are the objective headers of the inference legs the workers got after counts
// (countRequests).
func objectivesSince(s *system, counts []int) []string {
	var out []string
	for i, w := range append(append([]*simworker.Worker{}, s.stack.Prefill...), s.stack.Decode...) {
		for _, r := range w.Requests()[counts[i]:] {
			if r.Method != http.MethodPost { // the decode worker's KV pull from the prefill worker
				continue
			}
			out = append(out, r.Header.Get("X-Gateway-Inference-Objective"))
		}
	}
	return out
}

// rateLimited starts a prefill-decode system whose rate_limit block is rl (tenant header
// X-Tenant), and returns it with a poster of chats for a tenant.
func rateLimited(t *testing.T, rl *config.RateLimit) (*system, func(tenant string) (*http.Response, []byte)) {
	t.Helper()
	s := startWith(t, stack.Options{}, "kv-nixl", "ec-nixl", true, steps("decode"), func(c *config.Config) {
		c.Server.MetricsTenantHeader = "X-Tenant"
		c.RateLimit = rl
	})
	return s, func(tenant string) (*http.Response, []byte) {
		t.Helper()
		return s.post("/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, map[string]string{"X-Tenant": tenant})
	}
}

// What a client sees while Redis is down, or hangs, by rate_limit.on_redis_failure.
func TestRateLimitRedisFailure(t *testing.T) {
	tests := map[string]struct {
		mode string
		// statuses are what a tenant limited to one request per 100 s gets for three requests.
		statuses []int
		headers  bool // the answers carry x-ratelimit-* headers
	}{
		// Each replica enforces the limits alone: the first passes, then 429.
		"local": {config.RedisFailureLocal, []int{200, 429, 429}, true},
		// Unlimited while Redis is down; no rate-limit headers (nothing was counted).
		"open": {config.RedisFailureOpen, []int{200, 200, 200}, false},
		// Every limited request is refused with 503 and Retry-After.
		"closed": {config.RedisFailureClosed, []int{503, 503, 503}, false},
	}
	for _, fault := range []string{"down", "hanging"} {
		for name, tc := range tests {
			t.Run(fault+"/"+name, func(t *testing.T) {
				rs := redistest.Start(t, redistest.Options{})
				_, post := rateLimited(t, &config.RateLimit{RedisURL: rs.URL(), RedisTimeout: config.Duration(50 * time.Millisecond),
					KeyPrefix: config.DefaultRateLimitKeyPrefix, OnRedisFailure: tc.mode,
					Tenants: []config.Tenant{{Name: "slow", RequestsPerSecond: 0.01}}})
				if fault == "down" {
					rs.Stop()
				} else if _, err := rs.Do("CLIENT", "PAUSE", "5000", "ALL"); err != nil { // every command waits 5 s
					t.Fatal(err)
				}
				for i, want := range tc.statuses {
					start := time.Now()
					resp, body := post("slow")
					if resp.StatusCode != want {
						t.Fatalf("request %d: %d %s, want %d", i, resp.StatusCode, body, want)
					}
					if took := time.Since(start); took > 3*time.Second {
						t.Fatalf("request %d took %s: the Redis timeout (50ms) did not hold", i, took)
					}
					if got := resp.Header.Get(ratelimit.HeaderLimitRequests) != ""; got != tc.headers {
						t.Fatalf("request %d: x-ratelimit headers %v, want %v: %v", i, got, tc.headers, resp.Header)
					}
					if want != 200 && resp.Header.Get("Retry-After") == "" {
						t.Fatalf("request %d: %d without Retry-After", i, want)
					}
					if want == 503 && !strings.Contains(string(body), "rate_limit_unavailable") {
						t.Fatalf("503 body %s", body)
					}
				}
				// A tenant without limits never waits for Redis.
				if resp, body := post("other"); resp.StatusCode != http.StatusOK {
					t.Fatalf("unlimited tenant: %d %s", resp.StatusCode, body)
				}
			})
		}
	}
}

// A new rate_limit block applies from the next request (what a reload swaps in); removing it
// lifts the limits.
func TestRateLimitReload(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	s, post := rateLimited(t, &config.RateLimit{RedisURL: rs.URL(), RedisTimeout: config.Duration(time.Second),
		KeyPrefix: config.DefaultRateLimitKeyPrefix, OnRedisFailure: config.RedisFailureClosed})
	for i := range 3 {
		if resp, body := post("team"); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d without limits: %d %s", i, resp.StatusCode, body)
		}
	}
	cfg := s.coord.Pipeline.Config()
	swap := func(rl *config.RateLimit) {
		t.Helper()
		c := cfg
		c.RateLimit = rl
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		p, err := builder.Build(c, builder.Options{})
		if err != nil {
			t.Fatal(err)
		}
		s.coord.Holder.Swap(p)
	}
	limited := *cfg.RateLimit
	limited.Default = &config.TenantLimits{RequestsPerSecond: 0.01}
	swap(&limited)
	if resp, _ := post("team"); resp.StatusCode != http.StatusOK {
		t.Fatalf("first limited request: %d", resp.StatusCode)
	}
	if resp, _ := post("team"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second limited request: %d, want 429", resp.StatusCode)
	}
	swap(nil)
	if resp, _ := post("team"); resp.StatusCode != http.StatusOK || resp.Header.Get(ratelimit.HeaderLimitRequests) != "" {
		t.Fatalf("after the limits were removed: %d %v", resp.StatusCode, resp.Header)
	}
}

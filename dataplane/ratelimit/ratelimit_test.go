package ratelimit

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/test/doubles/asyncworker/redistest"
)

// block is a rate_limit block on the Redis at url. Its limits refill slowly (one request per
// 100 s, 1000 tokens a minute: 17 a second) so that what a test takes is still taken when it
// checks the next request, however slow the machine.
func block(url, onFailure string) *config.RateLimit {
	return &config.RateLimit{RedisURL: url, TenantHeader: "x-tenant", RedisTimeout: config.Duration(200 * time.Millisecond),
		KeyPrefix: "rl:", OnRedisFailure: onFailure,
		Default: &config.TenantLimits{RequestsPerSecond: 0.01},
		Tenants: []config.Tenant{
			{Name: "tokens", TokensPerMinute: 1000, Objective: "batch"},
			{Name: "requests", RequestsPerSecond: 0.01},
			{Name: "free", Objective: "premium"},
		}}
}

// Two limiters (two replicas) share the buckets in Redis: what one takes, the other cannot.
func TestCheckSharedAcrossReplicas(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	a, b := New(logr.Discard(), nil), New(logr.Discard(), nil)
	defer a.Close()
	defer b.Close()
	cfg := block(rs.URL(), config.RedisFailureClosed) // closed: a Redis failure would fail the test, not pass it
	ctx := context.Background()
	type step struct {
		on      *Limiter
		tenant  string
		tokens  int64
		allowed bool
		refused string
	}
	tests := map[string][]step{
		"requests: one per 100s, on either replica": {
			{a, "requests", 0, true, ""}, {b, "requests", 0, false, LimitRequests}, {a, "requests", 0, false, LimitRequests},
		},
		"tokens: 1000 a minute, reserved up front": {
			{a, "tokens", 900, true, ""}, {b, "tokens", 500, false, LimitTokens}, {a, "tokens", 50, true, ""}, {b, "tokens", 300, false, LimitTokens},
		},
		"an estimate over the limit is clamped to it: it passes on a full bucket only": {
			{a, "tokens", 1 << 40, true, ""}, {b, "tokens", 100, false, LimitTokens},
		},
		"tenants not listed share the default bucket": {
			{a, "team-x", 0, true, ""}, {b, "team-y", 0, false, LimitRequests}, {a, "", 0, false, LimitRequests},
		},
		"a tenant without limits is never checked": {
			{a, "free", 1 << 20, true, ""}, {b, "free", 1 << 20, true, ""},
		},
	}
	for name, steps := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := rs.Do("FLUSHALL"); err != nil {
				t.Fatal(err)
			}
			for i, s := range steps {
				d := s.on.Check(ctx, cfg, s.tenant, s.tokens)
				if d.Allowed != s.allowed || d.Refused != s.refused {
					t.Fatalf("step %d (%s, %d tokens): allowed %v refused %q, want %v %q (%+v)", i, s.tenant, s.tokens, d.Allowed, d.Refused, s.allowed, s.refused, d)
				}
				if d.Limited && d.Source != SourceRedis {
					t.Fatalf("step %d: source %s, want redis", i, d.Source)
				}
				if !d.Allowed && d.RetryAfter <= 0 {
					t.Fatalf("step %d: refused without a Retry-After", i)
				}
			}
		})
	}
	// Refusals are counted by bucket and limit: the table refused requests twice, tokens three
	// times and the default bucket twice.
	limited := func(bucket, limit string) float64 {
		return testutil.ToFloat64(a.limited.WithLabelValues(bucket, limit)) + testutil.ToFloat64(b.limited.WithLabelValues(bucket, limit))
	}
	if r, tk, d := limited("requests", LimitRequests), limited("tokens", LimitTokens), limited(config.DefaultBucket, LimitRequests); r != 2 || tk != 3 || d != 2 {
		t.Fatalf("limited: requests %v, tokens %v, default %v; want 2, 3, 2", r, tk, d)
	}
	// The key space: two keys per bucket, whatever tenants clients name.
	if _, err := rs.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		a.Check(ctx, cfg, fmt.Sprintf("tenant-%d-%s", i, strings.Repeat("x", 1000)), 0)
	}
	if n, err := rs.Do("DBSIZE"); err != nil || n != ":1" {
		t.Fatalf("DBSIZE = %s (%v), want 1: unlisted tenants share one bucket", n, err)
	}
}

// The answer's usage settles the reservation: more used puts the tenant in debt, a failed
// request gives its reservation back.
func TestSettle(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	for _, mode := range []string{"redis", config.RedisFailureLocal} {
		t.Run(mode, func(t *testing.T) {
			l := New(logr.Discard(), nil)
			defer l.Close()
			cfg := block(rs.URL(), config.RedisFailureLocal)
			if mode == config.RedisFailureLocal {
				cfg.RedisURL = "redis://127.0.0.1:1/0" // refused: the local buckets decide
			}
			want := SourceRedis
			if mode == config.RedisFailureLocal {
				want = SourceLocal
			}
			ctx := context.Background()
			d := l.Check(ctx, cfg, "tokens", 100)
			if !d.Allowed || d.Source != want || d.Reserved != 100 {
				t.Fatalf("first: %+v", d)
			}
			l.Settle(ctx, d, 950) // the answer used 950: 850 more than reserved
			if d := l.Check(ctx, cfg, "tokens", 200); d.Allowed {
				t.Fatalf("after settling 950 tokens, 200 more pass: %+v", d)
			}
			d = l.Check(ctx, cfg, "tokens", 1)
			if !d.Allowed {
				t.Fatalf("one token is refused: %+v", d)
			}
			failed := l.Check(ctx, cfg, "tokens", 0)
			if !failed.Allowed {
				t.Fatalf("a zero-token check is refused: %+v", failed)
			}
			// Give back more than a reservation: what was taken by the 950 returns.
			big := d
			big.Reserved = 900
			l.Settle(ctx, big, 0)
			if d := l.Check(ctx, cfg, "tokens", 800); !d.Allowed {
				t.Fatalf("after a refund of 900, 800 tokens are refused: %+v", d)
			}
		})
	}
}

// What a client sees while Redis is down, by on_redis_failure.
func TestRedisDown(t *testing.T) {
	tests := map[string]struct {
		allowed []bool // the first three requests of a tenant limited to one per 100 s
		source  string
		refused string
	}{
		// Each replica enforces the limits alone.
		config.RedisFailureLocal: {allowed: []bool{true, false, false}, source: SourceLocal, refused: LimitRequests},
		// Every request passes, unlimited.
		config.RedisFailureOpen: {allowed: []bool{true, true, true}, source: SourceOpen},
		// Every limited request gets 503.
		config.RedisFailureClosed: {allowed: []bool{false, false, false}, source: SourceClosed, refused: LimitUnavailable},
	}
	rs := redistest.Start(t, redistest.Options{})
	url := rs.URL()
	rs.Stop()
	for mode, tc := range tests {
		t.Run(mode, func(t *testing.T) {
			l := New(logr.Discard(), nil)
			defer l.Close()
			cfg := block(url, mode)
			for i, want := range tc.allowed {
				d := l.Check(context.Background(), cfg, "requests", 0)
				if d.Allowed != want || d.Source != tc.source || (!want && d.Refused != tc.refused) {
					t.Fatalf("request %d: %+v, want allowed %v from %s", i, d, want, tc.source)
				}
			}
			if n := testutil.ToFloat64(l.redisErrors.WithLabelValues("check")); n != 1 {
				t.Fatalf("%v Redis errors counted, want 1: the fallback holds for a second without asking Redis", n)
			}
			// A tenant without limits never depends on Redis.
			if d := l.Check(context.Background(), cfg, "free", 0); !d.Allowed {
				t.Fatalf("an unlimited tenant is refused: %+v", d)
			}
		})
	}
}

// A Redis that does not answer costs the request redis_timeout, then the fallback decides; the
// following requests do not wait for it.
func TestRedisHanging(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	l := New(logr.Discard(), nil)
	defer l.Close()
	cfg := block(rs.URL(), config.RedisFailureLocal)
	cfg.RedisTimeout = config.Duration(50 * time.Millisecond)
	if d := l.Check(context.Background(), cfg, "tokens", 10); d.Source != SourceRedis { // a connection in the pool
		t.Fatalf("%+v", d)
	}
	if _, err := rs.Do("CLIENT", "PAUSE", "3000", "ALL"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	d := l.Check(context.Background(), cfg, "tokens", 10)
	took := time.Since(start)
	if !d.Allowed || d.Source != SourceLocal {
		t.Fatalf("%+v, want allowed by the local fallback", d)
	}
	if took < 50*time.Millisecond || took > 2*time.Second {
		t.Fatalf("the check took %s, want about the 50ms timeout", took)
	}
	start = time.Now()
	if d := l.Check(context.Background(), cfg, "tokens", 10); d.Source != SourceLocal {
		t.Fatalf("%+v", d)
	}
	if took := time.Since(start); took > 40*time.Millisecond {
		t.Fatalf("the next check took %s: it waited for Redis again", took)
	}
}

// A reload (a new rate_limit block) takes effect with the next check.
func TestReload(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	l := New(logr.Discard(), nil)
	defer l.Close()
	ctx := context.Background()
	old := block(rs.URL(), config.RedisFailureClosed)
	if d := l.Check(ctx, old, "free", 0); d.Limited {
		t.Fatalf("%+v", d)
	}
	next := block(rs.URL(), config.RedisFailureClosed)
	next.Tenants[2].RequestsPerSecond = 0.01
	if d := l.Check(ctx, next, "free", 0); !d.Limited || !d.Allowed {
		t.Fatalf("%+v", d)
	}
	if d := l.Check(ctx, next, "free", 0); d.Allowed {
		t.Fatalf("the new limit is not enforced: %+v", d)
	}
	moved := block("redis://127.0.0.1:1/0", config.RedisFailureClosed) // another Redis: a new client
	if d := l.Check(ctx, moved, "free", 0); d.Source != SourceOpen && d.Limited {
		// "free" is unlimited in moved again.
		t.Fatalf("%+v", d)
	}
	if d := l.Check(ctx, moved, "requests", 0); d.Source != SourceClosed {
		t.Fatalf("the old client is used after the Redis URL changed: %+v", d)
	}
}

func TestLocalBucket(t *testing.T) {
	p := newParams(config.TenantLimits{RequestsPerSecond: 2, TokensPerMinute: 600}, 300) // 0.5 s per request, 0.1 s per token
	var b localBucket
	now := 1e12
	tests := []struct {
		at      float64 // microseconds after now
		allowed bool
		reqDebt float64
		tokDebt float64
	}{
		{0, true, 0.5e6, 30e6},
		{0, true, 1e6, 60e6},
		{0, false, 1e6, 60e6},     // both buckets full: 300 tokens more would be 90 s
		{30e6, true, 0.5e6, 60e6}, // 30 s later: 300 tokens freed
	}
	for i, tc := range tests {
		r := b.check(now+tc.at, p)
		if r.allowed != tc.allowed || r.reqDebt != tc.reqDebt || r.tokDebt != tc.tokDebt {
			t.Fatalf("check %d = %+v, want %+v", i, r, tc)
		}
	}
	w := p.window(true, p.reqBurst, 0.5e6, p.reqInterval, p.reqTolerance)
	if w != (Window{Limit: 2, Remaining: 1, Reset: 500 * time.Millisecond}) {
		t.Fatalf("window %+v", w)
	}
}

func TestHeadersAndError(t *testing.T) {
	d := Decision{Limited: true, Source: SourceRedis, Allowed: false, Refused: LimitTokens, Requested: 500, RetryAfter: 1500 * time.Millisecond,
		Requests: Window{Limit: 10, Remaining: 9, Reset: 100 * time.Millisecond},
		Tokens:   Window{Limit: 1000, Remaining: 20, Reset: 58*time.Second + 800*time.Millisecond}}
	h := http.Header{}
	d.SetHeaders(h)
	want := map[string]string{HeaderLimitRequests: "10", HeaderRemainingRequests: "9", HeaderResetRequests: "100ms",
		HeaderLimitTokens: "1000", HeaderRemainingTokens: "20", HeaderResetTokens: "58.8s"}
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	e := d.Error()
	if e.Status != http.StatusTooManyRequests || e.Code != "rate_limit_exceeded" || e.RetryAfter != d.RetryAfter || !strings.Contains(e.Message, "tokens per minute") {
		t.Fatalf("%+v", e)
	}
	d.Refused = LimitUnavailable
	if e := d.Error(); e.Status != http.StatusServiceUnavailable {
		t.Fatalf("%+v", e)
	}
	for _, src := range []string{SourceOpen, SourceClosed, ""} {
		h := http.Header{}
		Decision{Source: src, Requests: d.Requests}.SetHeaders(h)
		if len(h) != 0 {
			t.Fatalf("%s: headers %v", src, h)
		}
	}
	for d, s := range map[time.Duration]string{0: "0ms", 20 * time.Millisecond: "20ms", 1100 * time.Microsecond: "2ms", time.Second: "1s", 6 * time.Minute: "6m0s"} {
		if got := FormatReset(d); got != s {
			t.Errorf("FormatReset(%s) = %q, want %q", d, got, s)
		}
	}
}

// Every rate admits its whole burst from an empty bucket, and a burst of one exactly one,
// through Redis and through the local buckets at a clock of today's magnitude (~1.8e15 µs, where
// a float64 steps by a quarter µs): the float rounding of the bucket arithmetic neither refuses
// a request on an empty bucket (rates under 2/s were refused for ever) nor reports one request
// too few remaining.
func TestFractionalRates(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	type rate struct {
		rps                   float64
		burst                 int
		remainingAfterOne     int64
		refusedAfterBurstOnly bool // the interval is long enough to check the request after the burst
	}
	rates := []rate{{0.7, 1, 0, true}, {1.1, 1, 0, true}, {1.5, 1, 0, true}, {3, 3, 2, false}, {6, 6, 5, false}, {7.3, 7, 6, false}}
	for _, mode := range []string{"redis", config.RedisFailureLocal} {
		for _, r := range rates {
			t.Run(fmt.Sprintf("%s/%grps", mode, r.rps), func(t *testing.T) {
				if _, err := rs.Do("FLUSHALL"); err != nil {
					t.Fatal(err)
				}
				l := New(logr.Discard(), nil)
				defer l.Close()
				cfg := block(rs.URL(), config.RedisFailureLocal)
				cfg.Tenants = []config.Tenant{{Name: "t", RequestsPerSecond: r.rps}}
				want := SourceRedis
				if mode == config.RedisFailureLocal {
					cfg.RedisURL = "redis://127.0.0.1:1/0" // refused: the local buckets decide
					want = SourceLocal
					at := time.Unix(1796525555, 123456789)
					l.now = func() time.Time { return at } // no time passes between the checks
				}
				for i := range r.burst {
					d := l.Check(context.Background(), cfg, "t", 0)
					if !d.Allowed || d.Source != want {
						t.Fatalf("request %d of a burst of %d refused: %+v", i+1, r.burst, d)
					}
					if i == 0 && d.Requests.Remaining != r.remainingAfterOne {
						t.Fatalf("after one request %d remaining, want %d", d.Requests.Remaining, r.remainingAfterOne)
					}
				}
				if r.refusedAfterBurstOnly || mode == config.RedisFailureLocal {
					if d := l.Check(context.Background(), cfg, "t", 0); d.Allowed {
						t.Fatalf("request %d past a burst of %d admitted: %+v", r.burst+1, r.burst, d)
					}
				}
			})
		}
	}
}

// A settle after a reload that moved the limiter to another Redis leaves the new block's client
// alone (it settled through the old block's client, which the reload closed: the old server's
// buckets no longer decide anything, so the reservation standing there costs nothing), and is
// not taken for an outage.
func TestSettleAcrossAReload(t *testing.T) {
	a, b := redistest.Start(t, redistest.Options{}), redistest.Start(t, redistest.Options{})
	l := New(logr.Discard(), nil)
	defer l.Close()
	ctx := context.Background()
	oldCfg, newCfg := block(a.URL(), config.RedisFailureClosed), block(b.URL(), config.RedisFailureClosed)
	inFlight := l.Check(ctx, oldCfg, "tokens", 100)
	if inFlight.Source != SourceRedis || !inFlight.Allowed {
		t.Fatalf("%+v", inFlight)
	}
	if d := l.Check(ctx, newCfg, "tokens", 100); d.Source != SourceRedis || !d.Allowed {
		t.Fatalf("the first check on the new block: %+v", d)
	}
	l.Settle(ctx, inFlight, 1000) // the old request's answer: 900 more than reserved
	if d := l.Check(ctx, newCfg, "tokens", 800); d.Source != SourceRedis || !d.Allowed {
		t.Fatalf("the new block's Redis after the old request settled: %+v (closed would say source closed)", d)
	}
	if n := testutil.ToFloat64(l.redisErrors.WithLabelValues("settle")) + testutil.ToFloat64(l.redisErrors.WithLabelValues("check")); n != 0 {
		t.Fatalf("%v Redis errors", n)
	}
	// A reload that leaves the block as it was keeps the client (no reconnect, same buckets).
	c1, _ := l.state(newCfg)
	same := *newCfg
	c2, _ := l.state(&same)
	if c1 != c2 {
		t.Fatal("an equal block after a reload got a new Redis client")
	}
}

// After the unavailable window, one check at a time tries Redis again; the others take the
// fallback instead of each waiting for the timeout.
func TestOneProberAfterAnOutage(t *testing.T) {
	l := New(logr.Discard(), nil)
	defer l.Close()
	at := time.Unix(1796525555, 0)
	l.now = func() time.Time { return at }
	l.unavailableUntil.Store(at.Add(-time.Millisecond).UnixNano()) // the window has passed
	if !l.mayTryRedis(time.Second) {
		t.Fatal("the first check after the window may not try Redis")
	}
	for i := range 3 {
		if l.mayTryRedis(time.Second) {
			t.Fatalf("check %d tried Redis while the first one's call is out", i+2)
		}
	}
	at = at.Add(2 * time.Second) // the prober's call timed out without marking (it would have)
	if !l.mayTryRedis(time.Second) {
		t.Fatal("after the prober's timeout, no check may try Redis")
	}
	l.unavailableUntil.Store(0) // a success
	for range 3 {
		if !l.mayTryRedis(time.Second) {
			t.Fatal("while Redis answers, a check may not try it")
		}
	}
}

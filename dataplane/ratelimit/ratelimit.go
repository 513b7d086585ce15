// Package ratelimit limits each tenant's requests per second and tokens per minute
// (config.RateLimit) across every coordinator replica through a shared Redis.
//
// Each limit is a GCRA bucket (a token bucket kept as one theoretical arrival time per tenant
// and limit), checked and taken in one atomic Lua script: one Redis round trip per request,
// on Redis's clock, so replicas with skewed clocks agree. A request takes one request and the
// tokens of its prompt as estimated up front; Settle corrects the token bucket with the answer's
// usage (a second, cheap script) once the answer was sent. A tenant whose answers used more
// than was reserved is in debt until its bucket refills.
//
// The key space is bounded by the configuration: two keys per listed tenant and two for all the
// others together (config.DefaultBucket), each expiring once its bucket is full again.
//
// When Redis fails or does not answer within rate_limit.redis_timeout, the check falls back to
// rate_limit.on_redis_failure for a second (then tries Redis again): local (the same buckets
// in this process alone), open (admit) or closed (refuse with 503).
package ratelimit

import (
	"context"
	"errors"
	"math"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/broker/redisclient"
)

// Where a decision came from.
const (
	// SourceRedis is the shared buckets in Redis.
	SourceRedis = "redis"
	// SourceLocal is this process's buckets (Redis failed; on_redis_failure local).
	SourceLocal = "local"
	// SourceOpen admitted without a check (Redis failed; on_redis_failure open).
	SourceOpen = "open"
	// SourceClosed refused without a check (Redis failed; on_redis_failure closed).
	SourceClosed = "closed"
)

// Which limit refused a request.
const (
	LimitRequests = "requests"
	LimitTokens   = "tokens"
	// LimitUnavailable is a refusal because Redis failed (on_redis_failure closed).
	LimitUnavailable = "unavailable"
)

const (
	// unavailableFor is how long the check skips Redis after a Redis error, so that an outage
	// costs one timeout per interval, not one per request.
	unavailableFor  = time.Second
	redisClientName = "coordinator-ratelimit"
	usPerSecond     = 1e6
	usPerMinute     = 60e6
	// toleranceSlack (µs) absorbs the rounding of the bucket arithmetic (newParams).
	toleranceSlack = 1
)

// Window is the state of one limit after a check, what the x-ratelimit-* headers report.
type Window struct {
	// Limit is the bucket's capacity (requests, or tokens per minute); 0: no such limit.
	Limit int64
	// Remaining is what could still be taken now.
	Remaining int64
	// Reset is the time until the bucket is full again.
	Reset time.Duration
}

// Decision is the outcome of Check.
type Decision struct {
	// Limited says the tenant has limits; nothing else is set when it does not.
	Limited bool
	// Allowed says the request may run.
	Allowed bool
	// Bucket is the tenant's bucket: its name, or config.DefaultBucket.
	Bucket string
	// Source is where the decision came from (Source*).
	Source string
	// Refused names the limit that refused the request (Limit*), "" when allowed.
	Refused string
	// Requests and Tokens are the windows after the check.
	Requests, Tokens Window
	// RetryAfter is when a refused request could pass.
	RetryAfter time.Duration
	// Requested are the tokens the request asked for (its estimate, at most the limit);
	// Reserved those it took up front (what Settle corrects: 0 when refused or unchecked).
	Requested, Reserved int64
	// Objective is the tenant's objective ("" when none).
	Objective string

	// What Settle needs, as they were at the check: the bucket's limits, its Redis client and
	// keys (SourceRedis) or its local bucket (SourceLocal), and the Redis timeout. A reload
	// between the check and the settle does not move the settle to the new block's Redis.
	limits  config.TenantLimits
	client  *redis.Client
	keys    []string
	local   *localBucket
	timeout time.Duration
}

// Limiter checks requests against the rate_limit block of the configuration each request runs
// with; a reload that changes the block takes effect with the next request (a new Redis
// client when the Redis settings changed, fresh local buckets). It is safe for concurrent use.
type Limiter struct {
	log    logr.Logger
	getenv func(string) string
	now    func() time.Time

	mu     sync.Mutex
	cfg    *config.RateLimit // the block client and local belong to
	client *redis.Client
	local  map[string]*localBucket

	// unavailableUntil (Unix nanoseconds) is when the check tries Redis again after an error.
	unavailableUntil atomic.Int64

	decisions   *prometheus.CounterVec
	limited     *prometheus.CounterVec
	redisErrors *prometheus.CounterVec
}

// New returns a limiter; getenv reads rate_limit.password_env (nil: the process environment).
func New(log logr.Logger, getenv func(string) string) *Limiter {
	if log.GetSink() == nil {
		log = logr.Discard()
	}
	return &Limiter{log: log, getenv: getenv, now: time.Now,
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "coordinator", Name: "ratelimit_decisions_total",
			Help: "Rate-limit checks of limited tenants by decision (allowed, limited) and source (redis; local, open, closed: the on_redis_failure fallback while Redis failed)."},
			[]string{"decision", "source"}),
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "coordinator", Name: "ratelimit_limited_total",
			Help: "Requests refused by the rate limit, by tenant bucket (a rate_limit.tenants name, or * for the others) and limit (requests, tokens, unavailable)."},
			[]string{"tenant", "limit"}),
		redisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "coordinator", Name: "ratelimit_redis_errors_total",
			Help: "Failed or timed-out Redis calls of the rate limiter, by operation (check, settle)."},
			[]string{"op"}),
	}
}

// Collectors are the limiter's metrics, for the caller to register.
func (l *Limiter) Collectors() []prometheus.Collector {
	return []prometheus.Collector{l.decisions, l.limited, l.redisErrors}
}

// Close releases the Redis client.
func (l *Limiter) Close() {
	l.mu.Lock()
	c := l.client
	l.client, l.cfg, l.local = nil, nil, nil
	l.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

// Check takes one request and tokens (the prompt's estimated tokens, at most the tenant's
// tokens per minute) from tenant's buckets under cfg, unless a bucket has not enough left.
func (l *Limiter) Check(ctx context.Context, cfg *config.RateLimit, tenant string, tokens int64) Decision {
	bucket, limits, objective := cfg.Lookup(tenant)
	if !limits.Limited() {
		return Decision{Allowed: true, Bucket: bucket, Objective: objective}
	}
	p := newParams(limits, tokens)
	d := Decision{Limited: true, Bucket: bucket, Objective: objective, Requested: p.cost, Reserved: p.cost,
		limits: limits, keys: keys(cfg, bucket), timeout: cfg.Timeout()}
	client, local := l.state(cfg)
	var res result
	if !l.mayTryRedis(cfg.Timeout()) {
		d.Source, d.local = l.fallback(cfg, local, bucket, p, &res)
	} else {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.Timeout())
		vals, err := checkScript.Run(rctx, client, d.keys, p.reqInterval, p.reqTolerance, p.tokInterval, p.tokTolerance, p.cost).Int64Slice()
		cancel()
		switch {
		case err == nil && len(vals) == 5:
			l.unavailableUntil.Store(0)
			d.Source, d.client = SourceRedis, client
			res = result{allowed: vals[0] == 1, reqDebt: float64(vals[1]), tokDebt: float64(vals[2]), reqWait: float64(vals[3]), tokWait: float64(vals[4])}
		case errors.Is(err, redis.ErrClosed):
			// A reload replaced the client under this check: Redis itself is fine.
			d.Source, d.local = l.fallback(cfg, local, bucket, p, &res)
		default:
			l.unavailable("check", cfg, err)
			d.Source, d.local = l.fallback(cfg, local, bucket, p, &res)
		}
	}
	switch d.Source {
	case SourceOpen:
		d.Allowed, d.Reserved = true, 0
		l.decisions.WithLabelValues("allowed", d.Source).Inc()
		return d
	case SourceClosed:
		d.Refused, d.RetryAfter, d.Reserved = LimitUnavailable, unavailableFor, 0
		l.decisions.WithLabelValues("limited", d.Source).Inc()
		l.limited.WithLabelValues(bucket, LimitUnavailable).Inc()
		return d
	}
	d.Allowed = res.allowed
	d.Requests = p.window(limits.RequestsPerSecond > 0, p.reqBurst, res.reqDebt, p.reqInterval, p.reqTolerance)
	d.Tokens = p.window(limits.TokensPerMinute > 0, limits.TokensPerMinute, res.tokDebt, p.tokInterval, p.tokTolerance)
	if d.Allowed {
		l.decisions.WithLabelValues("allowed", d.Source).Inc()
		return d
	}
	d.Reserved = 0
	d.Refused = LimitRequests
	wait := res.reqWait
	if res.tokWait > res.reqWait {
		d.Refused, wait = LimitTokens, res.tokWait
	}
	d.RetryAfter = usDuration(wait)
	l.decisions.WithLabelValues("limited", d.Source).Inc()
	l.limited.WithLabelValues(bucket, d.Refused).Inc()
	return d
}

// Settle corrects the tokens d reserved to used, the answer's prompt plus completion tokens
// (the reserve is returned when used is 0: the request failed before a worker served it). It
// is a no-op for a request that reserved nothing and has no token limit.
//
// It settles where the check took: the same Redis client and keys, or the same local bucket,
// even across a reload (one that moved to another Redis closed the check's client: that settle
// is dropped, the old server's buckets deciding nothing any more). While Redis is marked unavailable (a check or a settle failed within the
// last second) a Redis settle is skipped and the reservation stands, so that a hanging Redis
// does not hold every answer's end for the timeout.
func (l *Limiter) Settle(ctx context.Context, d Decision, used int64) {
	if !d.Allowed || d.limits.TokensPerMinute <= 0 || used == d.Reserved || used < 0 {
		return
	}
	delta := used - d.Reserved
	p := newParams(d.limits, 0)
	switch d.Source {
	case SourceLocal:
		l.mu.Lock()
		d.local.settle(float64(l.now().UnixMicro()), p.tokInterval, delta)
		l.mu.Unlock()
	case SourceRedis:
		if l.now().UnixNano() < l.unavailableUntil.Load() {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.timeout)
		defer cancel()
		err := settleScript.Run(rctx, d.client, d.keys[1:], p.tokInterval, delta).Err()
		switch {
		case err == nil, errors.Is(err, redis.ErrClosed): // closed by a reload: the reservation stands
		default:
			l.unavailable("settle", nil, err)
		}
	}
}

// mayTryRedis says whether a check may call Redis: always while it answers; after a failure,
// once unavailableFor has passed, only one check at a time (the others take the fallback until
// it succeeds or the window starts again), so that a hanging Redis costs one timeout per
// window, not one per request.
func (l *Limiter) mayTryRedis(timeout time.Duration) bool {
	until := l.unavailableUntil.Load()
	if until == 0 {
		return true
	}
	now := l.now().UnixNano()
	return now >= until && l.unavailableUntil.CompareAndSwap(until, now+int64(timeout)+1)
}

// unavailable marks Redis unavailable for unavailableFor after op failed with err.
func (l *Limiter) unavailable(op string, cfg *config.RateLimit, err error) {
	l.unavailableUntil.Store(l.now().Add(unavailableFor).UnixNano())
	l.redisErrors.WithLabelValues(op).Inc()
	if cfg != nil {
		l.log.V(logging.Warn).Info("rate limit: Redis unavailable; using the fallback for a second", "on_redis_failure", cfg.OnRedisFailure, "err", errString(err))
		return
	}
	l.log.V(logging.Verbose).Info("rate limit: Redis unavailable; the reservation stands", "op", op, "err", errString(err))
}

// state returns the Redis client and local buckets of cfg, replacing those of an older block.
func (l *Limiter) state(cfg *config.RateLimit) (*redis.Client, map[string]*localBucket) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.client != nil && (l.cfg == cfg || reflect.DeepEqual(*l.cfg, *cfg)) {
		l.cfg = cfg // a reload that left the block as it was keeps the client and local buckets
		return l.client, l.local
	}
	if l.cfg != nil && l.client != nil && sameRedis(l.cfg, cfg) {
		l.cfg, l.local = cfg, map[string]*localBucket{}
		return l.client, l.local
	}
	if l.client != nil {
		_ = l.client.Close()
	}
	opts, err := redis.ParseURL(cfg.RedisURL)
	if err != nil { // the configuration's validation follows go-redis's: a client that fails fast
		opts = &redis.Options{Addr: "invalid.invalid:0"}
	}
	l.cfg, l.local = cfg, map[string]*localBucket{}
	redisclient.UseLogger(l.log)
	o := redisclient.Options(opts, cfg.PasswordEnv, l.getenv, cfg.Timeout(), redisClientName)
	// No retries: neither script is idempotent (a reply lost after the script ran would take or
	// settle twice); a failed call takes the fallback instead.
	o.MaxRetries = -1
	l.client = redis.NewClient(o)
	return l.client, l.local
}

func sameRedis(a, b *config.RateLimit) bool {
	return a.RedisURL == b.RedisURL && a.PasswordEnv == b.PasswordEnv && a.Timeout() == b.Timeout()
}

// fallback decides while Redis is unavailable, by cfg.OnRedisFailure.
func (l *Limiter) fallback(cfg *config.RateLimit, local map[string]*localBucket, bucket string, p params, res *result) (string, *localBucket) {
	switch cfg.OnRedisFailure {
	case config.RedisFailureOpen:
		return SourceOpen, nil
	case config.RedisFailureClosed:
		return SourceClosed, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b := local[bucket]
	if b == nil { // at most one per bucket of the configuration
		b = &localBucket{}
		local[bucket] = b
	}
	*res = b.check(float64(l.now().UnixMicro()), p)
	return SourceLocal, b
}

// keys are the bucket's Redis keys: requests, then tokens (one Redis server: the client does
// not follow Redis Cluster redirects).
func keys(cfg *config.RateLimit, bucket string) []string {
	k := cfg.KeyPrefix + "{" + bucket + "}:"
	return []string{k + "r", k + "t"}
}

// params are a check's script arguments, in microseconds: the emission interval of one request
// or token, each bucket's tolerance (its capacity in time), and the tokens taken.
type params struct {
	reqInterval, reqTolerance float64
	tokInterval, tokTolerance float64
	reqBurst                  int64
	cost                      int64
}

func newParams(l config.TenantLimits, tokens int64) params {
	var p params
	if r := l.RequestsPerSecond; r > 0 {
		p.reqBurst = max(1, int64(math.Floor(r)))
		p.reqInterval = usPerSecond / r
		// 1 µs of slack: now is ~1.7e15 µs, where a float64 steps by a quarter µs, so the sums
		// below round; without it a burst of 1 could be refused on an empty bucket and the
		// remaining count read one low.
		p.reqTolerance = p.reqInterval*float64(p.reqBurst) + toleranceSlack
	}
	if t := l.TokensPerMinute; t > 0 {
		p.tokInterval = usPerMinute / float64(t)
		p.tokTolerance = usPerMinute + toleranceSlack
		p.cost = min(max(tokens, 0), t)
	}
	return p
}

// window is a limit's state after a check that left debt microseconds of it taken.
func (params) window(on bool, limit int64, debt, interval, tolerance float64) Window {
	if !on {
		return Window{}
	}
	rem := int64(math.Floor((tolerance - debt) / interval))
	return Window{Limit: limit, Remaining: min(max(rem, 0), limit), Reset: usDuration(debt)}
}

// result is what a check found: whether it took, each bucket's debt after it (microseconds
// until full) and the wait each would need.
type result struct {
	allowed          bool
	reqDebt, tokDebt float64
	reqWait, tokWait float64
}

// localBucket is one bucket's theoretical arrival times in this process (Unix microseconds).
type localBucket struct {
	reqTAT, tokTAT float64
}

// check is checkScript's logic on the local bucket.
func (b *localBucket) check(now float64, p params) result {
	var r result
	rtat, ttat := max(b.reqTAT, now), max(b.tokTAT, now)
	rnew, tnew := rtat, ttat
	if p.reqInterval > 0 {
		rnew = rtat + p.reqInterval
		r.reqWait = max(rnew-now-p.reqTolerance, 0)
	}
	if p.tokInterval > 0 {
		tnew = ttat + p.tokInterval*float64(p.cost)
		r.tokWait = max(tnew-now-p.tokTolerance, 0)
	}
	if r.reqWait == 0 && r.tokWait == 0 {
		r.allowed = true
		rtat, ttat = rnew, tnew
		b.reqTAT, b.tokTAT = rtat, ttat
	}
	r.reqDebt, r.tokDebt = rtat-now, ttat-now
	return r
}

func (b *localBucket) settle(now, interval float64, delta int64) {
	b.tokTAT = max(max(b.tokTAT, now)+interval*float64(delta), now)
}

func usDuration(us float64) time.Duration {
	return time.Duration(math.Ceil(us)) * time.Microsecond
}

func errString(err error) string {
	if err == nil {
		return "unexpected reply"
	}
	return err.Error()
}

// checkScript takes one request and ARGV[5] tokens from a tenant's buckets if both have room,
// on Redis's clock (microseconds). A limit whose interval is 0 is off.
//
//	KEYS: requests TAT, tokens TAT
//	ARGV: request interval, request tolerance, token interval, token tolerance, tokens
//	returns {allowed (1|0), request debt, token debt, request wait, token wait} (microseconds)
var checkScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ri, rt = tonumber(ARGV[1]), tonumber(ARGV[2])
local ti, tt, cost = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local rtat, ttat = now, now
local rnew, tnew = now, now
local rwait, twait = 0, 0
if ri > 0 then
  rtat = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), now)
  rnew = rtat + ri
  rwait = math.max(rnew - now - rt, 0)
end
if ti > 0 then
  ttat = math.max(tonumber(redis.call('GET', KEYS[2]) or '0'), now)
  tnew = ttat + ti * cost
  twait = math.max(tnew - now - tt, 0)
end
local ok = 0
if rwait == 0 and twait == 0 then
  ok = 1
  if ri > 0 then
    rtat = rnew
    redis.call('SET', KEYS[1], string.format('%.0f', rtat), 'PX', math.ceil((rtat - now) / 1000) + 1)
  end
  if ti > 0 and tnew > now then
    ttat = tnew
    redis.call('SET', KEYS[2], string.format('%.0f', ttat), 'PX', math.ceil((ttat - now) / 1000) + 1)
  end
end
return {ok, math.ceil(rtat - now), math.ceil(ttat - now), math.ceil(rwait), math.ceil(twait)}
`)

// settleScript adds ARGV[2] tokens (negative: gives them back) to a tenant's token bucket; a
// bucket that is full again is deleted.
//
//	KEYS: tokens TAT
//	ARGV: token interval, tokens
var settleScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), now) + tonumber(ARGV[1]) * tonumber(ARGV[2])
if tat <= now then
  redis.call('DEL', KEYS[1])
  return 0
end
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
return 1
`)

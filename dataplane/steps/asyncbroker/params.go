package asyncbroker

import (
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/epd-dev/coordinator/dataplane/config"
	"github.com/epd-dev/coordinator/dataplane/pipeline/params"
)

// Param names and defaults (docs/async-broker.md documents each).
const (
	DefaultModeHeader      = "X-AP-Mode"
	DefaultTenantHeader    = "X-Team"
	DefaultTimeoutHeader   = "X-Request-Timeout-Seconds"
	DefaultObjectiveHeader = "x-gateway-inference-objective"
	DefaultFairnessHeader  = "x-gateway-inference-fairness-id"
	DefaultTenant          = "default"
	DefaultTier            = "default"
	DefaultQuotaPrefix     = "quota:"
	DefaultQuotaAttribute  = "userid"

	defaultRedisTimeout    = 2 * time.Second
	defaultQuotaTimeout    = 250 * time.Millisecond
	defaultQuotaWindow     = 300
	defaultWaitSeconds     = 60
	defaultWaitMaxSeconds  = 3600
	defaultEnqueueSeconds  = 3600
	defaultFetchGraceSecs  = 60
	maxTenantLen           = 256
	wakeupAuto             = "auto"
	wakeupNotify           = "notify"
	wakeupPoll             = "poll"
	wildcard               = "*"
	redisClientNamePrefix  = "coordinator-async-broker"
	defaultRedisMaxRetries = 2
)

// DefaultForwardHeaders are the client headers copied into the envelope when forward_headers is
// not set: the SLO hints the scheduler reads.
var DefaultForwardHeaders = []string{"x-slo-ttft-ms", "x-slo-tpot-ms"}

// timeoutSpec is one mode's deadline policy.
type timeoutSpec struct {
	def time.Duration
	max time.Duration // 0: no clamp
}

// route sends matching requests to a queue (enqueue, wait) and a tier (passthrough objectives).
type route struct {
	model, tenant, queue, tier string
}

func (r route) matches(model, tenant string) bool {
	return (r.model == "" || r.model == wildcard || r.model == model) &&
		(r.tenant == "" || r.tenant == wildcard || r.tenant == tenant)
}

// objective names the InferenceObjectives of a tier.
type objective struct {
	reserved, overflow string
}

// quotaSpec is the per-tenant reservation accounting of passthrough requests.
type quotaSpec struct {
	prefix, attribute string
	// limits maps a tenant (or "*", any other tenant) to its concurrent reserved slots.
	limits  map[string]int
	window  time.Duration
	timeout time.Duration
}

// limit returns the tenant's slot limit, if it has one.
func (q quotaSpec) limit(tenant string) (int, bool) {
	if n, ok := q.limits[tenant]; ok {
		return n, true
	}
	n, ok := q.limits[wildcard]
	return n, ok
}

// key is the tenant's counter: <prefix><attribute>:<tenant>.
func (q quotaSpec) key(tenant string) string { return q.prefix + q.attribute + ":" + tenant }

// settings are the validated params.
type settings struct {
	redisOpts    *redis.Options
	passwordEnv  string
	redisTimeout time.Duration

	modeHeader, tenantHeader, timeoutHeader string
	objectiveHeader, fairnessHeader         string

	enqueue, wait timeoutSpec
	waitCap       time.Duration // 0: hold until the deadline
	fetchGrace    time.Duration // 0: delete on fetch

	routes       []route
	defaultQueue string
	defaultTier  string
	objectives   map[string]objective
	quota        quotaSpec
	forward      []string // canonical header names
	wakeup       string
	serveModels  bool
}

// route returns the first matching route, or the defaults.
func (s *settings) route(model, tenant string) route {
	for _, r := range s.routes {
		if r.matches(model, tenant) {
			return r
		}
	}
	return route{queue: s.defaultQueue, tier: s.defaultTier}
}

// parser collects the first error of nested params blocks (the step's own block reports through
// params.Params).
type parser struct {
	err error
}

func (ps *parser) check(c *params.Params) {
	if err := c.Err(); err != nil && ps.err == nil {
		ps.err = err
	}
}

// object opens the mapping param name of p as a nested params block (nil when absent or invalid).
func (ps *parser) object(p *params.Params, name string) *params.Params {
	v, ok := p.Value(name)
	if !ok {
		return nil
	}
	m, isMap := v.(map[string]any)
	if !isMap {
		p.Fail(name, "must be a mapping, got %T", v)
		return nil
	}
	return params.New(p.Key(name), m, nil)
}

// parseSettings reads and validates every param. It does no I/O.
func parseSettings(p *params.Params) (*settings, error) {
	ps := &parser{}
	s := &settings{}

	rawURL := p.String("redis_url", "")
	switch {
	case rawURL == "":
		p.Fail("redis_url", "is required (e.g. redis://redis:6379/0)")
	default:
		opts, err := redis.ParseURL(rawURL)
		if err != nil {
			p.Fail("redis_url", "%v", err)
		} else {
			s.redisOpts = opts
		}
		p.Redact("redis_url", redactURL(rawURL))
	}
	s.passwordEnv = p.String("redis_password_env", "")
	s.redisTimeout = p.Duration("redis_timeout", defaultRedisTimeout)

	s.modeHeader = headerParam(p, "mode_header", DefaultModeHeader)
	s.tenantHeader = headerParam(p, "tenant_header", DefaultTenantHeader)
	s.timeoutHeader = headerParam(p, "timeout_header", DefaultTimeoutHeader)
	s.objectiveHeader = headerParam(p, "objective_header", DefaultObjectiveHeader)
	s.fairnessHeader = headerParam(p, "fairness_header", DefaultFairnessHeader)

	s.enqueue = timeoutSpec{def: defaultEnqueueSeconds * time.Second}
	s.wait = timeoutSpec{def: defaultWaitSeconds * time.Second, max: defaultWaitMaxSeconds * time.Second}
	if t := ps.object(p, "timeouts"); t != nil {
		if e := ps.object(t, "enqueue"); e != nil {
			s.enqueue = parseTimeout(e, s.enqueue, 0)
			ps.check(e)
		}
		if w := ps.object(t, "wait"); w != nil {
			s.wait = parseTimeout(w, s.wait, defaultWaitMaxSeconds*time.Second)
			ps.check(w)
		}
		ps.check(t)
	}
	s.waitCap = time.Duration(p.Int("wait_cap_seconds", 0, 0)) * time.Second
	s.fetchGrace = time.Duration(p.Int("fetch_grace_seconds", defaultFetchGraceSecs, 0)) * time.Second

	s.defaultQueue = p.String("default_queue", DefaultQueue)
	if strings.TrimSpace(s.defaultQueue) == "" {
		p.Fail("default_queue", "must not be empty")
	}
	s.defaultTier = p.String("default_tier", DefaultTier)

	s.objectives = map[string]objective{}
	if o := ps.object(p, "objectives"); o != nil {
		for _, tier := range sortedKeys(p, "objectives") {
			t := ps.object(o, tier)
			if t == nil {
				continue
			}
			obj := objective{reserved: t.String("reserved", ""), overflow: t.String("overflow", "")}
			ps.check(t) // a misspelt key first: it explains a missing objective
			if obj.reserved == "" && obj.overflow == "" && ps.err == nil {
				ps.err = &config.FieldError{Key: t.Key("reserved"), Reason: "a tier needs a reserved or an overflow objective"}
			}
			s.objectives[tier] = obj
		}
		ps.check(o)
	}
	checkTier := func(c *params.Params, name, tier string) {
		if len(s.objectives) > 0 {
			if _, ok := s.objectives[tier]; !ok {
				c.Fail(name, "tier %q has no entry in objectives (known: %s)", tier, strings.Join(mapKeys(s.objectives), ", "))
			}
		}
	}
	checkTier(p, "default_tier", s.defaultTier)

	if v, ok := p.Value("routes"); ok {
		items, isList := v.([]any)
		if !isList {
			p.Fail("routes", "must be a list of {model, tenant, queue, tier}, got %T", v)
		}
		for i, it := range items {
			m, isMap := it.(map[string]any)
			key := fmt.Sprintf("%s[%d]", p.Key("routes"), i)
			if !isMap {
				if ps.err == nil {
					ps.err = &config.FieldError{Key: key, Reason: fmt.Sprintf("must be a mapping, got %T", it)}
				}
				continue
			}
			c := params.New(key, m, nil)
			r := route{
				model:  c.String("model", ""),
				tenant: c.String("tenant", ""),
				queue:  c.String("queue", s.defaultQueue),
				tier:   c.String("tier", s.defaultTier),
			}
			if strings.Contains(r.tenant, ":") {
				c.Fail("tenant", "must not contain ':' (it separates tenant and id in Redis keys)")
			}
			if strings.TrimSpace(r.queue) == "" {
				c.Fail("queue", "must not be empty")
			}
			checkTier(c, "tier", r.tier)
			ps.check(c)
			s.routes = append(s.routes, r)
		}
	}

	s.quota = quotaSpec{prefix: DefaultQuotaPrefix, attribute: DefaultQuotaAttribute, window: defaultQuotaWindow * time.Second, timeout: defaultQuotaTimeout}
	if q := ps.object(p, "quota"); q != nil {
		s.quota.prefix = q.String("prefix", DefaultQuotaPrefix)
		s.quota.attribute = q.String("attribute", DefaultQuotaAttribute)
		if s.quota.attribute == "" {
			q.Fail("attribute", "must not be empty")
		}
		s.quota.window = time.Duration(q.Int("window_seconds", defaultQuotaWindow, 1)) * time.Second
		s.quota.timeout = q.Duration("timeout", defaultQuotaTimeout)
		if l := ps.object(q, "limits"); l != nil {
			s.quota.limits = map[string]int{}
			for _, tenant := range sortedKeys(q, "limits") {
				n := l.Int(tenant, 0, 0)
				if strings.Contains(tenant, ":") {
					l.Fail(tenant, "a tenant must not contain ':'")
				}
				s.quota.limits[tenant] = n
			}
			ps.check(l)
		}
		ps.check(q)
	}

	s.forward = nil
	fwd := DefaultForwardHeaders
	if p.Has("forward_headers") {
		fwd = p.StringList("forward_headers")
	} else {
		p.StringList("forward_headers")
		p.Redact("forward_headers", DefaultForwardHeaders) // show the default in Effective
	}
	reserved := map[string]string{
		http.CanonicalHeaderKey(s.modeHeader):      "mode_header",
		http.CanonicalHeaderKey(s.objectiveHeader): "objective_header",
		http.CanonicalHeaderKey(s.fairnessHeader):  "fairness_header",
	}
	for _, h := range fwd {
		if !validHeaderName(h) {
			p.Fail("forward_headers", "%q is not a valid header name", h)
			continue
		}
		if what, bad := reserved[http.CanonicalHeaderKey(h)]; bad {
			p.Fail("forward_headers", "must not include %s (the %s): the consumer sets it", h, what)
			continue
		}
		s.forward = append(s.forward, http.CanonicalHeaderKey(h))
	}

	s.wakeup = strings.ToLower(p.String("wakeup_mode", wakeupAuto))
	switch s.wakeup {
	case wakeupAuto, wakeupNotify, wakeupPoll:
	default:
		p.Fail("wakeup_mode", "must be auto, notify or poll, got %q", s.wakeup)
	}
	s.serveModels = p.Bool("serve_models", false)

	if ps.err != nil {
		return nil, ps.err
	}
	return s, nil
}

// parseTimeout reads {default_seconds, max_seconds}. defMax, when not zero, is the clamp used
// when max_seconds is not set (raised to the default when the default is higher).
func parseTimeout(c *params.Params, base timeoutSpec, defMax time.Duration) timeoutSpec {
	def := time.Duration(c.Int("default_seconds", int(base.def/time.Second), 1)) * time.Second
	maxSet := c.Has("max_seconds")
	mx := time.Duration(c.Int("max_seconds", int(base.max/time.Second), 0)) * time.Second
	switch {
	case !maxSet && defMax > 0:
		mx = max(defMax, def)
	case maxSet && mx > 0 && def > mx:
		c.Fail("default_seconds", "%d is above max_seconds %d", def/time.Second, mx/time.Second)
	}
	return timeoutSpec{def: def, max: mx}
}

// headerParam reads a header-name param.
func headerParam(p *params.Params, name, def string) string {
	h := p.String(name, def)
	if !validHeaderName(h) {
		p.Fail(name, "%q is not a valid header name", h)
		return def
	}
	return h
}

// validHeaderName reports an RFC 9110 token.
func validHeaderName(h string) bool {
	if h == "" {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// sortedKeys lists the keys of the mapping param name of p (already validated as a mapping).
func sortedKeys(p *params.Params, name string) []string {
	v, _ := p.Value(name)
	m, _ := v.(map[string]any)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func mapKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// redactURL masks the password of a Redis URL for /debug/pipeline.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable)"
	}
	return u.Redacted()
}

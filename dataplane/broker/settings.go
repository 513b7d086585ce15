package broker

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/params"
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

	// DefaultQueue is the request sorted set when no route names another.
	DefaultQueue = "request-sortedset"

	defaultRedisTimeout   = 2 * time.Second
	defaultQuotaTimeout   = 250 * time.Millisecond
	defaultQuotaWindow    = 300
	defaultWaitSeconds    = 60
	defaultWaitMaxSeconds = 3600
	defaultEnqueueSeconds = 3600
	defaultFetchGraceSecs = 60
	maxTenantLen          = 256
	wildcard              = "*"
)

// Wake-up modes of waiters (wakeup_mode).
const (
	WakeupAuto   = "auto"
	WakeupNotify = "notify"
	WakeupPoll   = "poll"
)

// DefaultForwardHeaders are the client headers copied into the envelope when forward_headers is
// not set: the SLO hints the scheduler reads.
var DefaultForwardHeaders = []string{"x-slo-ttft-ms", "x-slo-tpot-ms"}

// Timeouts is one mode's deadline policy.
type Timeouts struct {
	// Default is the budget of a request without the timeout header.
	Default time.Duration
	// Max clamps the budget; 0 means no clamp.
	Max time.Duration
}

// Route sends matching requests to a queue (enqueue, wait) and a tier (passthrough objectives).
// An empty or "*" Model or Tenant matches any.
type Route struct {
	Model, Tenant, Queue, Tier string
}

// Matches reports whether the route applies to a model and tenant.
func (r Route) Matches(model, tenant string) bool {
	return (r.Model == "" || r.Model == wildcard || r.Model == model) &&
		(r.Tenant == "" || r.Tenant == wildcard || r.Tenant == tenant)
}

// Objective names the InferenceObjectives of a tier, by quota class.
type Objective struct {
	Reserved, Overflow string
}

// Quota is the per-tenant reservation accounting of passthrough requests.
type Quota struct {
	// Prefix and Attribute name the counter key, <prefix><attribute>:<tenant>; Attribute is also
	// the envelope's metadata key for the tenant.
	Prefix, Attribute string
	// Limits maps a tenant (or "*", any other tenant) to its concurrent reserved slots.
	Limits map[string]int
	// Window is the counter's TTL; Timeout bounds the quota call of a passthrough request.
	Window  time.Duration
	Timeout time.Duration
}

// Limit returns the tenant's slot limit, if it has one.
func (q Quota) Limit(tenant string) (int, bool) {
	if n, ok := q.Limits[tenant]; ok {
		return n, true
	}
	n, ok := q.Limits[wildcard]
	return n, ok
}

// Key is the tenant's counter: <prefix><attribute>:<tenant>.
func (q Quota) Key(tenant string) string { return q.Prefix + q.Attribute + ":" + tenant }

// Settings are the step's validated params (docs/async-broker.md documents each). They are what
// the broker runtime is built from.
type Settings struct {
	// RedisURL was checked to be a URL go-redis accepts; PasswordEnv names the environment
	// variable that overrides its password; RedisTimeout bounds every Redis call of the queued
	// modes and the routes.
	RedisURL     string
	PasswordEnv  string
	RedisTimeout time.Duration

	ModeHeader, TenantHeader, TimeoutHeader string
	ObjectiveHeader, FairnessHeader         string

	Enqueue, Wait Timeouts
	WaitCap       time.Duration // 0: hold until the deadline
	FetchGrace    time.Duration // 0: delete on fetch

	Routes       []Route
	DefaultQueue string
	DefaultTier  string
	Objectives   map[string]Objective
	Quota        Quota
	Forward      []string // canonical header names
	Wakeup       string   // WakeupAuto, WakeupNotify or WakeupPoll
	ServeModels  bool
}

// Route returns the first matching route, or the defaults.
func (s *Settings) Route(model, tenant string) Route {
	for _, r := range s.Routes {
		if r.Matches(model, tenant) {
			return r
		}
	}
	return Route{Queue: s.DefaultQueue, Tier: s.DefaultTier}
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

// ParseSettings reads and validates every param. It does no I/O and needs no Redis client.
func ParseSettings(p *params.Params) (*Settings, error) {
	ps := &parser{}
	s := &Settings{}

	rawURL := p.String("redis_url", "")
	if rawURL == "" {
		p.Fail("redis_url", "is required (e.g. redis://redis:6379/0)")
	} else {
		if err := CheckRedisURL(rawURL); err != nil {
			p.Fail("redis_url", "%v", err)
		}
		s.RedisURL = rawURL
		p.Redact("redis_url", redactURL(rawURL))
	}
	s.PasswordEnv = p.String("redis_password_env", "")
	s.RedisTimeout = p.Duration("redis_timeout", defaultRedisTimeout)

	s.ModeHeader = headerParam(p, "mode_header", DefaultModeHeader)
	s.TenantHeader = headerParam(p, "tenant_header", DefaultTenantHeader)
	s.TimeoutHeader = headerParam(p, "timeout_header", DefaultTimeoutHeader)
	s.ObjectiveHeader = headerParam(p, "objective_header", DefaultObjectiveHeader)
	s.FairnessHeader = headerParam(p, "fairness_header", DefaultFairnessHeader)

	s.Enqueue = Timeouts{Default: defaultEnqueueSeconds * time.Second}
	s.Wait = Timeouts{Default: defaultWaitSeconds * time.Second, Max: defaultWaitMaxSeconds * time.Second}
	if t := ps.object(p, "timeouts"); t != nil {
		if e := ps.object(t, "enqueue"); e != nil {
			s.Enqueue = parseTimeout(e, s.Enqueue, 0)
			ps.check(e)
		}
		if w := ps.object(t, "wait"); w != nil {
			s.Wait = parseTimeout(w, s.Wait, defaultWaitMaxSeconds*time.Second)
			ps.check(w)
		}
		ps.check(t)
	}
	s.WaitCap = time.Duration(p.Int("wait_cap_seconds", 0, 0)) * time.Second
	s.FetchGrace = time.Duration(p.Int("fetch_grace_seconds", defaultFetchGraceSecs, 0)) * time.Second

	s.DefaultQueue = p.String("default_queue", DefaultQueue)
	if strings.TrimSpace(s.DefaultQueue) == "" {
		p.Fail("default_queue", "must not be empty")
	}
	s.DefaultTier = p.String("default_tier", DefaultTier)

	s.Objectives = map[string]Objective{}
	if o := ps.object(p, "objectives"); o != nil {
		for _, tier := range sortedKeys(p, "objectives") {
			t := ps.object(o, tier)
			if t == nil {
				continue
			}
			obj := Objective{Reserved: t.String("reserved", ""), Overflow: t.String("overflow", "")}
			ps.check(t) // a misspelt key first: it explains a missing objective
			if obj.Reserved == "" && obj.Overflow == "" && ps.err == nil {
				ps.err = &config.FieldError{Key: t.Key("reserved"), Reason: "a tier needs a reserved or an overflow objective"}
			}
			s.Objectives[tier] = obj
		}
		ps.check(o)
	}
	checkTier := func(c *params.Params, name, tier string) {
		if len(s.Objectives) > 0 {
			if _, ok := s.Objectives[tier]; !ok {
				c.Fail(name, "tier %q has no entry in objectives (known: %s)", tier, strings.Join(mapKeys(s.Objectives), ", "))
			}
		}
	}
	checkTier(p, "default_tier", s.DefaultTier)

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
			r := Route{
				Model:  c.String("model", ""),
				Tenant: c.String("tenant", ""),
				Queue:  c.String("queue", s.DefaultQueue),
				Tier:   c.String("tier", s.DefaultTier),
			}
			if strings.Contains(r.Tenant, ":") {
				c.Fail("tenant", "must not contain ':' (it separates tenant and id in Redis keys)")
			}
			if strings.TrimSpace(r.Queue) == "" {
				c.Fail("queue", "must not be empty")
			}
			checkTier(c, "tier", r.Tier)
			ps.check(c)
			s.Routes = append(s.Routes, r)
		}
	}

	s.Quota = Quota{Prefix: DefaultQuotaPrefix, Attribute: DefaultQuotaAttribute, Window: defaultQuotaWindow * time.Second, Timeout: defaultQuotaTimeout}
	if q := ps.object(p, "quota"); q != nil {
		s.Quota.Prefix = q.String("prefix", DefaultQuotaPrefix)
		s.Quota.Attribute = q.String("attribute", DefaultQuotaAttribute)
		if s.Quota.Attribute == "" {
			q.Fail("attribute", "must not be empty")
		}
		s.Quota.Window = time.Duration(q.Int("window_seconds", defaultQuotaWindow, 1)) * time.Second
		s.Quota.Timeout = q.Duration("timeout", defaultQuotaTimeout)
		if l := ps.object(q, "limits"); l != nil {
			s.Quota.Limits = map[string]int{}
			for _, tenant := range sortedKeys(q, "limits") {
				n := l.Int(tenant, 0, 0)
				if strings.Contains(tenant, ":") {
					l.Fail(tenant, "a tenant must not contain ':'")
				}
				s.Quota.Limits[tenant] = n
			}
			ps.check(l)
		}
		ps.check(q)
	}

	fwd := DefaultForwardHeaders
	if p.Has("forward_headers") {
		fwd = p.StringList("forward_headers")
	} else {
		p.StringList("forward_headers")
		p.Redact("forward_headers", DefaultForwardHeaders) // show the default in Effective
	}
	reserved := map[string]string{
		http.CanonicalHeaderKey(s.ModeHeader):      "mode_header",
		http.CanonicalHeaderKey(s.ObjectiveHeader): "objective_header",
		http.CanonicalHeaderKey(s.FairnessHeader):  "fairness_header",
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
		s.Forward = append(s.Forward, http.CanonicalHeaderKey(h))
	}

	s.Wakeup = strings.ToLower(p.String("wakeup_mode", WakeupAuto))
	switch s.Wakeup {
	case WakeupAuto, WakeupNotify, WakeupPoll:
	default:
		p.Fail("wakeup_mode", "must be auto, notify or poll, got %q", s.Wakeup)
	}
	s.ServeModels = p.Bool("serve_models", false)

	if ps.err != nil {
		return nil, ps.err
	}
	return s, nil
}

// parseTimeout reads {default_seconds, max_seconds}. defMax, when not zero, is the clamp used
// when max_seconds is not set (raised to the default when the default is higher).
func parseTimeout(c *params.Params, base Timeouts, defMax time.Duration) Timeouts {
	def := time.Duration(c.Int("default_seconds", int(base.Default/time.Second), 1)) * time.Second
	maxSet := c.Has("max_seconds")
	mx := time.Duration(c.Int("max_seconds", int(base.Max/time.Second), 0)) * time.Second
	switch {
	case !maxSet && defMax > 0:
		mx = max(defMax, def)
	case maxSet && mx > 0 && def > mx:
		c.Fail("default_seconds", "%d is above max_seconds %d", def/time.Second, mx/time.Second)
	}
	return Timeouts{Default: def, Max: mx}
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

// Invalid is a request error in the broker's words: a 400 with the upstream code.
func Invalid(format string, args ...any) *apierror.Error {
	return &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest, Code: "INVALID_REQUEST", Message: fmt.Sprintf(format, args...)}
}

// Tenant reads the tenant header of h (DefaultTenant when absent).
func (s *Settings) Tenant(h http.Header) (string, *apierror.Error) {
	t := strings.TrimSpace(h.Get(s.TenantHeader))
	switch {
	case t == "":
		return DefaultTenant, nil
	case strings.Contains(t, ":"):
		return "", Invalid("%s must not contain ':'", s.TenantHeader)
	case len(t) > maxTenantLen:
		return "", Invalid("%s is longer than %d bytes", s.TenantHeader, maxTenantLen)
	}
	return t, nil
}

// Timeout is a request's time budget in mode (ModeEnqueue or ModeWait): the timeout header of h
// (positive whole seconds) or the mode's default, clamped to the mode's max_seconds.
func (s *Settings) Timeout(h http.Header, mode string) (time.Duration, error) {
	spec := s.Enqueue
	if mode == ModeWait {
		spec = s.Wait
	}
	d := spec.Default
	if v := strings.TrimSpace(h.Get(s.TimeoutHeader)); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 || n > 1<<31 {
			return 0, Invalid("%s must be a positive whole number of seconds, got %q", s.TimeoutHeader, Truncate(v, 32))
		}
		d = time.Duration(n) * time.Second
	}
	if spec.Max > 0 && d > spec.Max {
		d = spec.Max
	}
	return d, nil
}

// Models are the models the routes name, each once, in route order.
func (s *Settings) Models() []string {
	var out []string
	for _, r := range s.Routes {
		if r.Model != "" && r.Model != wildcard && !slices.Contains(out, r.Model) {
			out = append(out, r.Model)
		}
	}
	return out
}

// validID is the shape of a request id (the server's x-request-id rule).
var validID = regexp.MustCompile(`^[A-Za-z0-9-]{1,128}$`)

// ValidID reports whether id is a request id: 1 to 128 letters, digits or '-'.
func ValidID(id string) bool { return validID.MatchString(id) }

// Truncate cuts s to n bytes for a message, marking the cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

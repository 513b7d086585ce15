// Package gateway is a loopback stand-in for the Inference Gateway and its
// endpoint picker (EPP), for tests, benchmarks and demos of the coordinator.
//
// A Gateway routes each request to an InferencePool chosen by the
// EPP-Profile request header (or x-llm-d-epp-profile), picks a backend of
// that pool round-robin and reverse-proxies the request unchanged (method,
// path, query, headers, body), streaming responses through unbuffered so
// that server-sent events arrive as they are produced. Every leg is recorded.
//
// # Failures
//
// The gateway fails the way Envoy in front of an EPP does, so that a client's
// fault handling can be tested against several workers per role:
//
//   - Outlier detection. A backend whose connection fails (dial refused,
//     reset or EOF before the response headers), whose connection breaks
//     after the headers (Envoy counts a reset mid-response as a failure
//     too), or that misses the route timeout is ejected for Config.EjectFor
//     (default 30s, Envoy's base_ejection_time) once it has failed
//     Config.EjectAfter times in a row (default 1, so that one failure
//     shows; Envoy's consecutive_5xx, which counts such local-origin
//     failures, defaults to 5). Any response with headers
//     resets the count: answers with a status, even 5xx, are not failures
//     here. Picks skip ejected backends; an ejected backend comes back when
//     its time is up or on ClearEjections. At most Config.MaxEjectionPercent
//     of a pool's backends are ejected at once, and at least one (Envoy's
//     max_ejection_percent, default 10): a pool of two keeps one in rotation
//     whatever it does. Unlike Envoy, there is no panic threshold: when every
//     backend of a pool is ejected (a pool of one) the gateway answers 503
//     text/plain "no healthy upstream".
//   - A failed connection is answered 503 text/plain "upstream connect error
//     or disconnect/reset before headers. reset reason: connection failure"
//     (dial refused) or "... reset reason: connection termination" (reset or
//     EOF after connecting). A connection that breaks after the headers cuts
//     the client's response off (its connection is closed mid-body).
//   - Config.RouteTimeout bounds the wait for a backend's response headers:
//     past it the upstream request is cancelled and the client gets 504
//     text/plain "upstream request timeout" (Envoy's route timeout also
//     covers the body; here streams may run on).
//   - Config.MaxInFlight sheds load per pool as the EPP does when saturated:
//     429 with Retry-After (Config.RetryAfter, whole seconds, default 1) and
//     a JSON error of type InferencePoolResourceExhausted carrying the EPP's
//     message (the EPP itself sends that message as a plain body, without
//     Retry-After).
//   - Config.MaxRequestBodyBytes refuses larger bodies with 413 text/plain
//     "Payload Too Large" (Envoy's buffer limit) without proxying them.
//   - A profile without a pool gets 503 with a JSON error.
//
// # Prefix affinity and fallback endpoints
//
// With Config.PrefixAffinity the picker behaves as llm-d's EPP does with its
// approx-prefix-cache-producer and prefix-cache-scorer (llm-d-router
// ebab6879, run in test/suites/realepp): a request is routed to the backend
// a request of the same prompt (simworker.RequestPromptKey) was picked for
// before, and the pick is recorded before the request is forwarded, whatever
// the backend then does. The EPP learns of a dead pod only when its
// readiness flips (SetPool here): until then every retry of a prompt first
// sent to a dead backend goes back to it, and Envoy's outlier detection does
// not apply to a host the EPP names (ejection is off for such picks). A new
// prompt takes the next backend round-robin. With Config.Fallbacks > 0 the
// pick also names that many fallback endpoints, the next backends in pool
// order (the picker's maxNumOfEndpoints), and a connection that fails before
// response headers (refused, reset, closed) is tried on the next of them, as
// Envoy's override_host load balancing with the route's retry policy
// (retry_on: connect-failure,reset) does: the client sees the first answer
// with headers, and the leg records every endpoint tried (Leg.Tried).
//
// # Conditional decode in the picker
//
// With Config.EPPConditionalDecode the picker, not the worker, decides a
// decode-profile request with Prefer: if-available: it keeps, per decode
// backend, the prompt keys (simworker.RequestPromptKey) of the requests that
// backend answered 2xx, routes the request to a live backend holding its key
// (round-robin among them) with the Prefer header removed, so that the
// worker serves it, and answers 412 with a JSON error itself, contacting no
// worker, when none does. Keys are kept per pool (SetPool starts afresh), at
// most 65536 per backend, oldest forgotten first; an ejected backend's keys
// are forgotten (a worker that drops connections has usually restarted and
// lost its cache).
//
// # Endpoint pin
//
// As llm-d's endpoint-pin-screener, a request carrying PinHeader
// (x-llm-d-pin-host-port: ip:port, parsed with netip.ParseAddrPort) is
// routed only to the backend of its pool whose URL host is that ip:port and
// that is not ejected; the header is removed from the proxied request. The
// pin fails closed: when its value does not parse or no live backend of the
// pool matches, the gateway answers 503 with a JSON error ("...
// (rejected-no-endpoints)"), contacting no backend, and never falls back to
// another one. A pin narrows the candidates before anything else decides:
// a pinned conditional decode (Config.EPPConditionalDecode) is served only
// when the pinned backend holds its prompt, and is answered 412 otherwise.
//
// # Reserving an endpoint
//
// As llm-d's reserve-endpoint plugin, a request whose Prefer header carries
// the preference PreferReserveEndpoint (RFC 7240; the token is matched
// case-insensitively, its value and parameters ignored) is not forwarded:
// the gateway picks a backend of the pool as for any request (round-robin
// over the live ones, the pin honoured, shedding applied) and answers 204 No
// Content, without a body, with the backend's ip:port in ReservedHeader and
// Preference-Applied: reserve-endpoint. The request body is still read whole
// and must not be empty (the EPP schedules on it): an empty one is answered
// 400 with a JSON error before any pick. With Config.LegacyReserve the answer
// is the first EPP version's: 200, the ip:port in LegacyReservedHeader, no
// Preference-Applied. A reservation counts as a pick of its backend (Picks)
// but records no prompt key, as no backend served it.
//
// # Hints on a 412
//
// With Config.Hints (experimental, after the llm-d-router RFC #2178, and only
// together with Config.EPPConditionalDecode) a 412 the picker answers itself
// tells the client where the prompt could be computed: for every other
// profile with a live backend (e.g. prefill, encode) it carries
// HintHeader(profile) (X-Prefill-Host-Port, X-Encode-Host-Port) listing the
// ip:port of the pool's live backends, comma-separated, best first: those
// that hold the request's prompt key, then the others, each in pool order.
// To know them, the gateway then keeps prompt keys for the backends of every
// pool, not only decode, by the same rules.
package gateway

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/internal/loopback"
)

// Request headers that select the pool, in order of precedence.
const (
	ProfileHeader    = "EPP-Profile"
	AltProfileHeader = "X-Llm-D-Epp-Profile"
)

// RevisionHeader is llm-d's cross-phase revision header (Config.Revisions, Leg.Revision).
const RevisionHeader = "X-Llm-D-Disagg-Revision"

// DestinationHeader is set on proxied requests to the chosen backend's
// host:port, as the EPP does with x-gateway-destination-endpoint.
const DestinationHeader = "X-Gateway-Destination-Endpoint"

// PinHeader pins a request to the backend of its pool at an ip:port (llm-d's endpoint pin).
const PinHeader = "X-Llm-D-Pin-Host-Port"

// Reservations (llm-d's reserve-endpoint plugin).
const (
	// PreferReserveEndpoint is the Prefer preference that asks for a reservation.
	PreferReserveEndpoint = "reserve-endpoint"
	// ReservedHeader carries the reserved backend's ip:port on a 204.
	ReservedHeader = "X-Llm-D-Reserved-Host-Port"
	// LegacyReservedHeader carries it on the 200 of Config.LegacyReserve.
	LegacyReservedHeader = "X-Prefill-Host-Port"
)

// HintHeader returns the header of a 412 (Config.Hints) that lists the
// backends of profile's pool, e.g. X-Prefill-Host-Port for "prefill".
func HintHeader(profile string) string {
	return http.CanonicalHeaderKey("x-" + normalize(profile) + "-host-port")
}

// DecodeProfile is the profile whose requests Config.EPPConditionalDecode
// routes by prompt key.
const DecodeProfile = "decode"

// Defaults applied for zero Config fields.
const (
	DefaultEjectFor   = 30 * time.Second
	DefaultEjectAfter = 1
	// DefaultMaxEjectionPercent is Envoy's default max_ejection_percent.
	DefaultMaxEjectionPercent = 10
	DefaultRetryAfter         = time.Second
)

// The plain-text bodies of the answers the gateway makes itself, as Envoy words them.
const (
	BodyNoHealthyUpstream  = "no healthy upstream"
	BodyConnectFailure     = "upstream connect error or disconnect/reset before headers. reset reason: connection failure"
	BodyConnectTermination = "upstream connect error or disconnect/reset before headers. reset reason: connection termination"
	BodyRouteTimeout       = "upstream request timeout"
	BodyPayloadTooLarge    = "Payload Too Large"
)

// ShedMessage is the message of a 429 shedding answer (the EPP's error text).
const ShedMessage = "inference gateway: InferencePoolResourceExhausted - dropping request due to limited backend resources"

// maxKeysPerBackend bounds the prompt keys kept per decode backend.
const maxKeysPerBackend = 1 << 16

// Config configures a Gateway.
type Config struct {
	// Pools maps a profile name (matched case-insensitively) to the base URLs
	// of its backends.
	Pools map[string][]string
	// Addr is the listen address used by Start. Default: "127.0.0.1:0".
	Addr string
	// EjectFor is how long a failing backend is skipped (outlier detection).
	// Default: 30s; negative disables ejection.
	EjectFor time.Duration
	// Revisions maps a backend's base URL to the revision its answers carry in RevisionHeader
	// (llm-d's x-llm-d-disagg-revision), as the pods of a disaggregated set being rolled out do
	// (see also SetRevision).
	Revisions map[string]string
	// MaxEjectionPercent caps the share of a pool's backends ejected at once; at least one may
	// be, whatever the pool's size (Envoy's max_ejection_percent). Default: 10.
	MaxEjectionPercent int
	// EjectAfter is the number of consecutive failures that eject a backend.
	// Default: 1.
	EjectAfter int
	// MaxInFlight bounds the requests in flight per pool; more are shed with
	// 429. Default: 0, unlimited.
	MaxInFlight int
	// RetryAfter is the Retry-After of a shedding answer, sent in whole
	// seconds (at least 1). Default: 1s.
	RetryAfter time.Duration
	// RouteTimeout bounds the wait for a backend's response headers (504
	// past it). Default: 0, no bound.
	RouteTimeout time.Duration
	// MaxRequestBodyBytes refuses larger request bodies with 413. Default: 0,
	// no bound.
	MaxRequestBodyBytes int64
	// EPPConditionalDecode makes the picker decide decode requests with
	// Prefer: if-available (see the package documentation).
	EPPConditionalDecode bool
	// LegacyReserve answers reservations as the first EPP version did: 200 with
	// LegacyReservedHeader instead of 204 with ReservedHeader.
	LegacyReserve bool
	// Hints makes the picker's 412s list the backends of the other pools, best first
	// (with EPPConditionalDecode; see the package documentation).
	Hints bool
	// PrefixAffinity routes a prompt to the backend it was first picked for, as llm-d's EPP
	// does, until SetPool (see the package documentation).
	PrefixAffinity bool
	// Fallbacks is how many fallback endpoints a pick names after the primary; a connection
	// that fails before response headers is tried on them in turn (Envoy's override_host).
	Fallbacks int
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c Config) withDefaults() Config {
	if c.EjectFor == 0 {
		c.EjectFor = DefaultEjectFor
	}
	if c.MaxEjectionPercent <= 0 {
		c.MaxEjectionPercent = DefaultMaxEjectionPercent
	}
	if c.EjectAfter <= 0 {
		c.EjectAfter = DefaultEjectAfter
	}
	if c.RetryAfter <= 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	return c
}

// Failure names why the gateway answered a leg itself or cut it off.
type Failure string

// The failures a Leg records.
const (
	// FailureNone: the backend's answer was relayed whole (or the client left).
	FailureNone Failure = ""
	// FailureConnect: the backend could not be dialed (503).
	FailureConnect Failure = "connection failure"
	// FailureTermination: the backend's connection broke before the headers
	// (503) or after them (the response was cut off).
	FailureTermination Failure = "connection termination"
	// FailureTimeout: the headers missed the route timeout (504).
	FailureTimeout Failure = "upstream request timeout"
	// FailureNoHealthy: every backend of the pool is ejected (503).
	FailureNoHealthy Failure = "no healthy upstream"
	// FailureNoPool: no pool serves the profile (503).
	FailureNoPool Failure = "no pool"
	// FailureShed: the pool was at Config.MaxInFlight (429).
	FailureShed Failure = "shed"
	// FailureTooLarge: the body exceeded Config.MaxRequestBodyBytes (413).
	FailureTooLarge Failure = "payload too large"
	// FailureNotHeld: no live decode backend holds the prompt (412, Config.EPPConditionalDecode).
	FailureNotHeld Failure = "prompt not held"
	// FailurePinRejected: no live backend of the pool is at the request's PinHeader (503).
	FailurePinRejected Failure = "pinned endpoint not a candidate"
	// FailureEmptyReservation: a reservation came without a body to schedule it (400).
	FailureEmptyReservation Failure = "reservation without a body"
)

// Leg is one request the gateway routed (or refused).
type Leg struct {
	// Profile is the requested profile, lower-cased ("" when absent).
	Profile string
	// Backend is the chosen backend base URL ("" when none was picked).
	Backend string
	Method  string
	Path    string
	// RequestID is the leg's x-request-id header, ClientRequestID the client request's id:
	// x-coordinator-request-id, or x-request-id when the leg has none (a direct client).
	RequestID, ClientRequestID string
	// Revision is the request's RevisionHeader ("" when absent).
	Revision string
	// Status is the status answered to the client, or 0 while in flight.
	Status int
	Start  time.Time
	// Duration runs until the response body was fully relayed (or abandoned).
	Duration time.Duration
	// Aborted is true when the response was cut off because the client went away.
	Aborted bool
	// Failure is why the gateway answered itself or cut the response off.
	Failure Failure
	// Ejected is true when this leg's failure ejected its backend.
	Ejected bool
	// Pin is the request's PinHeader ("" when absent).
	Pin string
	// Reserved is true when the leg was answered as a reservation of Backend.
	Reserved bool
	// Hints maps a profile to the HintHeader value of the picker's 412 (Config.Hints;
	// nil when none was sent).
	Hints map[string]string
	// Tried are the backends the leg was sent to before Backend, each of which failed before
	// its response headers (Config.Fallbacks).
	Tried []string
}

// backend is one endpoint of a pool and what the gateway knows of it.
type backend struct {
	url      *url.URL
	addr     netip.AddrPort // url's host as ip:port, invalid for a host name (PinHeader)
	failures int            // consecutive
	until    time.Time      // ejected until
	keys     map[string]struct{}
	order    []string // keys, oldest first
}

// ejected reports whether b is ejected at now.
func (b *backend) ejected(now time.Time) bool { return now.Before(b.until) }

// addKey records a prompt key b has served.
func (b *backend) addKey(key string) {
	if _, ok := b.keys[key]; ok {
		return
	}
	if len(b.order) == maxKeysPerBackend {
		delete(b.keys, b.order[0])
		b.order = b.order[1:]
	}
	b.keys[key] = struct{}{}
	b.order = append(b.order, key)
}

// pool is the backends of one profile; its mutable state is guarded by Gateway.mu.
type pool struct {
	backends []*backend
	next     uint64
	inflight int
	affinity map[string]*backend // prompt key -> the backend it was picked for (Config.PrefixAffinity)
}

// Gateway is the loopback inference gateway. It is an http.Handler; Start
// also runs it on its own listener. All methods are safe for concurrent use.
type Gateway struct {
	cfg       Config
	transport *http.Transport
	proxy     *httputil.ReverseProxy
	now       func() time.Time

	mu        sync.Mutex
	pools     map[string]*pool
	revisions map[string]string // backend URL -> revision (Config.Revisions, SetRevision)
	legs      []*Leg
	changed   chan struct{} // closed and replaced whenever a leg changes

	srv       *loopback.Server
	closeOnce sync.Once
}

// attempt is one leg on its way to a backend, carried through the request context.
type attempt struct {
	g       *Gateway
	pool    *pool
	backend *backend
	leg     *Leg
	client  context.Context // the incoming request's
	key     string          // prompt key, recorded on the backend after a 2xx (EPPConditionalDecode)
	strip   bool            // a conditional decode the picker decides: Prefer is removed upstream
	pin     string          // PinHeader, "" when absent
	// fallbacks are the pick's further endpoints (Config.Fallbacks), body the request's, which
	// each try sends again.
	fallbacks []*backend
	body      []byte
}

// attemptKey carries the attempt through the request context.
type attemptKey struct{}

// New returns a Gateway routing to cfg.Pools. It fails on an invalid URL.
func New(cfg Config) (*Gateway, error) {
	g := &Gateway{
		cfg:       cfg.withDefaults(),
		revisions: maps.Clone(cfg.Revisions),
		transport: &http.Transport{
			Proxy:               nil,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     30 * time.Second,
		},
		now:     time.Now,
		pools:   map[string]*pool{},
		changed: make(chan struct{}),
	}
	g.proxy = &httputil.ReverseProxy{
		Rewrite:       g.rewrite,
		Transport:     &upstream{base: g.transport},
		FlushInterval: -1,
		ErrorHandler:  proxyError,
		ErrorLog:      log.New(io.Discard, "", 0), // failures are recorded on the legs
	}
	for profile, backends := range cfg.Pools {
		if err := g.SetPool(profile, backends); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// Start returns a Gateway served on cfg.Addr (default 127.0.0.1:0) until Close.
func Start(cfg Config) (*Gateway, error) {
	g, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if g.srv, err = loopback.Serve(cfg.Addr, g); err != nil {
		return nil, err
	}
	return g, nil
}

// URL returns the base URL of a started Gateway, or "" for one made by New.
func (g *Gateway) URL() string {
	if g.srv == nil {
		return ""
	}
	return g.srv.URL()
}

// Close stops a started Gateway, cancelling in-flight requests, and closes
// idle backend connections. It is safe to call more than once.
func (g *Gateway) Close() error {
	var err error
	g.closeOnce.Do(func() {
		if g.srv != nil {
			err = g.srv.Close()
		}
		g.transport.CloseIdleConnections()
	})
	return err
}

// SetPool replaces the backends of profile, with fresh ejection and
// prompt-key state; no backends removes the pool.
func (g *Gateway) SetPool(profile string, backends []string) error {
	p := &pool{affinity: map[string]*backend{}}
	for _, b := range backends {
		u, err := url.Parse(strings.TrimSpace(b))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("pool %q: invalid backend URL %q", profile, b)
		}
		addr, _ := netip.ParseAddrPort(u.Host)
		p.backends = append(p.backends, &backend{url: u, addr: addr, keys: map[string]struct{}{}})
	}
	key := normalize(profile)
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(p.backends) == 0 {
		delete(g.pools, key)
		return nil
	}
	g.pools[key] = p
	return nil
}

// Pools returns the configured profiles and their backends.
func (g *Gateway) Pools() map[string][]string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string][]string, len(g.pools))
	for name, p := range g.pools {
		for _, b := range p.backends {
			out[name] = append(out[name], b.url.String())
		}
	}
	return out
}

// SetRevision makes backend's answers carry revision in RevisionHeader ("" stops it).
func (g *Gateway) SetRevision(backend, revision string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.revisions == nil {
		g.revisions = map[string]string{}
	}
	g.revisions[strings.TrimRight(backend, "/")] = revision
}

// Ejected returns the backends ejected now, by profile, in pool order
// (profiles without an ejected backend are absent).
func (g *Gateway) Ejected() map[string][]string {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	out := map[string][]string{}
	for name, p := range g.pools {
		for _, b := range p.backends {
			if b.ejected(now) {
				out[name] = append(out[name], b.url.String())
			}
		}
	}
	return out
}

// ClearEjections readmits every ejected backend and resets their failure
// counts (a test that restarts a worker need not wait for EjectFor).
func (g *Gateway) ClearEjections() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range g.pools {
		for _, b := range p.backends {
			b.until, b.failures = time.Time{}, 0
		}
	}
}

// Legs returns copies of the recorded legs in arrival order.
func (g *Gateway) Legs() []Leg {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]Leg, len(g.legs))
	for i, l := range g.legs {
		out[i] = *l
	}
	return out
}

// Picks returns how many recorded legs of profile went to each backend,
// failed ones and reservations included (legs refused before a pick are not
// counted).
func (g *Gateway) Picks(profile string) map[string]int {
	profile = normalize(profile)
	out := map[string]int{}
	for _, l := range g.Legs() {
		if l.Profile == profile && l.Backend != "" {
			out[l.Backend]++
		}
	}
	return out
}

// SettledLegs returns the legs of the client request requestID (ClientRequestID) once none of
// them is in flight: a client may read the end of an answer before the gateway has recorded how
// the leg ended. It gives up when ctx ends and returns the legs as they are.
func (g *Gateway) SettledLegs(ctx context.Context, requestID string) []Leg {
	return g.settled(ctx, func(l *Leg) bool { return l.ClientRequestID == requestID })
}

// Settled returns every recorded leg once none is in flight (see SettledLegs); a test calls it
// after its clients have read their answers.
func (g *Gateway) Settled(ctx context.Context) []Leg {
	return g.settled(ctx, func(*Leg) bool { return true })
}

// settled waits until no leg that match keeps is in flight, or ctx ends, and returns those legs.
func (g *Gateway) settled(ctx context.Context, match func(*Leg) bool) []Leg {
	for {
		var legs []Leg
		inflight := false
		g.mu.Lock()
		for _, l := range g.legs {
			if match(l) {
				legs = append(legs, *l)
				inflight = inflight || l.Status == 0
			}
		}
		changed := g.changed
		g.mu.Unlock()
		if !inflight {
			return legs
		}
		select {
		case <-ctx.Done():
			return legs
		case <-changed:
		}
	}
}

// Reset forgets the recorded legs (not ejections nor prompt keys).
func (g *Gateway) Reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.legs = nil
}

// update changes a leg under the lock and wakes SettledLegs.
func (g *Gateway) update(f func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f()
	close(g.changed)
	g.changed = make(chan struct{})
}

// ServeHTTP routes one request by its profile header.
func (g *Gateway) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	profile := r.Header.Get(ProfileHeader)
	if profile == "" {
		profile = r.Header.Get(AltProfileHeader)
	}
	profile = normalize(profile)
	leg := &Leg{
		Profile:         profile,
		Method:          r.Method,
		Path:            r.URL.Path,
		RequestID:       r.Header.Get("X-Request-Id"),
		ClientRequestID: cmp.Or(r.Header.Get("X-Coordinator-Request-Id"), r.Header.Get("X-Request-Id")),
		Revision:        r.Header.Get(RevisionHeader),
		Pin:             r.Header.Get(PinHeader),
		Start:           time.Now(),
	}
	g.mu.Lock()
	g.legs = append(g.legs, leg)
	p := g.pools[profile]
	g.mu.Unlock()

	sw := loopback.NewStatusWriter(rw)
	admitted := false
	defer func() {
		// ReverseProxy aborts (panics with http.ErrAbortHandler) when the client goes away
		// mid-response or the backend breaks off; record the leg either way.
		r := recover()
		g.update(func() {
			if admitted {
				p.inflight--
			}
			leg.Status, leg.Duration = answered(sw), time.Since(leg.Start)
			leg.Aborted = r != nil && leg.Failure == FailureNone
		})
		if r != nil {
			panic(r)
		}
	}()
	refuse := func(f Failure, answer func()) {
		g.update(func() { leg.Failure = f })
		answer()
	}
	if p == nil {
		refuse(FailureNoPool, func() {
			writeError(sw, http.StatusServiceUnavailable, "service_unavailable", fmt.Sprintf("no InferencePool for profile %q", profile))
		})
		return
	}
	at := &attempt{g: g, pool: p, leg: leg, client: r.Context(), pin: leg.Pin}
	// The body is read whole before a backend is picked, as Envoy's buffer filter does: a
	// backend that dies while the transport still streams a request body to it would leave
	// that read running after the handler returned (net/http then panics on the connection's
	// next request).
	epp := g.cfg.EPPConditionalDecode && profile == DecodeProfile
	hints := g.cfg.EPPConditionalDecode && g.cfg.Hints
	reserve := hasPreference(r.Header, PreferReserveEndpoint)
	{
		body, tooLarge, err := g.readBody(r)
		switch {
		case tooLarge:
			refuse(FailureTooLarge, func() { writePlain(sw, http.StatusRequestEntityTooLarge, BodyPayloadTooLarge) })
			return
		case err != nil:
			if r.Context().Err() == nil {
				writePlain(sw, http.StatusBadRequest, "Bad Request")
			}
			return
		}
		r.Body, r.ContentLength, r.TransferEncoding = http.NoBody, 0, nil
		if len(body) > 0 {
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		}
		if reserve && len(body) == 0 {
			refuse(FailureEmptyReservation, func() {
				writeError(sw, http.StatusBadRequest, "invalid_request_error", "a reservation needs the request body to schedule it")
			})
			return
		}
		if epp || hints || g.cfg.PrefixAffinity {
			at.key, _ = simworker.RequestPromptKey(r.URL.Path, body)
		}
		at.body = body
		at.strip = epp && simworker.PreferIfAvailable(r.Header)
	}

	g.mu.Lock()
	if limit := g.cfg.MaxInFlight; limit > 0 && p.inflight >= limit {
		g.mu.Unlock()
		refuse(FailureShed, func() { g.shed(sw) })
		return
	}
	p.inflight++
	admitted = true
	var failure Failure
	if at.backend, failure = g.pickLocked(p, at); at.backend != nil {
		leg.Backend = at.backend.url.String()
	}
	if failure == FailureNotHeld && hints {
		leg.Hints = g.hintsLocked(profile, at.key)
	}
	leg.Reserved = reserve && failure == FailureNone
	hinted := leg.Hints // written here only
	g.mu.Unlock()

	switch {
	case failure == FailureNoHealthy:
		refuse(failure, func() { writePlain(sw, http.StatusServiceUnavailable, BodyNoHealthyUpstream) })
	case failure == FailurePinRejected:
		refuse(failure, func() {
			writeError(sw, http.StatusServiceUnavailable, "service_unavailable",
				fmt.Sprintf("endpoint pin %q: no candidate endpoint matches (rejected-no-endpoints)", at.pin))
		})
	case failure == FailureNotHeld:
		refuse(failure, func() {
			for name, hosts := range hinted {
				sw.Header().Set(HintHeader(name), hosts)
			}
			writeError(sw, http.StatusPreconditionFailed, "precondition_failed",
				"no decode endpoint holds the prompt in its prefix cache (Prefer: if-available)")
		})
	case reserve:
		g.reserved(sw, at.backend)
	default:
		g.proxy.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), attemptKey{}, at)))
	}
}

// hasPreference reports whether h's Prefer headers carry the preference token (RFC 7240:
// comma-separated preferences, the token matched case-insensitively, values and parameters
// ignored).
func hasPreference(h http.Header, token string) bool {
	for _, v := range h.Values("Prefer") {
		for _, pref := range strings.Split(v, ",") {
			name, _, _ := strings.Cut(pref, ";")
			name, _, _ = strings.Cut(name, "=")
			if strings.EqualFold(strings.TrimSpace(name), token) {
				return true
			}
		}
	}
	return false
}

// reserved answers a reservation of b, as the EPP's reserve-endpoint plugin does (or its
// first version, with Config.LegacyReserve).
func (g *Gateway) reserved(rw http.ResponseWriter, b *backend) {
	if g.cfg.LegacyReserve {
		rw.Header().Set(LegacyReservedHeader, b.url.Host)
		rw.Header().Set("Content-Length", "0")
		rw.WriteHeader(http.StatusOK)
		return
	}
	rw.Header().Set(ReservedHeader, b.url.Host)
	rw.Header().Set("Preference-Applied", PreferReserveEndpoint)
	rw.WriteHeader(http.StatusNoContent)
}

// hintsLocked returns, for every pool but exclude's with a live backend, the HintHeader value
// of a request with prompt key: the live backends' host:port, those holding key first, each in
// pool order; nil when there is none. g.mu must be held.
func (g *Gateway) hintsLocked(exclude, key string) map[string]string {
	now := g.now()
	var out map[string]string
	for name, p := range g.pools {
		if name == exclude {
			continue
		}
		var held, others []string
		for _, b := range p.backends {
			if b.ejected(now) {
				continue
			}
			if _, ok := b.keys[key]; ok && key != "" {
				held = append(held, b.url.Host)
			} else {
				others = append(others, b.url.Host)
			}
		}
		if len(held)+len(others) == 0 {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[name] = strings.Join(append(held, others...), ",")
	}
	return out
}

// readBody buffers the request body, reporting one over Config.MaxRequestBodyBytes.
func (g *Gateway) readBody(r *http.Request) (body []byte, tooLarge bool, err error) {
	limit := g.cfg.MaxRequestBodyBytes
	if limit > 0 && r.ContentLength > limit {
		return nil, true, nil
	}
	var rd io.Reader = r.Body
	if limit > 0 {
		rd = io.LimitReader(r.Body, limit+1)
	}
	body, err = io.ReadAll(rd)
	if err != nil {
		return nil, false, err
	}
	return body, limit > 0 && int64(len(body)) > limit, nil
}

// pickLocked returns the next live backend of p round-robin, only the pinned one with a pin,
// and with a conditional attempt the next live one holding its prompt key; otherwise why there
// is none. g.mu must be held.
func (g *Gateway) pickLocked(p *pool, at *attempt) (*backend, Failure) {
	now := g.now()
	pin, err := netip.ParseAddrPort(at.pin)
	pinned := at.pin != ""
	live := make([]*backend, 0, len(p.backends))
	for _, b := range p.backends {
		if !b.ejected(now) && (!pinned || err == nil && b.addr == pin) {
			live = append(live, b)
		}
	}
	switch {
	case len(live) == 0 && pinned:
		return nil, FailurePinRejected
	case len(live) == 0:
		return nil, FailureNoHealthy
	}
	if at.strip {
		holders := live[:0]
		for _, b := range live {
			if _, ok := b.keys[at.key]; ok && at.key != "" {
				holders = append(holders, b)
			}
		}
		if len(holders) == 0 {
			return nil, FailureNotHeld
		}
		live = holders
	}
	if pinned {
		return live[0], FailureNone // the pin chose: the rotation does not move
	}
	if g.cfg.PrefixAffinity && !at.strip {
		return g.affinePickLocked(p, at), FailureNone
	}
	n := p.next
	p.next++
	return live[n%uint64(len(live))], FailureNone
}

// affinePickLocked picks as llm-d's EPP with prefix affinity: the backend at's prompt was picked
// for before, else the next one round-robin, recorded before the request is forwarded; the
// fallbacks are the next Config.Fallbacks backends in pool order. Ejection does not apply.
func (g *Gateway) affinePickLocked(p *pool, at *attempt) *backend {
	b := p.affinity[at.key]
	if b == nil || at.key == "" {
		b = p.backends[p.next%uint64(len(p.backends))]
		p.next++
		if at.key != "" {
			p.affinity[at.key] = b
		}
	}
	i := slices.Index(p.backends, b)
	for k := 1; k <= g.cfg.Fallbacks && k < len(p.backends); k++ {
		at.fallbacks = append(at.fallbacks, p.backends[(i+k)%len(p.backends)])
	}
	return b
}

// shed answers a request over Config.MaxInFlight as the EPP does.
func (g *Gateway) shed(rw http.ResponseWriter) {
	secs := int64((g.cfg.RetryAfter + time.Second - 1) / time.Second)
	rw.Header().Set("Retry-After", strconv.FormatInt(max(secs, 1), 10))
	writeError(rw, http.StatusTooManyRequests, "InferencePoolResourceExhausted", ShedMessage)
}

// mayEject reports whether one more backend of p may be ejected at now: at most pct percent of
// them are, and at least one (Envoy's max_ejection_percent).
func (p *pool) mayEject(now time.Time, pct int) bool {
	ejected := 0
	for _, b := range p.backends {
		if b.ejected(now) {
			ejected++
		}
	}
	return ejected < max(1, len(p.backends)*pct/100)
}

// failed records a failure of at's backend and ejects it after Config.EjectAfter in a row.
func (at *attempt) failed(f Failure) {
	g := at.g
	g.update(func() {
		if at.leg.Failure != FailureNone {
			return // one failure per leg
		}
		at.leg.Failure = f
		b := at.backend
		b.failures++
		if g.cfg.EjectFor > 0 && !g.cfg.PrefixAffinity && b.failures >= g.cfg.EjectAfter && at.pool.mayEject(g.now(), g.cfg.MaxEjectionPercent) {
			b.until, b.failures = g.now().Add(g.cfg.EjectFor), 0
			clear(b.keys)
			b.order = nil
			at.leg.Ejected = true
		}
	})
}

// fallBack moves at to the pick's next endpoint, recording the one that failed on the leg; nil
// when the pick names no further endpoint.
func (at *attempt) fallBack() (next *backend) {
	at.g.update(func() {
		if len(at.fallbacks) == 0 {
			return
		}
		at.leg.Tried = append(at.leg.Tried, at.backend.url.String())
		at.backend, at.fallbacks = at.fallbacks[0], at.fallbacks[1:]
		at.leg.Backend, next = at.backend.url.String(), at.backend
	})
	return next
}

// answeredHeaders records that at's backend answered with status.
func (at *attempt) answeredHeaders(status int) {
	at.g.mu.Lock()
	defer at.g.mu.Unlock()
	at.backend.failures = 0
	if at.key != "" && status >= 200 && status < 300 {
		at.backend.addKey(at.key)
	}
}

// rewrite points the outbound request at the chosen backend.
func (g *Gateway) rewrite(pr *httputil.ProxyRequest) {
	at := pr.In.Context().Value(attemptKey{}).(*attempt)
	target := at.backend.url
	pr.SetURL(target)
	pr.SetXForwarded()
	pr.Out.Header.Set(DestinationHeader, target.Host)
	if at.strip {
		pr.Out.Header.Del("Prefer")
	}
	pr.Out.Header.Del(PinHeader) // the EPP strips the pin
}

// errRouteTimeout is the cause of an upstream request cancelled by Config.RouteTimeout.
var errRouteTimeout = errors.New("upstream request timeout")

// upstreamError is a backend failure the gateway answers itself.
type upstreamError struct {
	failure Failure
	err     error
}

func (e *upstreamError) Error() string { return string(e.failure) + ": " + e.err.Error() }
func (e *upstreamError) Unwrap() error { return e.err }

// upstream is the proxy's transport: it applies the route timeout and classifies failures.
type upstream struct {
	base http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (u *upstream) RoundTrip(req *http.Request) (*http.Response, error) {
	at := req.Context().Value(attemptKey{}).(*attempt)
	ctx, cancel := context.WithCancelCause(req.Context())
	var timer *time.Timer
	if d := at.g.cfg.RouteTimeout; d > 0 {
		timer = time.AfterFunc(d, func() { cancel(errRouteTimeout) })
	}
	resp, err := u.base.RoundTrip(req.WithContext(ctx))
	if timer != nil && !timer.Stop() {
		if err == nil {
			resp.Body.Close()
		}
		cancel(nil)
		if at.client.Err() != nil {
			return nil, at.client.Err()
		}
		at.failed(FailureTimeout)
		return nil, &upstreamError{FailureTimeout, errRouteTimeout}
	}
	if err != nil {
		cancel(nil)
		if at.client.Err() != nil {
			return nil, err // the client is gone: not the backend's fault
		}
		f := FailureTermination
		if op := (*net.OpError)(nil); errors.As(err, &op) && op.Op == "dial" {
			f = FailureConnect
		}
		if next := at.fallBack(); next != nil {
			// Envoy's override_host: the retry goes to the pick's next endpoint.
			out := req.Clone(req.Context())
			out.URL.Host, out.Host = next.url.Host, next.url.Host
			out.Header.Set(DestinationHeader, next.url.Host)
			out.Body, out.ContentLength = http.NoBody, 0
			if len(at.body) > 0 {
				out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(at.body)), int64(len(at.body))
			}
			return u.RoundTrip(out)
		}
		at.failed(f)
		return nil, &upstreamError{f, err}
	}
	at.answeredHeaders(resp.StatusCode)
	at.g.mu.Lock()
	rev := at.g.revisions[strings.TrimRight(at.backend.url.String(), "/")]
	at.g.mu.Unlock()
	if rev != "" {
		resp.Header.Set(RevisionHeader, rev) // as a disaggregated set's pods stamp their revision
	}
	if rwc, ok := resp.Body.(io.ReadWriteCloser); ok && resp.StatusCode == http.StatusSwitchingProtocols {
		resp.Body = upgradedBody{rwc, cancel} // the proxy needs it writable
		return resp, nil
	}
	resp.Body = &watchedBody{ReadCloser: resp.Body, at: at, cancel: cancel}
	return resp, nil
}

// upgradedBody is the connection of a 101 answer.
type upgradedBody struct {
	io.ReadWriteCloser
	cancel context.CancelCauseFunc
}

// Close implements io.Closer.
func (b upgradedBody) Close() error {
	err := b.ReadWriteCloser.Close()
	b.cancel(nil)
	return err
}

// watchedBody is a backend's response body: a read error while the client is still there is a
// broken backend connection.
type watchedBody struct {
	io.ReadCloser
	at     *attempt
	cancel context.CancelCauseFunc
}

// Read implements io.Reader.
func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && b.at.client.Err() == nil {
		b.at.failed(FailureTermination)
	}
	return n, err
}

// Close implements io.Closer.
func (b *watchedBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}

// proxyError answers a backend failure before its headers as Envoy does.
func proxyError(rw http.ResponseWriter, r *http.Request, err error) {
	var ue *upstreamError
	switch {
	case errors.As(err, &ue) && ue.failure == FailureTimeout:
		writePlain(rw, http.StatusGatewayTimeout, BodyRouteTimeout)
	case errors.As(err, &ue) && ue.failure == FailureConnect:
		writePlain(rw, http.StatusServiceUnavailable, BodyConnectFailure)
	case r.Context().Err() != nil:
		// the client is gone; nobody reads the answer
	default:
		writePlain(rw, http.StatusServiceUnavailable, BodyConnectTermination)
	}
}

// errorBody is the JSON body of gateway errors.
type errorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// writeError answers status with a JSON error body.
func writeError(rw http.ResponseWriter, status int, typ, msg string) {
	var body errorBody
	body.Error.Message, body.Error.Type, body.Error.Code = msg, typ, status
	b, _ := json.Marshal(body)
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(status)
	_, _ = rw.Write(b)
}

// writePlain answers status with a text/plain body, as Envoy's local replies are.
func writePlain(rw http.ResponseWriter, status int, body string) {
	rw.Header().Set("Content-Type", "text/plain")
	rw.Header().Set("Content-Length", strconv.Itoa(len(body)))
	rw.WriteHeader(status)
	_, _ = io.WriteString(rw, body)
}

// normalize canonicalizes a profile name.
func normalize(profile string) string { return strings.ToLower(strings.TrimSpace(profile)) }

// answered is the status a leg got; one abandoned before any answer (client gone) is recorded as
// 499, like nginx and Envoy logs do.
func answered(sw *loopback.StatusWriter) int {
	if sw.Status() == 0 {
		return 499
	}
	return sw.Status()
}

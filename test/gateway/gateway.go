// Package gateway is a loopback stand-in for the Inference Gateway and its
// endpoint picker (EPP), for tests, benchmarks and demos of the coordinator.
//
// A Gateway routes each request to an InferencePool chosen by the
// EPP-Profile request header (or x-llm-d-epp-profile), picks a backend of
// that pool round-robin and reverse-proxies the request unchanged (method,
// path, query, headers, body), streaming responses through unbuffered so
// that server-sent events arrive as they are produced. Every leg is recorded.
package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epd-dev/coordinator/test/internal/loopback"
)

// Request headers that select the pool, in order of precedence.
const (
	ProfileHeader    = "EPP-Profile"
	AltProfileHeader = "X-Llm-D-Epp-Profile"
)

// DestinationHeader is set on proxied requests to the chosen backend's
// host:port, as the EPP does with x-gateway-destination-endpoint.
const DestinationHeader = "X-Gateway-Destination-Endpoint"

// Config configures a Gateway.
type Config struct {
	// Pools maps a profile name (matched case-insensitively) to the base URLs
	// of its backends.
	Pools map[string][]string
	// Addr is the listen address used by Start. Default: "127.0.0.1:0".
	Addr string
}

// Leg is one request the gateway routed (or refused).
type Leg struct {
	// Profile is the requested profile, lower-cased ("" when absent).
	Profile string
	// Backend is the chosen backend base URL ("" when none was available).
	Backend string
	Method  string
	Path    string
	// RequestID is the request's x-request-id header.
	RequestID string
	// Status is the status answered to the client, or 0 while in flight.
	Status int
	Start  time.Time
	// Duration runs until the response body was fully relayed (or abandoned).
	Duration time.Duration
	// Aborted is true when the response was cut off because the client went away.
	Aborted bool
}

// pool is the backends of one profile.
type pool struct {
	backends []*url.URL
	next     atomic.Uint64
}

// Gateway is the loopback inference gateway. It is an http.Handler; Start
// also runs it on its own listener. All methods are safe for concurrent use.
type Gateway struct {
	transport *http.Transport
	proxy     *httputil.ReverseProxy

	mu    sync.Mutex
	pools map[string]*pool
	legs  []*Leg

	srv       *loopback.Server
	closeOnce sync.Once
}

// backendKey carries the chosen backend through the request context.
type backendKey struct{}

// New returns a Gateway routing to cfg.Pools. It fails on an invalid URL.
func New(cfg Config) (*Gateway, error) {
	g := &Gateway{
		transport: &http.Transport{
			Proxy:               nil,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     30 * time.Second,
		},
		pools: map[string]*pool{},
	}
	g.proxy = &httputil.ReverseProxy{
		Rewrite:       g.rewrite,
		Transport:     g.transport,
		FlushInterval: -1,
		ErrorHandler:  proxyError,
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

// SetPool replaces the backends of profile; no backends removes the pool.
func (g *Gateway) SetPool(profile string, backends []string) error {
	p := &pool{}
	for _, b := range backends {
		u, err := url.Parse(strings.TrimSpace(b))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("pool %q: invalid backend URL %q", profile, b)
		}
		p.backends = append(p.backends, u)
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
		for _, u := range p.backends {
			out[name] = append(out[name], u.String())
		}
	}
	return out
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

// SettledLegs returns the legs of requestID once none of them is in flight: a client may read
// the end of an answer before the gateway has recorded how the leg ended. It gives up when ctx
// ends and returns the legs as they are.
func (g *Gateway) SettledLegs(ctx context.Context, requestID string) []Leg {
	for {
		var legs []Leg
		inflight := false
		for _, l := range g.Legs() {
			if l.RequestID == requestID {
				legs = append(legs, l)
				inflight = inflight || l.Status == 0
			}
		}
		if !inflight {
			return legs
		}
		select {
		case <-ctx.Done():
			return legs
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Reset forgets the recorded legs.
func (g *Gateway) Reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.legs = nil
}

// ServeHTTP routes one request by its profile header.
func (g *Gateway) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	profile := r.Header.Get(ProfileHeader)
	if profile == "" {
		profile = r.Header.Get(AltProfileHeader)
	}
	profile = normalize(profile)
	backend := g.pick(profile)
	leg := &Leg{
		Profile:   profile,
		Method:    r.Method,
		Path:      r.URL.Path,
		RequestID: r.Header.Get("X-Request-Id"),
		Start:     time.Now(),
	}
	if backend != nil {
		leg.Backend = backend.String()
	}
	g.mu.Lock()
	g.legs = append(g.legs, leg)
	g.mu.Unlock()

	// The proxy streams the request body upstream while it streams the answer back; without full
	// duplex, net/http closes an unfinished request body when the answer starts, which breaks
	// the upstream connection mid-response.
	_ = http.NewResponseController(rw).EnableFullDuplex()
	sw := loopback.NewStatusWriter(rw)
	defer func() {
		// ReverseProxy aborts (panics with http.ErrAbortHandler) when the client goes away
		// mid-response; record the leg either way.
		r := recover()
		g.mu.Lock()
		leg.Status, leg.Duration, leg.Aborted = answered(sw), time.Since(leg.Start), r != nil
		g.mu.Unlock()
		if r != nil {
			panic(r)
		}
	}()
	if backend == nil {
		writeError(sw, http.StatusServiceUnavailable, "service_unavailable", fmt.Sprintf("no InferencePool for profile %q", profile))
	} else {
		g.proxy.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), backendKey{}, backend)))
	}
}

// pick returns the next backend of profile's pool, or nil.
func (g *Gateway) pick(profile string) *url.URL {
	g.mu.Lock()
	p := g.pools[profile]
	g.mu.Unlock()
	if p == nil {
		return nil
	}
	n := p.next.Add(1) - 1
	return p.backends[n%uint64(len(p.backends))]
}

// rewrite points the outbound request at the chosen backend.
func (g *Gateway) rewrite(pr *httputil.ProxyRequest) {
	target := pr.In.Context().Value(backendKey{}).(*url.URL)
	pr.SetURL(target)
	pr.SetXForwarded()
	pr.Out.Header.Set(DestinationHeader, target.Host)
}

// proxyError answers a backend failure with 502.
func proxyError(rw http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client is gone; nobody reads the answer
	}
	writeError(rw, http.StatusBadGateway, "bad_gateway", "upstream error: "+err.Error())
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

// Package gateway is the coordinator's client of the Inference Gateway. Every worker leg (encode,
// prefill, decode) goes to the gateway tagged with the EPP-Profile header, so that the endpoint
// picker chooses a pod of that role; the passthrough sends other /v1 requests with the decode
// profile. The HTTP machinery underneath (transport, header rules, relay) is package upstream.
package gateway

import (
	"context"
	"fmt"
	"net/http"

	"github.com/epd-dev/coordinator/dataplane/config"
	"github.com/epd-dev/coordinator/dataplane/observe"
	"github.com/epd-dev/coordinator/dataplane/upstream"
)

// Header names (in Go's canonical spelling, so setting them allocates nothing; header names are
// case-insensitive on the wire) and EPP profiles.
const (
	// ProfileHeader (EPP-Profile) tells the endpoint picker which scheduling profile (pod role) to use.
	ProfileHeader = "Epp-Profile"
	// ProfileHeaderName is the header's documented spelling, for configuration written for people
	// (an HTTPRoute's header match).
	ProfileHeaderName = "EPP-Profile"
	// ProfileHeaderNew (x-llm-d-epp-profile) is the newer upstream spelling; never accepted from clients either.
	ProfileHeaderNew = "X-Llm-D-Epp-Profile"
	// PreferHeader carries the conditional-decode precondition.
	PreferHeader = "Prefer"
	// PreferIfAvailable asks the decode worker to serve only if it can without prefill.
	PreferIfAvailable = "if-available"

	ProfileEncode  = "encode"
	ProfilePrefill = "prefill"
	ProfileDecode  = "decode"
)

// owned are the headers the gateway client sets itself; a client's own values are never forwarded.
var owned = []string{ProfileHeader, ProfileHeaderNew, PreferHeader}

// RoutingHeaders are the request headers that steer the gateway's endpoint picker or a worker
// past the coordinator's choice: endpoint pinning (the destination endpoint, the prefill pin,
// the data-parallel rank) and the scheduling objective and fairness id. Clients' values are
// dropped unless server.trusted_routing_headers; the steps that set them (the async broker's
// passthrough mode) do so after the drop.
var RoutingHeaders = []string{
	"X-Gateway-Destination-Endpoint",
	"X-Gateway-Destination-Endpoint-Served",
	"X-Gateway-Destination-Endpoint-Subset",
	"X-Gateway-Inference-Objective",
	"X-Gateway-Inference-Fairness-Id",
	"X-Prefill-Pin-Host-Port",
	"X-Data-Parallel-Rank",
}

var ownedAndRouting = append(append([]string(nil), owned...), RoutingHeaders...)

// Forwarded returns the client headers that every leg carries: upstream.Forwarded, without the
// client's EPP-Profile, x-llm-d-epp-profile and Prefer, and without its RoutingHeaders.
func Forwarded(in http.Header) http.Header { return upstream.Forwarded(in, ownedAndRouting) }

// ForwardedTrusted is Forwarded keeping the client's RoutingHeaders
// (server.trusted_routing_headers).
func ForwardedTrusted(in http.Header) http.Header { return upstream.Forwarded(in, owned) }

// Client sends legs to the gateway over a keep-alive pool.
type Client struct {
	up *upstream.Client
}

// CheckCA reads gateway.ca_file, if set, so that a missing or unreadable bundle fails startup
// and reloads naming the key (New reads it only when it first dials).
func CheckCA(cfg config.Gateway) error {
	if cfg.CAFile == "" {
		return nil
	}
	if _, err := upstream.LoadCAFile(cfg.CAFile); err != nil {
		return &config.FieldError{Key: "gateway.ca_file", Reason: err.Error()}
	}
	return nil
}

// New builds the client for cfg. It neither contacts the gateway nor reads gateway.ca_file.
func New(cfg config.Gateway, tel observe.Telemetry) (*Client, error) {
	if cfg.Address == "" {
		return nil, fmt.Errorf("gateway.address is empty")
	}
	t := upstream.NewTransport(upstream.TransportOptions{
		MaxIdleConnsPerHost:   cfg.MaxIdleConnsPerHost,
		IdleConnTimeout:       cfg.IdleConnTimeout.Std(),
		ResponseHeaderTimeout: cfg.Timeout.Std(),
		CAFile:                cfg.CAFile,
	})
	up, err := upstream.NewClient(cfg.Address, t, 0, tel)
	if err != nil {
		return nil, err
	}
	return &Client{up: up}, nil
}

// Close drops the idle connections of the pool (used when a reload replaces the client).
func (c *Client) Close() { c.up.Close() }

// Leg is one call to the gateway: an upstream request with its EPP profile.
type Leg struct {
	upstream.Request
	// Profile is the EPP profile (encode, prefill, decode).
	Profile string
	// Prefer, when set, is sent as the Prefer header (conditional decode).
	Prefer string
}

// Do sends the leg and returns the raw response; the caller closes its body (upstream.Client.Do).
func (c *Client) Do(ctx context.Context, leg Leg) (*http.Response, error) {
	r, profile, prefer := leg.parts()
	return c.up.Do(ctx, r, profile, prefer)
}

// Call sends the leg and returns the whole body of a 200 answer (upstream.Client.Call).
func (c *Client) Call(ctx context.Context, leg Leg) ([]byte, error) {
	r, profile, prefer := leg.parts()
	return c.up.Call(ctx, r, profile, prefer)
}

// parts is the leg as an upstream request (its phase defaulting to the profile) and the two
// headers the gateway client sets.
func (leg Leg) parts() (r upstream.Request, profile, prefer upstream.Field) {
	r = leg.Request
	if r.Phase == "" {
		r.Phase = leg.Profile
	}
	return r, upstream.Field{Name: ProfileHeader, Value: leg.Profile}, upstream.Field{Name: PreferHeader, Value: leg.Prefer}
}

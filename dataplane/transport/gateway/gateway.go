// Package gateway is the coordinator's client of the Inference Gateway. Every worker leg (encode,
// prefill, decode) goes to the gateway tagged with the EPP-Profile header, so that the endpoint
// picker chooses a pod of that role; the passthrough sends other /v1 requests with the decode
// profile. The HTTP machinery underneath (transport, header rules, relay) is package upstream.
package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"net/textproto"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/transport/retry"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
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
	// PreferReserveEndpoint asks the endpoint picker to choose an endpoint and name it, without
	// forwarding the request (llm-d's reserve-endpoint plugin): 204 with ReservedHeader.
	PreferReserveEndpoint = "reserve-endpoint"
	// ReservedHeader names the endpoint (ip:port) a reservation chose.
	ReservedHeader = "X-Llm-D-Reserved-Host-Port"
	// LegacyReservedHeader is ReservedHeader as the first reserve-endpoint plugin named it (in a
	// 200 answer).
	LegacyReservedHeader = "X-Prefill-Host-Port"
	// PinHeader pins a leg to one endpoint (ip:port) of its pool: llm-d's endpoint-pin-screener
	// keeps only that endpoint, and answers 503 when it is not a candidate.
	PinHeader = "X-Llm-D-Pin-Host-Port"
	// PipelineRevisionHeader carries, on every leg of a request, the revision of the pipeline
	// the request runs on (config.Pipeline.Revision): with a canary, workers and the picker can
	// tell its legs. Never taken from a client.
	PipelineRevisionHeader = "X-Coordinator-Pipeline-Revision"

	ProfileEncode  = "encode"
	ProfilePrefill = "prefill"
	ProfileDecode  = "decode"
)

// owned are the headers the gateway client sets itself; a client's own values are never forwarded.
var owned = []string{ProfileHeader, ProfileHeaderNew, PreferHeader, PipelineRevisionHeader}

// ObjectiveHeader names the endpoint picker's scheduling objective (an InferenceObjective,
// which carries a priority): a client's value is dropped; the coordinator sets a tenant's
// (rate_limit.tenants[].objective) and the async broker its tiers'.
const ObjectiveHeader = "X-Gateway-Inference-Objective"

// RoutingHeaders are the request headers that steer the gateway's endpoint picker or a worker
// past the coordinator's choice: endpoint pinning (the destination endpoint, the prefill pin,
// the data-parallel rank) and the scheduling objective and fairness id. Clients' values are
// dropped unless server.trusted_routing_headers; the steps that set them (the async broker's
// passthrough mode) do so after the drop.
var RoutingHeaders = []string{
	"X-Gateway-Destination-Endpoint",
	"X-Gateway-Destination-Endpoint-Served",
	"X-Gateway-Destination-Endpoint-Subset",
	ObjectiveHeader,
	"X-Gateway-Inference-Fairness-Id",
	"X-Prefill-Pin-Host-Port",
	PinHeader,
	"X-Prefill-Pin",
	"X-Data-Parallel-Rank",
	// What the picker tells workers (llm-d's disaggregation headers, legacy spellings too, and
	// RFC llm-d-router#2178's per-profile picks): a client's value would steer a worker's own
	// calls, e.g. a sidecar's prefill, to any address.
	"X-Llm-D-Prefiller-Host-Port",
	"X-Prefiller-Host-Port",
	"X-Llm-D-Encoder-Hosts-Ports",
	"X-Encoder-Hosts-Ports",
	"X-Llm-D-Kv-Cache-Source-Host-Port",
	"X-Kv-Cache-Source-Host-Port",
	"X-Data-Parallel-Host-Port",
	"X-Prefill-Host-Port",
	"X-Encode-Host-Port",
	"X-Decode-Host-Port",
}

var ownedAndRouting = append(append([]string(nil), owned...), RoutingHeaders...)

// Forwarded returns the client headers that every leg carries: upstream.Forwarded, without the
// client's EPP-Profile, x-llm-d-epp-profile and Prefer, and without its RoutingHeaders.
func Forwarded(in http.Header) http.Header { return upstream.Forwarded(in, ownedAndRouting) }

// ForwardedTrusted is Forwarded keeping the client's RoutingHeaders
// (server.trusted_routing_headers).
func ForwardedTrusted(in http.Header) http.Header { return upstream.Forwarded(in, owned) }

// Client sends legs to the gateway over a keep-alive pool, retrying those that failed without
// being served (Send, Fetch).
type Client struct {
	up       *upstream.Client
	cfg      config.Gateway
	retrier  retry.Retrier
	profiles []string // gateway.profile_headers, canonical
	// hintNets are gateway.allowed_hint_networks (EndpointOf).
	hintNets []netip.Prefix
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

// New builds the client for cfg. Its retries spend from budget, the process's (nil: a budget of
// its own with cfg's rates); New sets budget's rates to cfg's. It neither contacts the gateway
// nor reads gateway.ca_file.
func New(cfg config.Gateway, tel observe.Telemetry, budget *retry.Budget) (*Client, error) {
	if cfg.Address == "" {
		return nil, fmt.Errorf("gateway.address is empty")
	}
	hintNets, err := cfg.HintNetworks()
	if err != nil {
		return nil, err
	}
	up, err := upstream.NewClient(cfg.Address, upstream.TransportOptions{
		MaxIdleConnsPerHost:   cfg.MaxIdleConnsPerHost,
		IdleConnTimeout:       cfg.IdleConnTimeout.Std(),
		ResponseHeaderTimeout: cfg.Timeout.Std(),
		CAFile:                cfg.CAFile,
	}, 0, tel)
	if err != nil {
		return nil, err
	}
	if budget == nil {
		budget = retry.NewBudget(cfg.Retry.BudgetRatio, cfg.Retry.BudgetMinPerSecond)
	} else {
		budget.Configure(cfg.Retry.BudgetRatio, cfg.Retry.BudgetMinPerSecond)
	}
	names := cfg.ProfileHeaders
	if len(names) == 0 {
		names = config.DefaultProfileHeaders()
	}
	profiles := make([]string, len(names))
	for i, n := range names {
		profiles[i] = textproto.CanonicalMIMEHeaderKey(n)
	}
	return &Client{up: up, cfg: cfg, profiles: profiles, hintNets: hintNets,
		retrier: retry.Retrier{Policy: PolicyOf(cfg.Retry), Budget: budget, Metrics: tel.Metrics}}, nil
}

// PolicyOf is the retry policy of gateway.retry.
func PolicyOf(c config.Retry) retry.Policy {
	return retry.Policy{MaxAttempts: c.MaxAttempts, InitialBackoff: c.InitialBackoff.Std(), MaxBackoff: c.MaxBackoff.Std(),
		MaxRetryAfter: c.MaxRetryAfter.Std()}
}

// MaxResponseBytes is gateway.max_response_size in bytes.
func (c *Client) MaxResponseBytes() int64 { return c.cfg.MaxResponseBytes() }

// AllowedHintNetworks are gateway.allowed_hint_networks: the networks whose loopback and
// link-local addresses the endpoint picker's hints and reservations may name (EndpointOf).
func (c *Client) AllowedHintNetworks() []netip.Prefix { return c.hintNets }

// MaxEventBytes is gateway.max_event_size in bytes.
func (c *Client) MaxEventBytes() int64 { return c.cfg.MaxEventBytes() }

// MaxResumeBytes are gateway.retry.max_resume_size and max_resume_memory in bytes: what one
// stream, and all of them, keep to be resumed from.
func (c *Client) MaxResumeBytes() (stream, process int64) {
	return c.cfg.Retry.MaxResumeBytes(), c.cfg.Retry.MaxResumeMemoryBytes()
}

// Retrier is the client's retry policy and budget, for side services (render) that follow
// gateway.retry.
func (c *Client) Retrier() retry.Retrier { return c.retrier }

// Close drops the idle connections of the pool (used when a reload replaces the client).
func (c *Client) Close() { c.up.Close() }

// Leg is one call to the gateway: an upstream request with its EPP profile.
type Leg struct {
	upstream.Request
	// Profile is the EPP profile (encode, prefill, decode).
	Profile string
	// Prefer, when set, is sent as the Prefer header (conditional decode).
	Prefer string
	// Stream marks a leg whose answer is relayed as it arrives: gateway.request_timeout does not
	// bound it (gateway.idle_timeout does).
	Stream bool
}

// Do sends the leg once and returns the raw response; the caller closes its body
// (upstream.Client.Do). The leg is bounded by gateway.idle_timeout and, unless it streams,
// gateway.request_timeout.
func (c *Client) Do(ctx context.Context, leg Leg) (*http.Response, error) {
	var buf [maxProfileHeaders + 1]upstream.Field
	r, set := c.parts(leg, buf[:0])
	return c.up.Do(ctx, r, set...)
}

// Forward sends r, a request no step serves (GET /v1/models...), to the workers as a leg of the
// decode profile, once (pipeline.Forwarder): the passthrough relays whatever it answers.
func (c *Client) Forward(ctx context.Context, r upstream.Request) (*http.Response, error) {
	return c.Do(ctx, Leg{Profile: ProfileDecode, Request: r})
}

// maxProfileHeaders is the most gateway.profile_headers the configuration accepts.
const maxProfileHeaders = 4

// Build makes the leg of one attempt (a fresh body: transfer parameters such as kv-sglang's
// bootstrap room are new for each attempt).
type Build func() (Leg, error)

// Send sends the leg build makes and, while an attempt fails without being served
// (retry.Classify), tries again on a new pick of the endpoint picker: at most
// gateway.retry.max_attempts attempts, after a jittered backoff (or the answer's Retry-After up
// to gateway.retry.max_retry_after), while the process's retry budget allows. It returns the
// last answer (the caller closes it) or the last error, an *apierror.UpstreamError; a
// retryable answer comes back once no retry is left (a 503 from a pool that stays down). Each
// retry is logged on log, counted, and recorded as an event of ctx's span.
func (c *Client) Send(ctx context.Context, log logr.Logger, build Build) (*http.Response, error) {
	return Do(ctx, c.retrier, log, func(int) (*http.Response, error) {
		leg, err := build()
		if err != nil {
			return nil, err
		}
		phase := phaseOf(leg)
		resp, err := c.Do(ctx, leg)
		if err != nil {
			return nil, retry.IfUnserved(ctx, phase, &apierror.UpstreamError{Phase: phase, Err: err})
		}
		if f, again := retry.ClassifyStatus(resp.StatusCode, upstream.RetryAfter(resp.Header)); again {
			return resp, retry.Again(phase, f, nil)
		}
		return resp, nil
	}, upstream.Discard)
}

// Fetch is Send for a leg whose answer the coordinator reads itself (encode, prefill): it
// returns the body of a 200 answer, at most gateway.max_response_size bytes, and retries a body
// that broke off or stalled too. Any other answer is an *apierror.UpstreamError with its status.
func (c *Client) Fetch(ctx context.Context, log logr.Logger, build Build) ([]byte, error) {
	return Do(ctx, c.retrier, log, func(int) ([]byte, error) {
		leg, err := build()
		if err != nil {
			return nil, err
		}
		var buf [maxProfileHeaders + 1]upstream.Field
		r, set := c.parts(leg, buf[:0])
		r.MaxResponse = c.cfg.MaxResponseBytes()
		out, err := c.up.Call(ctx, r, set...)
		return out, retry.IfUnserved(ctx, r.Phase, err)
	}, nil)
}

// parts is the leg as an upstream request (its phase defaulting to the profile, its bounds
// gateway.idle_timeout and, unless it streams, gateway.request_timeout) and the headers the
// gateway client sets, appended to set: the profile under each of gateway.profile_headers, and
// Prefer.
func (c *Client) parts(leg Leg, set []upstream.Field) (upstream.Request, []upstream.Field) {
	r := leg.Request
	r.Phase = phaseOf(leg)
	r.IdleTimeout = c.cfg.IdleTimeout.Std()
	if !leg.Stream {
		r.Timeout = c.cfg.RequestTimeout.Std()
	}
	for _, name := range c.profiles {
		set = append(set, upstream.Field{Name: name, Value: leg.Profile})
	}
	return r, append(set, upstream.Field{Name: PreferHeader, Value: leg.Prefer})
}

// phaseOf is the leg's phase, its profile when unnamed.
func phaseOf(leg Leg) string {
	if leg.Phase == "" {
		return leg.Profile
	}
	return leg.Phase
}

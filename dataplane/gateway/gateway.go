// Package gateway is the coordinator's HTTP client of the Inference Gateway: every worker leg is a
// POST to the gateway tagged with the EPP-Profile header, so the endpoint picker chooses a pod of
// that role. It also owns the header rules shared by all outbound legs.
package gateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/epd-dev/coordinator/dataplane/apierror"
	"github.com/epd-dev/coordinator/dataplane/config"
	"github.com/epd-dev/coordinator/dataplane/observe"
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
	// RequestIDHeader (x-request-id) carries the request id on every leg and in every response.
	RequestIDHeader = "X-Request-Id"
	// PreferHeader carries the conditional-decode precondition.
	PreferHeader = "Prefer"
	// PreferIfAvailable asks the decode worker to serve only if it can without prefill.
	PreferIfAvailable = "if-available"

	ProfileEncode  = "encode"
	ProfilePrefill = "prefill"
	ProfileDecode  = "decode"
)

// Worker paths.
const (
	PathChat        = "/v1/chat/completions"
	PathCompletions = "/v1/completions"
	PathGenerate    = "/inference/v1/generate"
)

// maxErrorBody is how much of a failed upstream body is kept for logs.
const maxErrorBody = 8 << 10

// Client posts legs to the gateway over a keep-alive pool. It ignores HTTP(S)_PROXY: the gateway
// is in-cluster.
type Client struct {
	base string
	http *http.Client
	tel  observe.Telemetry
}

// New builds the client for cfg. It does not contact the gateway.
func New(cfg config.Gateway, tel observe.Telemetry) (*Client, error) {
	if cfg.Address == "" {
		return nil, fmt.Errorf("gateway.address is empty")
	}
	return NewClient(cfg.Address, NewTransport(cfg), 0, tel)
}

// NewClient is a client of any base URL with the same leg and header rules (the render service
// uses it). timeout bounds each whole call; 0 leaves bodies unbounded.
func NewClient(address string, t *http.Transport, timeout time.Duration, tel observe.Telemetry) (*Client, error) {
	if err := config.ValidateBaseURL(address); err != nil {
		return nil, err
	}
	return &Client{base: strings.TrimRight(address, "/"), http: &http.Client{Transport: t, Timeout: timeout}, tel: tel}, nil
}

// NewTransport is the pooled transport used towards the gateway (and, with its own settings,
// towards side services such as render).
func NewTransport(cfg config.Gateway) *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           dialer(&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}),
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          0,
		MaxIdleConnsPerHost:   cfg.MaxIdleConnsPerHost,
		IdleConnTimeout:       cfg.IdleConnTimeout.Std(),
		ResponseHeaderTimeout: cfg.Timeout.Std(),
		ExpectContinueTimeout: time.Second,
	}
}

// BaseURL is the gateway address without a trailing slash.
func (c *Client) BaseURL() string { return c.base }

// Close drops the idle connections of the pool (used when a reload replaces the client).
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Leg is one outbound call.
type Leg struct {
	// Method defaults to POST.
	Method string
	// Path is appended to the gateway address (it may carry a query).
	Path string
	// Profile is the EPP profile (encode, prefill, decode); empty for side services.
	Profile string
	// Phase names the leg in metrics, traces and errors (defaults to Profile).
	Phase string
	// Header is the base header set (see Forwarded); Do adds Content-Type, the request id and the
	// profile without modifying it.
	Header http.Header
	// RequestID is stamped as x-request-id.
	RequestID string
	// Prefer, when set, is sent as the Prefer header.
	Prefer string
	// Body and Size are the request body and its length (-1 when unknown).
	Body io.Reader
	Size int64
	// ContentType defaults to application/json when there is a body.
	ContentType string
	// GetBody, when set, returns a fresh copy of Body, so the transport may replay the leg where
	// net/http allows it (e.g. an HTTP/2 gateway answering GOAWAY or REFUSED_STREAM).
	GetBody func() (io.ReadCloser, error)
}

// Do sends the leg and returns the raw response; the caller closes its body. Each leg is a
// client span (child of ctx) whose trace context is sent as traceparent, and its duration — to
// the end of the response body — and status are recorded per phase.
func (c *Client) Do(ctx context.Context, leg Leg) (*http.Response, error) {
	phase := leg.Phase
	if phase == "" {
		phase = leg.Profile
	}
	method := leg.Method
	if method == "" {
		method = http.MethodPost
	}
	ctx, span := c.tel.Start(ctx, "upstream "+phase, trace.SpanKindClient,
		observe.AttrPhase.String(phase), observe.AttrRequestID.String(leg.RequestID))
	req, err := http.NewRequestWithContext(ctx, method, c.base+leg.Path, leg.Body)
	if err != nil {
		observe.End(span, 0, err)
		return nil, err
	}
	req.ContentLength = leg.Size
	req.GetBody = leg.GetBody
	if leg.Body == nil || leg.Size == 0 {
		req.Body, req.GetBody = http.NoBody, nil
		req.ContentLength = 0
	}
	h := make(http.Header, len(leg.Header)+6)
	for k, v := range leg.Header {
		h[k] = v
	}
	switch {
	case leg.ContentType != "":
		h.Set("Content-Type", leg.ContentType)
	case leg.Body != nil:
		h.Set("Content-Type", "application/json")
	}
	if leg.RequestID != "" {
		h.Set(RequestIDHeader, leg.RequestID)
	}
	if leg.Profile != "" {
		h.Set(ProfileHeader, leg.Profile)
	}
	if leg.Prefer != "" {
		h.Set(PreferHeader, leg.Prefer)
	}
	observe.Inject(ctx, h)
	req.Header = h
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		c.tel.Metrics.Upstream(phase, 0, time.Since(start))
		observe.End(span, 0, err)
		return nil, err
	}
	status := resp.StatusCode
	resp.Body = &observedBody{ReadCloser: resp.Body, finish: func(err error) {
		c.tel.Metrics.Upstream(phase, status, time.Since(start))
		observe.End(span, status, err)
	}}
	return resp, nil
}

// observedBody reports the end of a response body (EOF, error or Close) exactly once.
type observedBody struct {
	io.ReadCloser
	finish func(error)
	done   bool
}

func (b *observedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !b.done {
		b.done = true
		if err == io.EOF {
			b.finish(nil)
		} else {
			b.finish(err)
		}
	}
	return n, err
}

func (b *observedBody) Close() error {
	if !b.done {
		b.done = true
		b.finish(nil)
	}
	return b.ReadCloser.Close()
}

// Call sends the leg and returns the whole response body of a 200 answer. Any other status is an
// *apierror.UpstreamError named phase, carrying the start of the body for logs.
func (c *Client) Call(ctx context.Context, phase string, leg Leg) ([]byte, error) {
	resp, err := c.Do(ctx, leg)
	if err != nil {
		return nil, &apierror.UpstreamError{Phase: phase, Err: err}
	}
	return readOK(phase, resp)
}

// readOK reads a response that must be 200 and closes it.
func readOK(phase string, resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return nil, &apierror.UpstreamError{Phase: phase, Status: resp.StatusCode, Body: b}
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, &apierror.UpstreamError{Phase: phase, Status: resp.StatusCode, Err: fmt.Errorf("reading body: %w", err)}
	}
	return b, nil
}

// hopByHop are connection-level headers never forwarded (RFC 9110 section 7.6.1).
var hopByHop = []string{
	"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// coordinatorOwned are request headers the coordinator sets itself on every leg; a client cannot
// spoof them.
var coordinatorOwned = []string{
	"Host", "Content-Length", "Content-Type", "Accept-Encoding", RequestIDHeader, ProfileHeader, ProfileHeaderNew, PreferHeader,
}

// Forwarded returns the client headers that every leg carries: all of them except hop-by-hop
// headers, headers named in Connection, and the ones the coordinator owns (Host, Content-Length,
// Content-Type, Accept-Encoding, x-request-id, EPP-Profile, Prefer). All values are kept.
func Forwarded(in http.Header) http.Header {
	out := in.Clone()
	for _, v := range in.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			out.Del(strings.TrimSpace(name))
		}
	}
	for _, k := range hopByHop {
		out.Del(k)
	}
	for _, k := range coordinatorOwned {
		out.Del(k)
	}
	return out
}

// CopyResponseHeader copies a worker's response headers to the client, minus hop-by-hop ones.
func CopyResponseHeader(dst, src http.Header) {
	for k, v := range src {
		dst[k] = v
	}
	for _, v := range src.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			dst.Del(strings.TrimSpace(name))
		}
	}
	for _, k := range hopByHop {
		dst.Del(k)
	}
}

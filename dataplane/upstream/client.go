package upstream

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/epd-dev/coordinator/dataplane/apierror"
	"github.com/epd-dev/coordinator/dataplane/config"
	"github.com/epd-dev/coordinator/dataplane/observe"
)

// maxErrorBody is how much of a failed upstream body is kept for logs.
const maxErrorBody = 8 << 10

// Client calls one base URL over a keep-alive pool: the gateway's legs and side services (render).
type Client struct {
	base string
	http *http.Client
	tel  observe.Telemetry
}

// NewClient is a client of base (an http or https URL). timeout bounds each whole call; 0 leaves
// bodies unbounded (streams).
func NewClient(base string, t *http.Transport, timeout time.Duration, tel observe.Telemetry) (*Client, error) {
	if err := config.ValidateBaseURL(base); err != nil {
		return nil, err
	}
	return &Client{base: strings.TrimRight(base, "/"), http: &http.Client{Transport: t, Timeout: timeout}, tel: tel}, nil
}

// Close drops the idle connections of the pool (when a reload replaces the client).
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Request is one outbound call.
type Request struct {
	// Method defaults to POST.
	Method string
	// Path is appended to the base URL (it may carry a query).
	Path string
	// Phase names the call in metrics, traces and errors.
	Phase string
	// Header is the base header set (see Forwarded); Do adds its own headers without modifying it.
	Header http.Header
	// RequestID is stamped as x-request-id.
	RequestID string
	// Body and Size are the request body and its length (-1 when unknown).
	Body io.Reader
	Size int64
	// ContentType defaults to application/json when there is a body.
	ContentType string
	// GetBody, when set, returns a fresh copy of Body, so the transport may replay the call where
	// net/http allows it (e.g. an HTTP/2 peer answering GOAWAY or REFUSED_STREAM).
	GetBody func() (io.ReadCloser, error)
}

// Field is a header a caller sets on one call on top of Request.Header.
type Field struct{ Name, Value string }

// Do sends the request and returns the raw response; the caller closes its body. set adds headers
// (empty values are skipped). Each call is a client span (child of ctx) whose trace context is sent
// as traceparent, and its duration, to the end of the response body, and status are recorded per
// phase.
func (c *Client) Do(ctx context.Context, r Request, set ...Field) (*http.Response, error) {
	method := r.Method
	if method == "" {
		method = http.MethodPost
	}
	ctx, span := c.tel.Start(ctx, "upstream "+r.Phase, trace.SpanKindClient,
		observe.AttrPhase.String(r.Phase), observe.AttrRequestID.String(r.RequestID))
	req, err := http.NewRequestWithContext(ctx, method, c.base+r.Path, r.Body)
	if err != nil {
		if rc, ok := r.Body.(io.Closer); ok {
			rc.Close() // as the transport would have
		}
		observe.End(span, 0, err)
		return nil, err
	}
	req.ContentLength = r.Size
	req.GetBody = r.GetBody
	if r.Body == nil || r.Size == 0 {
		req.Body, req.GetBody = http.NoBody, nil
		req.ContentLength = 0
	}
	h := make(http.Header, len(r.Header)+4+len(set))
	for k, v := range r.Header {
		h[k] = v
	}
	switch {
	case r.ContentType != "":
		h.Set("Content-Type", r.ContentType)
	case r.Body != nil:
		h.Set("Content-Type", "application/json")
	}
	if r.RequestID != "" {
		h.Set(RequestIDHeader, r.RequestID)
	}
	for _, f := range set {
		if f.Value != "" {
			h.Set(f.Name, f.Value)
		}
	}
	observe.Inject(ctx, h)
	req.Header = h
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		c.tel.Metrics.Upstream(r.Phase, 0, time.Since(start))
		observe.End(span, 0, err)
		return nil, err
	}
	status := resp.StatusCode
	resp.Body = &observedBody{ReadCloser: resp.Body, finish: func(err error) {
		c.tel.Metrics.Upstream(r.Phase, status, time.Since(start))
		observe.End(span, status, err)
	}}
	return resp, nil
}

// Call sends the request and returns the whole body of a 200 answer. A failed call or any other
// status is an *apierror.UpstreamError named after the phase, carrying the start of the body for
// logs.
func (c *Client) Call(ctx context.Context, r Request, set ...Field) ([]byte, error) {
	resp, err := c.Do(ctx, r, set...)
	if err != nil {
		return nil, &apierror.UpstreamError{Phase: r.Phase, Err: err}
	}
	return ReadOK(r.Phase, resp)
}

// ReadOK reads a response that must be 200 and closes it (see Call).
func ReadOK(phase string, resp *http.Response) ([]byte, error) {
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

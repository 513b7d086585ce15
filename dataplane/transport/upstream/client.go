package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
)

// maxErrorBody is how much of a failed upstream body is kept for logs.
const maxErrorBody = 8 << 10

// Client calls one base URL over a keep-alive pool: the gateway's legs and side services (render).
// A plain-HTTP base is served by this package's own HTTP/1.1 transport (no goroutine per
// connection, a leg in one vectored write); an https one by net/http's (TLS, HTTP/2).
type Client struct {
	base string
	http *http.Client
	h1   *h1Transport // nil for an https base
	tel  observe.Telemetry
}

// NewClient is a client of base (an http or https URL) with a transport tuned by o. timeout
// bounds each whole call; 0 leaves bodies unbounded (streams). Redirects are not followed: a
// redirect is the answer.
func NewClient(base string, o TransportOptions, timeout time.Duration, tel observe.Telemetry) (*Client, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%q is not an http:// or https:// base URL", base) // config.ValidateBaseURL says why
	}
	c := &Client{base: strings.TrimRight(base, "/"), tel: tel}
	var rt http.RoundTripper
	if u.Scheme == "http" {
		c.h1 = newH1Transport(o, dialerOf(o).DialContext)
		rt = c.h1
	} else {
		rt = NewTransport(o)
	}
	c.http = &http.Client{Transport: rt, Timeout: timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return c, nil
}

// Close drops the idle connections of the pool, and the others as their calls end (when a
// reload replaces the client).
func (c *Client) Close() {
	if c.h1 != nil {
		c.h1.close()
		return
	}
	c.http.CloseIdleConnections()
}

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
	// ParentID, when set, is stamped as x-coordinator-request-id: the client request's id, on a
	// leg whose RequestID is its own.
	ParentID string
	// Body and Size are the request body and its length (-1 when unknown).
	Body io.Reader
	Size int64
	// ContentType defaults to application/json when there is a body.
	ContentType string
	// GetBody, when set, returns a fresh copy of Body, so the transport may replay the call where
	// net/http allows it (e.g. an HTTP/2 peer answering GOAWAY or REFUSED_STREAM).
	GetBody func() (io.ReadCloser, error)
	// IdleTimeout, when positive, bounds the silence between two reads of the answer's body
	// (time blocked in Read, not time the caller spends elsewhere): past it the call is
	// cancelled and the read fails with ErrIdle.
	IdleTimeout time.Duration
	// Timeout, when positive, bounds the whole call, to the end of the answer's body: past it
	// the call is cancelled and fails with ErrDeadline.
	Timeout time.Duration
	// MaxResponse, when positive, bounds the body Call reads (ErrResponseTooLarge past it).
	MaxResponse int64
	// OnAnswer, when set, is called with the headers of an answer below 400, before Do returns.
	OnAnswer func(http.Header)
}

// ErrIdle fails a call whose worker sent nothing for longer than Request.IdleTimeout.
var ErrIdle = errors.New("the worker sent nothing for longer than the idle timeout")

// ErrDeadline fails a call that ran past Request.Timeout.
var ErrDeadline = errors.New("the call ran past its timeout")

// ErrResponseTooLarge fails a call whose answer is larger than Request.MaxResponse.
var ErrResponseTooLarge = errors.New("the answer is larger than the limit")

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
	// One allocation holds the call's state to the end of its body: cancellation with a cause,
	// the timers, and what is reported when it ends.
	call := &observedBody{c: c, phase: r.Phase, span: span, idle: r.IdleTimeout}
	ctx, call.cancel = context.WithCancelCause(ctx)
	call.ctx = ctx
	if r.Timeout > 0 {
		call.deadline = time.Now().Add(r.Timeout)
	}
	if first := firstCheck(r.Timeout, r.IdleTimeout); first > 0 {
		t := time.AfterFunc(math.MaxInt64, call.fire) // armed once fire can find it
		call.timer.Store(t)
		t.Reset(first)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+r.Path, r.Body)
	if err != nil {
		if rc, ok := r.Body.(io.Closer); ok {
			rc.Close() // as the transport would have
		}
		call.stop()
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
	if r.ParentID != "" {
		h.Set(CoordinatorRequestIDHeader, r.ParentID)
	}
	for _, f := range set {
		if f.Value != "" {
			h.Set(f.Name, f.Value)
		}
	}
	observe.Inject(ctx, h)
	req.Header = h
	call.start = time.Now()
	c.tel.Metrics.LegSent(r.Phase)
	resp, err := c.http.Do(req)
	if err != nil {
		err = causeOf(ctx, err)
		call.stop()
		c.tel.Metrics.LegEnded(r.Phase)
		c.tel.Metrics.Upstream(r.Phase, 0, time.Since(call.start))
		observe.End(span, 0, err)
		return nil, err
	}
	c.tel.Metrics.LegAnswered(r.Phase, time.Since(call.start))
	call.status, call.ReadCloser = resp.StatusCode, resp.Body
	resp.Body = call
	if r.OnAnswer != nil && resp.StatusCode < 400 {
		r.OnAnswer(resp.Header)
	}
	return resp, nil
}

// causeOf is err, or the reason the call's context was cancelled (ErrIdle, ErrDeadline) when
// that is what failed it.
func causeOf(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && (errors.Is(cause, ErrIdle) || errors.Is(cause, ErrDeadline)) {
		return fmt.Errorf("%w (%w)", cause, err)
	}
	return err
}

// Call sends the request and returns the whole body of a 200 answer. A failed call or any other
// status is an *apierror.UpstreamError named after the phase, carrying the start of the body for
// logs.
func (c *Client) Call(ctx context.Context, r Request, set ...Field) ([]byte, error) {
	resp, err := c.Do(ctx, r, set...)
	if err != nil {
		return nil, &apierror.UpstreamError{Phase: r.Phase, Err: err}
	}
	return ReadOK(r.Phase, resp, r.MaxResponse)
}

// ReadOK reads a response that must be 200, at most limit bytes of it when limit is positive,
// and closes it (see Call). Any other status is an *apierror.UpstreamError carrying the start of
// the body (for logs and the worker's own message) and the answer's Retry-After.
func ReadOK(phase string, resp *http.Response, limit int64) ([]byte, error) {
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, ErrorOf(phase, resp)
	}
	if limit > 0 && resp.ContentLength > limit {
		return nil, &apierror.UpstreamError{Phase: phase, Status: resp.StatusCode,
			Err: fmt.Errorf("%w: Content-Length %d, the limit is %d bytes", ErrResponseTooLarge, resp.ContentLength, limit)}
	}
	var src io.Reader = resp.Body
	if limit > 0 {
		src = io.LimitReader(resp.Body, limit+1)
	}
	var buf bytes.Buffer
	if n := resp.ContentLength; n > 0 {
		buf.Grow(int(n) + bytes.MinRead)
	}
	if _, err := buf.ReadFrom(src); err != nil {
		return nil, &apierror.UpstreamError{Phase: phase, Status: resp.StatusCode, Err: fmt.Errorf("reading body: %w", err)}
	}
	if limit > 0 && int64(buf.Len()) > limit {
		return nil, &apierror.UpstreamError{Phase: phase, Status: resp.StatusCode,
			Err: fmt.Errorf("%w: over %d bytes", ErrResponseTooLarge, limit)}
	}
	return buf.Bytes(), nil
}

// ErrorOf reads the start of a failed answer (for logs and the worker's own message), closes
// it, and returns it as an *apierror.UpstreamError with its status, content type and
// Retry-After.
func ErrorOf(phase string, resp *http.Response) *apierror.UpstreamError {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	return &apierror.UpstreamError{Phase: phase, Status: resp.StatusCode, Body: b,
		ContentType: resp.Header.Get("Content-Type"), RetryAfter: RetryAfter(resp.Header)}
}

// retryAfterCap bounds a parsed Retry-After (a day), whatever a peer sends.
const retryAfterCap = 24 * time.Hour

// RetryAfter parses a Retry-After header in whole seconds or as an HTTP date, at most a day; 0
// when absent or invalid.
func RetryAfter(h http.Header) time.Duration {
	v := h.Get("Retry-After")
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseUint(v, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		if s >= uint64(retryAfterCap/time.Second) { // also what overflows
			return retryAfterCap
		}
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(time.Until(t), 0), retryAfterCap)
	}
	return 0
}

// observedBody is a call's response body: it reports the end of the body (EOF, error or Close)
// exactly once, and enforces the call's bounds: the idle timer runs only while a Read waits for
// the worker, the deadline from the request on.
type observedBody struct {
	io.ReadCloser
	c      *Client
	phase  string
	span   trace.Span
	start  time.Time
	status int
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   bool

	// One timer serves both bounds. A Read only stores when it started waiting (no timer call
	// per read, which a stream makes per event): the timer, armed for the deadline or an idle
	// period, checks on firing and re-arms for what is left.
	idle     time.Duration
	deadline time.Time                  // zero: none
	waiting  atomic.Int64               // UnixNano when the running Read started waiting, 0 between reads
	timer    atomic.Pointer[time.Timer] // written by Do, read by fire on the timer's goroutine
	stopped  atomic.Bool
}

// firstCheck is when a call's timer first fires: at its timeout or an idle period, the nearer
// (0: no timer).
func firstCheck(timeout, idle time.Duration) time.Duration {
	switch {
	case timeout > 0 && idle > 0:
		return min(timeout, idle)
	case timeout > 0:
		return timeout
	}
	return max(idle, 0)
}

// fire cancels the call when it crossed a bound and re-arms the timer otherwise (the timer's
// callback).
func (b *observedBody) fire() {
	if b.stopped.Load() {
		return
	}
	now := time.Now()
	if !b.deadline.IsZero() && !now.Before(b.deadline) {
		b.cancel(ErrDeadline)
		return
	}
	next := time.Duration(math.MaxInt64)
	if b.idle > 0 {
		next = b.idle
		if since := b.waiting.Load(); since != 0 {
			waited := now.Sub(time.Unix(0, since))
			if waited >= b.idle {
				b.cancel(ErrIdle)
				return
			}
			next = b.idle - waited
		}
	}
	if !b.deadline.IsZero() {
		next = min(next, b.deadline.Sub(now))
	}
	if t := b.timer.Load(); t != nil {
		t.Reset(next)
	}
}

// stop releases the call's timer and context.
func (b *observedBody) stop() {
	b.stopped.Store(true)
	if t := b.timer.Load(); t != nil {
		t.Stop()
	}
	b.cancel(context.Canceled)
}

// finish reports the end of the body.
func (b *observedBody) finish(err error) {
	b.stop()
	b.c.tel.Metrics.LegEnded(b.phase)
	b.c.tel.Metrics.Upstream(b.phase, b.status, time.Since(b.start))
	observe.End(b.span, b.status, err)
}

func (b *observedBody) Read(p []byte) (int, error) {
	if b.idle > 0 {
		b.waiting.Store(time.Now().UnixNano())
	}
	n, err := b.ReadCloser.Read(p)
	if b.idle > 0 {
		b.waiting.Store(0)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		err = causeOf(b.ctx, err)
	}
	if err != nil && !b.done {
		b.done = true
		if errors.Is(err, io.EOF) {
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

package server

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/media"
	"github.com/epd-dev/coordinator/dataplane/ratelimit"
	"github.com/epd-dev/coordinator/dataplane/server/conn"
	"github.com/epd-dev/coordinator/dataplane/state/bodybuf"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/dataplane/transport/retry"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
	"github.com/epd-dev/coordinator/dataplane/wire"
)

func errNoPipeline() *apierror.Error {
	return &apierror.Error{Status: http.StatusServiceUnavailable, Type: apierror.TypeUnavailable, Code: "not_ready", Message: "no pipeline is loaded"}
}

// routePassthrough labels the passthrough's requests in the metrics.
const routePassthrough = "passthrough"

// handleInference runs a request of a client API (wire.Client: chat, completions, generate, the
// Responses API, Anthropic's Messages) through the current pipeline, or its canary
// (Pipeline.Pick, once the body parsed), in the API's format. The pipeline is acquired once: a
// reload during the request does not affect it. The request body's buffer is held until the
// handler returns and by every leg body until it has been sent.
func (s *Server) handleInference(c echo.Context) error {
	client := wire.ClientFor(c.Request().URL.Path)
	format := client.Format()
	x := exchangeOf(c)
	ctx := s.observe(c, x, client.Route())
	held, release := s.holder.Acquire()
	defer release()
	if held == nil {
		return errNoPipeline()
	}
	req := c.Request()
	if h := held.Config().Server.MetricsTenantHeader; h != "" {
		x.tenanted, x.tenant = true, req.Header.Get(h)
	}
	buf, err := readBody(c, held.Config().Server.MaxRequestBodyBytes())
	if err != nil {
		return err
	}
	defer buf.Release()
	x.reqBytes = len(buf.Bytes())
	parsed, err := client.Parse(buf.Bytes(), limits(held.Config()))
	if err != nil {
		return err
	}
	x.model = parsed.Model
	x.parse = time.Since(x.start)
	x.metrics.Model(parsed.Model)
	// The request runs wholly on one pipeline; the server settings are the same on both.
	p := held.Pick()
	x.pipe = p
	if format.Media() != nil && !p.GuardsMedia() {
		if err := media.RefuseRemote(buf.Bytes()); err != nil {
			return err
		}
	}
	fwd := forwarded(p.Config(), req.Header)
	if fwd == nil {
		fwd = http.Header{}
	}
	p.Stamp(fwd, gateway.PipelineRevisionHeader)
	var limit ratelimit.Decision
	rateLimit := held.Config().RateLimit
	if rateLimit != nil {
		// The tenant's value only selects a configured bucket: it is never stored or labelled.
		tenant := req.Header.Get(rateLimit.Header(held.Config().Server.MetricsTenantHeader))
		limit = s.limiter.Check(ctx, rateLimit, tenant, estimateTokens(len(buf.Bytes())))
		limit.SetHeaders(c.Response().Header())
		if !limit.Allowed {
			return limit.Error()
		}
		if limit.Objective != "" {
			fwd.Set(gateway.ObjectiveHeader, limit.Objective) // the tenant's priority tier, over any client's
		}
	}
	if parsed.Stream {
		// Streams may legitimately outlive write_timeout; the timeout stays for non-stream answers.
		_ = http.NewResponseController(c.Response().Writer).SetWriteDeadline(time.Time{})
	}
	rc := &request.Context{
		ID:              x.id,
		API:             format.API(),
		Path:            format.Path(),
		Header:          req.Header,
		Forwarded:       fwd,
		ForwardResponse: p.ForwardResponse(),
		Body:            parsed.Body,
		Buffer:          buf,
		Model:           parsed.Model,
		Stream:          parsed.Stream,
		Writer:          parsed.Writer(c.Response(), x.id),
		Log:             logging.WithValuesLazily(s.log, "request_id", x.id),
	}
	x.rc, x.revision = rc, p.Revision()
	if limit.Reserved > 0 {
		rc.ReadAnswer = true
		if x.metrics == nil {
			format.AskUsage(rc) // the tokens are settled from the usage
		}
		defer s.settle(ctx, c, limit, rc)
	}
	if x.metrics != nil {
		format.AskUsage(rc) // the tokens are counted from the usage; a client that did not ask does not see it
		if parsed.Stream {
			rc.OnEvents = x.metrics.Events // not for force_stream: its client gets no events
		}
		c.Response().After(x.sent(c.Response()))
	}
	ctx = retry.WithRequestLimit(ctx, p.Config().Gateway.Retry.MaxRetriesPerRequest)
	if p.Config().Server.ServerTiming {
		// Whoever writes the response (the relay, a step, the error) writes the timings so far.
		c.Response().Before(func() { c.Response().Header().Set("Server-Timing", rc.ServerTiming()) })
	}
	if err := parsed.Finish(p.Execute(ctx, rc)); err != nil {
		return err // after the response started, only the log can tell (the relay logged it)
	}
	if !c.Response().Committed {
		// Only possible if a step returned without writing; never leave the client hanging.
		return &apierror.Error{Status: http.StatusBadGateway, Type: apierror.TypeAPI, Code: "no_response", Message: "the pipeline produced no response"}
	}
	return nil
}

// estimateTokens is a prompt's tokens reserved up front from its request body's size: about
// four bytes a token for text (media over-reserve; the answer's usage settles it).
func estimateTokens(bodyBytes int) int64 { return int64(bodyBytes+3) / 4 }

// settle corrects the tokens the rate limit reserved for rc to the answer's usage (prompt plus
// completion), after the answer was flushed to the client: the reservation stands for an answer
// served without usage, and is returned for a request that failed before a worker answered.
func (s *Server) settle(ctx context.Context, c echo.Context, d ratelimit.Decision, rc *request.Context) {
	resp := c.Response()
	used := int64(0)
	switch {
	case rc.Answer.HasUsage:
		used = rc.Answer.PromptTokens + rc.Answer.CompletionTokens
	case resp.Committed && resp.Status < http.StatusBadRequest:
		used = d.Reserved
	}
	if resp.Committed {
		_ = http.NewResponseController(resp.Writer).Flush()
	}
	s.limiter.Settle(ctx, d, used)
}

// limits are the bounds of cfg a client's request is parsed and answered within.
func limits(cfg config.Config) wire.Limits {
	return wire.Limits{MaxContentBlocks: cfg.Server.ContentBlocks(), MaxEvent: cfg.Gateway.MaxEventBytes()}
}

// forwarded is the client header set every leg carries: gateway.Forwarded, or
// gateway.ForwardedTrusted under server.trusted_routing_headers, without the client's values of
// pipeline.forward_response_headers (only a phase's answer sets those). It is taken before any
// step runs, so that a step's own routing headers (the async broker's objective) are kept.
func forwarded(cfg config.Config, h http.Header) http.Header {
	var out http.Header
	if cfg.Server.TrustedRoutingHeaders {
		out = gateway.ForwardedTrusted(h)
	} else {
		out = gateway.Forwarded(h)
	}
	for _, name := range cfg.Pipeline.ForwardResponseHeaders {
		out.Del(name)
	}
	return out
}

// handlePassthrough serves any other /v1 request: a route of a pipeline step when one matches,
// otherwise it forwards the request (e.g. GET /v1/models) to the gateway with the decode profile,
// preserving method, query, headers and body, and streams the answer back.
func (s *Server) handlePassthrough(c echo.Context) error {
	p, release := s.holder.Acquire()
	defer release()
	if p == nil {
		return errNoPipeline()
	}
	if h, ok := p.Handler(c.Request()); ok {
		// A step of the current pipeline serves this path (e.g. async results).
		h.ServeHTTP(c.Response(), c.Request())
		return nil
	}
	fwdr := p.Forwarder()
	if fwdr == nil {
		return &apierror.Error{Status: http.StatusNotFound, Type: apierror.TypeNotFound, Code: "not_found", Message: "no such route (no gateway is configured)"}
	}
	x := exchangeOf(c)
	ctx := s.observe(c, x, routePassthrough)
	req := c.Request()
	limit := p.Config().Server.MaxRequestBodyBytes()
	if req.ContentLength > limit {
		return apierror.TooLarge(limit)
	}
	x.reqBytes = int(max(req.ContentLength, 0))
	rw := http.NewResponseController(c.Response().Writer)
	_ = rw.SetWriteDeadline(time.Time{})
	leg := upstream.Request{
		Method:      req.Method,
		Path:        req.URL.RequestURI(),
		Phase:       routePassthrough,
		Header:      forwarded(p.Config(), req.Header),
		RequestID:   x.id,
		ContentType: req.Header.Get("Content-Type"),
	}
	switch {
	case req.ContentLength != 0 && (upstream.IsJSON(leg.ContentType) || leg.ContentType == ""):
		// A JSON body (or one without a Content-Type: the leg labels it JSON) is read first: no
		// remote URL may reach a worker that would fetch it itself
		// (the Responses, Messages and embeddings APIs take image URLs), past the media guard.
		buf, err := readBody(c, limit)
		if err != nil {
			return err
		}
		defer buf.Release()
		if where, found := media.RemoteURL(buf.Bytes()); found {
			return apierror.InvalidField(where, "%s: remote URLs are refused on %s: send the media inline as a data: URL "+
				"(only /v1/chat/completions downloads them, through the media guard)", where, req.URL.Path)
		}
		bufs := net.Buffers{buf.Bytes()}
		leg.Body, leg.Size = buf.Open(bufs), int64(len(buf.Bytes()))
	case req.ContentLength != 0:
		// The body streams upstream while the answer streams back (see EnableFullDuplex). A
		// body read whole first (above) must not be full duplex: net/http then neither drains
		// nor closes after a 413 answered before the body was read.
		_ = rw.EnableFullDuplex()
		// net/http's own writer: hitting the limit then closes the connection after the 413.
		leg.Body, leg.Size = http.MaxBytesReader(c.Response().Writer, req.Body, limit), req.ContentLength
	}
	resp, err := fwdr.Forward(ctx, leg) //nolint:bodyclose // upstream.Relay closes it
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return apierror.TooLarge(limit)
		}
		if e := conn.BodyError(req); e != nil {
			// The client's body failed, not the gateway; the rest of it may still come.
			c.Response().Header().Set("Connection", "close")
			return e
		}
		return &apierror.UpstreamError{Phase: routePassthrough, Err: err}
	}
	if err := upstream.Relay(c.Response(), resp, x.id, false, p.ForwardResponse()); err != nil {
		if errors.Is(err, upstream.ErrNotStarted) {
			return &apierror.UpstreamError{Phase: routePassthrough, Err: err}
		}
		s.log.V(logging.Verbose).Info("passthrough response ended early", "request_id", x.id, "err", err.Error())
		return err // the response is cut: the connection is aborted
	}
	return nil
}

// readBody reads the whole request body under limit. A body the client failed to send is the
// client's error (408 when it timed out), and the connection closes: the rest may still come.
func readBody(c echo.Context, limit int64) (*bodybuf.Buffer, error) {
	buf, err := bodybuf.Read(c.Request(), limit)
	if err != nil {
		if e := conn.BodyError(c.Request()); e != nil {
			c.Response().Header().Set("Connection", "close")
			return nil, e
		}
		return nil, err
	}
	return buf, nil
}

package server

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/trace"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
	"github.com/epd-dev/coordinator/dataplane/wire"
)

// exchange is one request as the server sees it: its id, what the handler learned about it, and
// how it ended. The outcome is worked out once (settle) and read by everything that reports it:
// the metrics, the span, the step-timings log, the error log and body, and the access log.
type exchange struct {
	id    string
	start time.Time

	// Set by observed handlers (observe): the metrics and the server span, ended at settle.
	metrics *observe.Request
	span    trace.Span
	// model and reqBytes are what the handler read from the request.
	model    string
	reqBytes int
	// parse is the time from start until the body was read and parsed (the llm-d overhead metric).
	parse time.Duration
	// firstByte is the time from start until the first byte of the answer was written (0: none).
	firstByte time.Duration
	// tenanted says server.metrics_tenant_header is configured, tenant is the request's value.
	tenanted bool
	tenant   string
	// rc and revision are the pipeline's view of the request, for the step-timings log; pipe is
	// the pipeline it runs on (stable or canary), whose tally and series count it.
	rc       *request.Context
	revision string
	pipe     *pipeline.Pipeline

	// The outcome: the status the client got (or gets), the client-facing error when the response
	// was not yet written, and what the handler returned.
	status int
	apiErr *apierror.Error
	cause  error
}

const ctxExchange = "exchange"

// exchangeOf returns the request's exchange (set by the server's middleware).
func exchangeOf(c echo.Context) *exchange {
	x, _ := c.Get(ctxExchange).(*exchange)
	return x
}

// settle works out the outcome of the handler's error.
func (x *exchange) settle(c echo.Context, err error) {
	x.cause = err
	x.status = c.Response().Status
	if err != nil && !c.Response().Committed {
		x.apiErr = apierror.From(echoToAPI(err))
		x.status = x.apiErr.Status
	}
}

// observe starts the request's metrics and server span (continuing the client's trace context)
// for route; both end when the exchange is reported. It returns the span's context.
func (s *Server) observe(c echo.Context, x *exchange, route string) context.Context {
	req := c.Request()
	ctx := observe.Extract(req.Context(), req.Header)
	ctx, x.span = s.tel.Start(ctx, req.Method+" "+req.URL.Path, trace.SpanKindServer, //nolint:spancheck // ended in report
		observe.AttrRequestID.String(x.id), observe.AttrPhase.String(route))
	x.metrics = s.tel.Metrics.StartRequest(route)
	return ctx
}

// report writes the error response, if any, and reports the settled exchange to every consumer.
func (s *Server) report(c echo.Context, x *exchange) {
	if x.apiErr != nil {
		s.logFailure(x)
		apierror.WriteAs(c.Response(), x.apiErr, x.id, wire.ErrorFormat(c.Request().URL.Path))
	}
	if x.metrics != nil {
		x.metrics.Done(x.requestEnd(int(c.Response().Size)))
	}
	if x.pipe != nil {
		outcome := observe.PipelineOutcome(x.status, x.cut(c))
		x.pipe.Tally().Record(outcome == observe.OutcomeError)
		s.tel.Metrics.PipelineRequest(x.pipe.Track(), x.pipe.PipelineRevision(), outcome)
	}
	if x.span != nil {
		if x.span.IsRecording() {
			x.span.SetAttributes(observe.ModelAttr(x.model))
			if x.pipe != nil {
				x.span.SetAttributes(observe.AttrPipelineTrack.String(x.pipe.Track()), observe.AttrPipelineRevision.String(x.pipe.PipelineRevision()))
			}
		}
		var spanErr error
		if x.status >= 500 {
			spanErr = x.cause
		}
		observe.End(x.span, x.status, spanErr)
	}
	if x.rc != nil {
		if l := x.rc.Log.V(logging.Info); l.Enabled() {
			l.Info("pipeline step timings", append([]any{"path", x.rc.Path, "model", observe.ShortModel(x.model), "stream", x.rc.Stream, "status", x.status,
				"revision", x.revision, "track", x.pipe.Track(), "pipeline_revision", x.pipe.PipelineRevision(), "total", time.Since(x.start).String()},
				x.rc.TimingSummary()...)...)
		}
		if ctxErr := c.Request().Context().Err(); x.apiErr != nil && ctxErr != nil && errors.Is(x.cause, ctxErr) {
			x.rc.Log.V(logging.Verbose).Info("client cancelled the request", "err", x.cause.Error())
		}
	}
	if log := s.log.V(logging.Debug); log.Enabled() {
		req := c.Request()
		log.Info("request", "method", req.Method, "path", req.URL.Path, "status", x.status,
			"duration", time.Since(x.start).String(), "request_id", x.id,
			"content_type", req.Header.Get("Content-Type"), "epp_profile", req.Header.Get(gateway.ProfileHeader),
			"prefer", req.Header.Get(gateway.PreferHeader))
	}
}

// cut reports a response that started and then failed while its client was still there: a
// failed write to the client, or a client whose context ended by the time the request did
// (whatever error its leg then returned: a cancelled body read is not always the context's
// error), is the client's leaving, not the pipeline's failure.
func (x *exchange) cut(c echo.Context) bool {
	if x.cause == nil || x.apiErr != nil || errors.Is(x.cause, upstream.ErrClientGone) {
		return false
	}
	return c.Request().Context().Err() == nil
}

// logFailure logs a failed request: server-side and upstream failures as errors, an upstream's
// rejection as a warning. Upstream bodies are for the logs only; the client gets a sanitised
// message.
func (s *Server) logFailure(x *exchange) {
	kv := []any{"request_id", x.id, "status", x.status}
	var up *apierror.UpstreamError
	if errors.As(x.cause, &up) && len(up.Body) > 0 {
		kv = append(kv, "upstream_status", up.Status, "upstream_body", logging.RedactJSON(up.Body))
	}
	switch {
	case x.status >= 500:
		s.log.Error(x.cause, "request failed", kv...)
	case up != nil:
		s.log.V(logging.Warn).Info("upstream rejected the request", append(kv, "error", x.cause.Error())...)
	}
}

// sent is the response hook that records when the first byte of the answer was written.
func (x *exchange) sent(r *echo.Response) func() {
	return func() {
		if x.firstByte == 0 && r.Size > 0 {
			x.firstByte = time.Since(x.start)
		}
	}
}

// requestEnd is what the metrics record of the settled exchange.
func (x *exchange) requestEnd(responseBytes int) observe.RequestEnd {
	e := observe.RequestEnd{Model: x.model, Status: x.status, RequestBytes: x.reqBytes, ResponseBytes: responseBytes,
		ErrorCode: observe.ErrorCode(x.cause, x.status), Tenanted: x.tenanted, Tenant: x.tenant}
	rc := x.rc
	if rc == nil {
		return e
	}
	e.Ran, e.Stream, e.InputTokens = true, rc.Stream, rc.TokenCount()
	if e.ErrorCode == "" && x.status != http.StatusAccepted { // a 202 was queued (async broker): nothing ran yet
		e.Path = executionPath(rc)
	}
	for _, m := range rc.Media {
		if m.Kind == "image_url" {
			e.Images++
		} else {
			e.OtherMedia++
		}
	}
	e.FirstByte = x.firstByte
	if !rc.PrefillEnd.IsZero() && x.firstByte > 0 {
		e.PrefillToFirstByte = max(x.start.Add(x.firstByte).Sub(rc.PrefillEnd), 0)
	}
	if a := rc.Answer; a.HasUsage {
		e.HasUsage, e.PromptTokens, e.CompletionTokens, e.CachedTokens = true, a.PromptTokens, a.CompletionTokens, a.CachedTokens
	}
	e.TargetModel = rc.Answer.Model
	e.Overhead = time.Since(x.start) - x.parse
	for _, t := range rc.Timings {
		e.Overhead -= t.Duration
	}
	return e
}

// executionPath is the path a served request ran: encode-prefill-decode when prefill got encoder
// outputs (encode ran), prefill-decode when it was prefilled, else decode-only (a conditional-decode
// hit, a degraded request, or a pipeline without prefill).
func executionPath(rc *request.Context) string {
	switch {
	case rc.Prefilled && len(rc.ECParams) > 0:
		return observe.PathEncodePrefillDecode
	case rc.Prefilled:
		return observe.PathPrefillDecode
	}
	return observe.PathDecodeOnly
}

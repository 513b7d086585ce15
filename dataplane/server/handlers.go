package server

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/trace"

	"github.com/epd-dev/coordinator/dataplane/apierror"
	"github.com/epd-dev/coordinator/dataplane/gateway"
	"github.com/epd-dev/coordinator/dataplane/logging"
	"github.com/epd-dev/coordinator/dataplane/observe"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
)

func errNoPipeline() *apierror.Error {
	return &apierror.Error{Status: http.StatusServiceUnavailable, Type: apierror.TypeUnavailable, Code: "not_ready", Message: "no pipeline is loaded"}
}

// Route labels of the request metrics.
const (
	routeChat        = "chat"
	routeCompletions = "completions"
	routeGenerate    = "generate"
	routePassthrough = "passthrough"
)

var routeOf = map[pipeline.API]string{pipeline.APIChat: routeChat, pipeline.APICompletions: routeCompletions, pipeline.APIGenerate: routeGenerate}

// observed wraps a handler body in the request's server span and metrics. The client's trace
// context (traceparent) is continued; run receives the span's context.
func (s *Server) observed(c echo.Context, route string, run func(ctx context.Context, model *string, reqBytes *int) error) error {
	req := c.Request()
	id, _ := c.Get(ctxRequestID).(string)
	ctx := observe.Extract(req.Context(), req.Header)
	ctx, span := s.tel.Start(ctx, req.Method+" "+req.URL.Path, trace.SpanKindServer,
		observe.AttrRequestID.String(id), observe.AttrPhase.String(route))
	finish := s.tel.Metrics.RequestStarted(route)
	var model string
	var reqBytes int
	err := run(ctx, &model, &reqBytes)
	status := c.Response().Status
	if err != nil && !c.Response().Committed {
		status = apierror.From(echoToAPI(err)).Status
	}
	finish(model, status, reqBytes, int(c.Response().Size))
	if span.IsRecording() {
		span.SetAttributes(observe.AttrModel.String(model))
	}
	var spanErr error
	if status >= 500 {
		spanErr = err
	}
	observe.End(span, status, spanErr)
	return err
}

// handleInference runs a chat, completions or generate request through the current pipeline. The
// pipeline is acquired once: a reload during the request does not affect it.
func (s *Server) handleInference(c echo.Context) error {
	api := pipeline.APIForPath(c.Request().URL.Path)
	return s.observed(c, routeOf[api], func(ctx context.Context, modelOut *string, reqBytes *int) error {
		start := time.Now()
		p, release := s.holder.Acquire()
		defer release()
		if p == nil {
			return errNoPipeline()
		}
		req := c.Request()
		id, _ := c.Get(ctxRequestID).(string)
		raw, release, err := readBody(req, p.Config().Server.MaxRequestBodyBytes())
		*reqBytes = len(raw)
		if err != nil {
			return err
		}
		var rc *pipeline.RequestContext
		defer func() {
			// The buffer goes back to the pool only when every leg finished reading its body: a
			// transport may still be sending one after the response arrived.
			if rc == nil || rc.BodiesSettled() {
				release()
			}
		}()
		obj, model, stream, err := parseBody(raw, api)
		*modelOut = model
		if err != nil {
			return err
		}
		if stream {
			// Streams may legitimately outlive write_timeout; the timeout stays for non-stream answers.
			_ = http.NewResponseController(c.Response().Writer).SetWriteDeadline(time.Time{})
		}
		log := logging.WithValuesLazily(s.log, "request_id", id)
		rc = &pipeline.RequestContext{
			ID:        id,
			API:       api,
			Path:      req.URL.Path,
			Header:    req.Header,
			Forwarded: gateway.Forwarded(req.Header),
			Body:      obj,
			Model:     model,
			Stream:    stream,
			Writer:    c.Response(),
			Log:       log,
		}
		timing := p.Config().Server.ServerTiming
		if timing {
			rc.OnResponse = func(_ int, h http.Header) { h.Set("Server-Timing", rc.ServerTiming()) }
		}
		err = p.Execute(ctx, rc)
		status := c.Response().Status
		if err != nil && !c.Response().Committed {
			status = apierror.From(err).Status
			if timing {
				c.Response().Header().Set("Server-Timing", rc.ServerTiming())
			}
		}
		if l := log.V(logging.Info); l.Enabled() {
			l.Info("pipeline step timings", append([]any{"path", rc.Path, "model", model, "stream", stream, "status", status,
				"revision", p.Revision(), "total", time.Since(start).String()}, rc.TimingSummary()...)...)
		}
		if err != nil {
			if c.Response().Committed {
				return nil // the relay already logged how the response ended
			}
			if ctxErr := req.Context().Err(); ctxErr != nil && errors.Is(err, ctxErr) {
				log.V(logging.Verbose).Info("client cancelled the request", "err", err.Error())
			}
			return err
		}
		if !c.Response().Committed {
			// Only possible if a step returned without writing; never leave the client hanging.
			return &apierror.Error{Status: http.StatusBadGateway, Type: apierror.TypeAPI, Code: "no_response", Message: "the pipeline produced no response"}
		}
		return nil
	})
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
	gw := p.Gateway()
	if gw == nil {
		return &apierror.Error{Status: http.StatusNotFound, Type: apierror.TypeNotFound, Code: "not_found", Message: "no such route (no gateway is configured)"}
	}
	return s.observed(c, routePassthrough, func(ctx context.Context, _ *string, reqBytes *int) error {
		req := c.Request()
		id, _ := c.Get(ctxRequestID).(string)
		limit := p.Config().Server.MaxRequestBodyBytes()
		if req.ContentLength > limit {
			return errTooLarge(limit)
		}
		*reqBytes = int(max(req.ContentLength, 0))
		rc := http.NewResponseController(c.Response().Writer)
		_ = rc.SetWriteDeadline(time.Time{})
		// The body streams upstream while the answer streams back (see EnableFullDuplex).
		_ = rc.EnableFullDuplex()
		leg := gateway.Leg{
			Method:      req.Method,
			Path:        req.URL.RequestURI(),
			Profile:     gateway.ProfileDecode,
			Phase:       routePassthrough,
			Header:      gateway.Forwarded(req.Header),
			RequestID:   id,
			ContentType: req.Header.Get("Content-Type"),
		}
		if req.ContentLength != 0 {
			leg.Body, leg.Size = http.MaxBytesReader(c.Response(), req.Body, limit), req.ContentLength
		}
		resp, err := gw.Do(ctx, leg)
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return errTooLarge(limit)
			}
			return &apierror.UpstreamError{Phase: routePassthrough, Err: err}
		}
		if err := gateway.Relay(c.Response(), resp, id, false, nil); err != nil {
			s.log.V(logging.Verbose).Info("passthrough response ended early", "request_id", id, "err", err.Error())
		}
		return nil
	})
}

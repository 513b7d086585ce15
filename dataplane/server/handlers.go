package server

import (
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/epd-dev/coordinator/dataplane/apierror"
	"github.com/epd-dev/coordinator/dataplane/gateway"
	"github.com/epd-dev/coordinator/dataplane/logging"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
)

func errNoPipeline() *apierror.Error {
	return &apierror.Error{Status: http.StatusServiceUnavailable, Type: apierror.TypeUnavailable, Code: "not_ready", Message: "no pipeline is loaded"}
}

// handleInference runs a chat, completions or generate request through the current pipeline. The
// pipeline pointer is read once: a reload during the request does not affect it.
func (s *Server) handleInference(c echo.Context) error {
	start := time.Now()
	p, release := s.holder.Acquire()
	defer release()
	if p == nil {
		return errNoPipeline()
	}
	req := c.Request()
	id, _ := c.Get(ctxRequestID).(string)
	raw, err := readBody(req, p.Config().Server.MaxRequestBodyBytes())
	if err != nil {
		return err
	}
	api := pipeline.APIForPath(req.URL.Path)
	obj, model, stream, err := parseBody(raw, api)
	if err != nil {
		return err
	}
	if stream {
		// Streams may legitimately outlive write_timeout; the timeout stays for non-stream answers.
		_ = http.NewResponseController(c.Response().Writer).SetWriteDeadline(time.Time{})
	}
	log := s.log.WithValues("request_id", id)
	rc := &pipeline.RequestContext{
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
	err = p.Execute(req.Context(), rc)
	status := c.Response().Status
	if err != nil && !c.Response().Committed {
		status = apierror.From(err).Status
	}
	if l := log.V(logging.Info); l.Enabled() {
		l.Info("pipeline step timings", append([]any{"path", rc.Path, "model", model, "stream", stream, "status", status,
			"revision", p.Revision(), "total", time.Since(start).String()}, rc.TimingSummary()...)...)
	}
	if err != nil {
		if c.Response().Committed {
			return nil // the relay already logged how the response ended
		}
		if errors.Is(err, req.Context().Err()) && req.Context().Err() != nil {
			log.V(logging.Verbose).Info("client cancelled the request", "err", err.Error())
		}
		return err
	}
	if !c.Response().Committed {
		// Only possible if a step returned without writing; never leave the client hanging.
		return &apierror.Error{Status: http.StatusBadGateway, Type: apierror.TypeAPI, Code: "no_response", Message: "the pipeline produced no response"}
	}
	return nil
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
	req := c.Request()
	id, _ := c.Get(ctxRequestID).(string)
	limit := p.Config().Server.MaxRequestBodyBytes()
	if req.ContentLength > limit {
		return errTooLarge(limit)
	}
	rc := http.NewResponseController(c.Response().Writer)
	_ = rc.SetWriteDeadline(time.Time{})
	// The body streams upstream while the answer streams back (see EnableFullDuplex).
	_ = rc.EnableFullDuplex()
	leg := gateway.Leg{
		Method:      req.Method,
		Path:        req.URL.RequestURI(),
		Profile:     gateway.ProfileDecode,
		Header:      gateway.Forwarded(req.Header),
		RequestID:   id,
		ContentType: req.Header.Get("Content-Type"),
	}
	if req.ContentLength != 0 {
		leg.Body, leg.Size = http.MaxBytesReader(c.Response(), req.Body, limit), req.ContentLength
	}
	resp, err := gw.Do(req.Context(), leg)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errTooLarge(limit)
		}
		return &apierror.UpstreamError{Phase: "passthrough", Err: err}
	}
	if err := gateway.Relay(c.Response(), resp, id, false, nil); err != nil {
		s.log.V(logging.Verbose).Info("passthrough response ended early", "request_id", id, "err", err.Error())
	}
	return nil
}

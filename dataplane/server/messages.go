package server

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/dataplane/transport/retry"
	"github.com/epd-dev/coordinator/dataplane/wire"
	"github.com/epd-dev/coordinator/dataplane/wire/anthropic"
)

// routeCountTokens labels count_tokens in the request metrics.
const routeCountTokens = "count_tokens"

// handleCountTokens serves POST /v1/messages/count_tokens: the request is translated and only
// the pipeline's tokenizing step (render) runs, on the stable pipeline (a count picks no canary);
// the answer is {"input_tokens": N}, the rendered prompt's length. A pipeline without render
// passes the request through to a decode worker. Images given by URL are refused: only a whole
// request downloads them through the media guard.
func (s *Server) handleCountTokens(c echo.Context) error {
	held, release := s.holder.Acquire()
	defer release()
	if held == nil {
		return errNoPipeline()
	}
	if !held.CanTokenize() {
		return s.handlePassthrough(c)
	}
	x := exchangeOf(c)
	ctx := s.observe(c, x, routeCountTokens)
	req := c.Request()
	buf, err := readBody(c, held.Config().Server.MaxRequestBodyBytes())
	if err != nil {
		return err
	}
	defer buf.Release()
	x.reqBytes = len(buf.Bytes())
	tr, err := anthropic.Translate(buf.Bytes(), anthropic.CountTokens, held.Config().Server.ContentBlocks())
	if err != nil {
		return err
	}
	x.model = tr.Model
	if tr.RemoteImage != "" {
		return apierror.InvalidField(tr.RemoteImage, "%s: count_tokens takes images as base64 only: a URL is downloaded, through the media guard, "+
			"only when the message is sent", tr.RemoteImage)
	}
	x.parse = time.Since(x.start)
	x.metrics.Model(tr.Model)
	fwd := forwarded(held.Config(), req.Header)
	if fwd == nil {
		fwd = http.Header{}
	}
	held.Stamp(fwd, gateway.PipelineRevisionHeader)
	rc := &request.Context{
		ID: x.id, API: wire.Chat.API(), Path: wire.Chat.Path(), Header: req.Header, Forwarded: fwd,
		ForwardResponse: held.ForwardResponse(), Body: tr.Chat, Buffer: buf, Model: tr.Model,
		Writer: c.Response(), Log: logging.WithValuesLazily(s.log, "request_id", x.id),
	}
	ctx = retry.WithRequestLimit(ctx, held.Config().Gateway.Retry.MaxRetriesPerRequest)
	if _, err := held.Tokenize(ctx, rc); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, struct {
		InputTokens int `json:"input_tokens"`
	}{rc.TokenCount()})
}

package server

import (
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/dataplane/transport/retry"
	"github.com/epd-dev/coordinator/dataplane/wire/anthropic"
)

// Anthropic's Messages API paths. /v1/messages runs through the pipeline as a chat request;
// count_tokens runs only the pipeline's render step (or is passed through without one).
const (
	PathMessages    = "/v1/messages"
	PathCountTokens = "/v1/messages/count_tokens"
)

// Route labels of the request metrics.
const (
	routeMessages    = "messages"
	routeCountTokens = "count_tokens"
)

// messagesRoutes registers the Messages API routes.
func (s *Server) messagesRoutes(e *echo.Echo) {
	e.POST(PathMessages, s.handleMessages)
	e.POST(PathCountTokens, s.handleCountTokens)
}

// translation serves, through the chat pipeline, a request of a format the pipeline does not
// speak: it parses the client's body into a chat body and wraps the client's writer so that the
// chat answer reaches the client in the request's format.
type translation interface {
	// route is the metrics route label.
	route() string
	// parse translates the client's body (see parseBody).
	parse(raw []byte) (obj *body.Object, model string, stream bool, err error)
	// writer wraps the client's writer, once parse succeeded.
	writer(w http.ResponseWriter, requestID string) http.ResponseWriter
	// finish completes the answer once the pipeline returned err, and returns the request's error.
	finish(err error) error
}

// parseAs parses the body of an api request, or translates it with tr.
func parseAs(raw []byte, api request.API, tr translation) (*body.Object, string, bool, error) {
	if tr != nil {
		return tr.parse(raw)
	}
	return parseBody(raw, api)
}

// writerFor is the writer the pipeline answers on: the client's, or tr's in front of it.
func writerFor(w http.ResponseWriter, tr translation, requestID string) http.ResponseWriter {
	if tr != nil {
		return tr.writer(w, requestID)
	}
	return w
}

// finish is tr's finish of the pipeline's err (err without tr).
func finish(tr translation, err error) error {
	if tr != nil {
		return tr.finish(err)
	}
	return err
}

// errorFormat is the error body format of a request path: Anthropic's for the Messages API,
// OpenAI's (nil) elsewhere.
func errorFormat(path string) apierror.Format {
	if path == PathMessages || strings.HasPrefix(path, PathMessages+"/") {
		return anthropic.ErrorBody
	}
	return nil
}

// messages translates one Anthropic Messages request.
type messages struct {
	req *anthropic.Request
	w   *anthropic.Writer
}

func (*messages) route() string { return routeMessages }

func (m *messages) parse(raw []byte) (*body.Object, string, bool, error) {
	req, err := anthropic.Translate(raw, anthropic.Create)
	if err != nil {
		return nil, "", false, err
	}
	m.req = req
	return req.Chat, req.Model, req.Stream, nil
}

func (m *messages) writer(w http.ResponseWriter, requestID string) http.ResponseWriter {
	m.w = anthropic.NewWriter(w, anthropic.Options{RequestID: requestID, Model: m.req.Model, StopSequences: m.req.StopSequences})
	return m.w
}

func (m *messages) finish(err error) error {
	if m.w == nil {
		return err
	}
	return m.w.Finish(err)
}

// handleMessages serves POST /v1/messages through the pipeline as a chat request.
func (s *Server) handleMessages(c echo.Context) error { return s.infer(c, &messages{}) }

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
	tr, err := anthropic.Translate(buf.Bytes(), anthropic.CountTokens)
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
		ID: x.id, API: request.APIChat, Path: request.PathChat, Header: req.Header, Forwarded: fwd,
		ForwardResponse: held.ForwardResponse(), Body: tr.Chat, Buffer: buf, Model: tr.Model,
		Writer: c.Response(), Log: logging.WithValuesLazily(s.log, "request_id", x.id),
	}
	ctx = retry.WithRequestLimit(ctx, held.Config().Gateway.Retry.MaxRetriesPerRequest)
	if _, err := held.Tokenize(ctx, rc); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, struct {
		InputTokens int `json:"input_tokens"`
	}{len(rc.TokenIDs)})
}

// Package server is the coordinator's API edge: an echo app with the routes of every client API
// (wire.Client: each request parsed once into the format the pipeline runs), health and
// readiness, a passthrough of other /v1 paths to the gateway, body limits, panic recovery, the
// outcome of each request settled once and reported (error body in the API's shape, metrics,
// span, logs), and the admin listener (/metrics, /debug/pipeline). What the listeners do below the
// handlers is package conn's.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/labstack/echo/v4"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/ratelimit"
	"github.com/epd-dev/coordinator/dataplane/server/conn"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
	"github.com/epd-dev/coordinator/dataplane/wire"
)

// Options configure a Server.
type Options struct {
	// Server holds the listener settings that cannot change without a restart.
	Server config.Server
	// Pipelines holds the serving pipeline (swapped by reloads).
	Pipelines *pipeline.Holder
	// Log is the process logger.
	Log logr.Logger
	// Telemetry records request metrics and spans.
	Telemetry observe.Telemetry
	// TLS, when set, serves HTTPS with it (see TLSConfig); nil serves plain HTTP.
	TLS *tls.Config
	// RateLimiter enforces the configuration's rate_limit block; nil: the server makes its own
	// (closed with the server), whose metrics nobody registers.
	RateLimiter *ratelimit.Limiter
}

// Server serves the coordinator API.
type Server struct {
	echo     *echo.Echo
	http     *http.Server
	tls      *tls.Config
	holder   *pipeline.Holder
	tel      observe.Telemetry
	log      logr.Logger
	draining atomic.Bool
	trim     *conn.IdleTrim
	limiter  *ratelimit.Limiter
	// ownLimiter says the server made limiter, and closes it.
	ownLimiter bool
}

// New builds the server and its routes.
func New(opts Options) *Server {
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	s := &Server{echo: e, holder: opts.Pipelines, tel: opts.Telemetry, log: opts.Log, tls: opts.TLS, trim: conn.NewIdleTrim(), limiter: opts.RateLimiter}
	if s.limiter == nil {
		s.limiter, s.ownLimiter = ratelimit.New(opts.Log, nil), true
	}
	e.HTTPErrorHandler = s.handleError
	e.Pre(s.serve, s.front)

	for _, path := range wire.ClientPaths {
		e.POST(path, s.handleInference)
	}
	e.POST(wire.CountTokensPath, s.handleCountTokens)
	e.Match(probeMethods, "/healthz", func(c echo.Context) error { return c.String(http.StatusOK, "ok") })
	e.Match(probeMethods, "/readyz", s.handleReady)
	e.RouteNotFound("/v1/*", s.handlePassthrough)
	s.http = conn.NewHTTPServer(conn.Guard(e, opts.Log), opts.Log)
	s.http.ReadTimeout = opts.Server.ReadTimeout.Std()
	s.http.WriteTimeout = opts.Server.WriteTimeout.Std()
	if d := opts.Server.ReadTimeout.Std(); d > 0 && d < s.http.ReadHeaderTimeout {
		s.http.ReadHeaderTimeout = d
	}
	return s
}

// probeMethods are the methods of /healthz and /readyz.
var probeMethods = []string{http.MethodGet, http.MethodHead}

// Handler is the HTTP handler (for tests and embedding).
func (s *Server) Handler() http.Handler { return s.http.Handler }

// Serve accepts connections on l until Shutdown: HTTPS when Options.TLS is set, otherwise plain
// HTTP/1.1.
func (s *Server) Serve(l net.Listener) error {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	go s.trim.Run(ctx, t.C, time.Second)
	return conn.Serve(s.http, l, s.tls, s.log)
}

// Drain starts the drain that precedes Shutdown: from now on /readyz fails ("draining") and
// every answer closes its connection (Connection: close), so that a client on a kept-alive
// connection opens a new one, which the endpoints send elsewhere once they drop this server. New
// connections are still accepted and served until Shutdown: on SIGTERM the endpoints keep
// sending some for a while (kube-proxy, load balancers).
func (s *Server) Drain() { s.draining.Store(true) }

// Draining reports whether Drain or Shutdown was called.
func (s *Server) Draining() bool { return s.draining.Load() }

// Shutdown drains (see Drain), stops accepting connections, closes the idle ones and waits for
// in-flight requests, streams included, closing each connection when its request ends, until
// ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	s.Drain()
	err := s.http.Shutdown(ctx)
	s.closeLimiter()
	return err
}

// Close cuts every connection at once (after a failed drain).
func (s *Server) Close() error {
	err := s.http.Close()
	s.closeLimiter()
	return err
}

// closeLimiter closes the rate limiter the server made.
func (s *Server) closeLimiter() {
	if s.ownLimiter {
		s.limiter.Close()
	}
}

func (s *Server) handleReady(c echo.Context) error {
	switch {
	case s.draining.Load():
		return c.String(http.StatusServiceUnavailable, "draining")
	case s.holder.Load() == nil:
		return c.String(http.StatusServiceUnavailable, "no pipeline loaded")
	}
	return c.String(http.StatusOK, "ok")
}

// serve is the server's outer middleware, before routing (front follows it). It gives the
// request its id (a valid client x-request-id, or a generated one) and echoes it, turns a panic
// into a 500, then settles how the request ended once and reports it (see exchange).
func (s *Server) serve(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		s.trim.Begin()
		defer s.trim.End()
		x := &exchange{start: time.Now()}
		client := c.Request().Header.Get(upstream.RequestIDHeader)
		var replaced bool
		if x.id, replaced = conn.RequestID(client); replaced {
			s.log.V(logging.Verbose).Info("replaced an invalid client x-request-id", "length", len(client), "request_id", x.id)
		}
		c.Set(ctxExchange, x)
		c.Response().Header().Set(upstream.RequestIDHeader, x.id)
		if s.draining.Load() {
			// net/http closes the connection after this answer: the client's next request opens
			// a new one, which the endpoints route to a server that is not draining.
			c.Response().Header().Set(echo.HeaderConnection, "close")
		}
		x.settle(c, s.recovered(c, x, next))
		s.report(c, x)
		if c.Response().Committed && errors.Is(x.cause, upstream.ErrResponseTruncated) {
			// A cut answer must not look complete: net/http closes the connection without the
			// terminating chunk, so every HTTP client reports an error.
			panic(http.ErrAbortHandler)
		}
		return nil
	}
}

// recovered runs next, turning a panic into a 500 and a logged stack.
func (s *Server) recovered(c echo.Context, x *exchange, next echo.HandlerFunc) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if r == http.ErrAbortHandler { //nolint:errorlint // a recovered value, compared as net/http does
				panic(r)
			}
			s.log.Error(nil, "panic serving request", "panic", r, "request_id", x.id, "path", c.Request().URL.Path)
			err = &apierror.Error{Status: http.StatusInternalServerError, Type: apierror.TypeAPI, Code: "internal_error", Message: "internal error"}
		}
	}()
	return next(c)
}

// handleError is echo's error handler, for errors that do not pass through serve (none of the
// registered routes): it writes them as OpenAI-style JSON (Anthropic's under /v1/messages, see
// errorFormat) unless the response has started.
func (s *Server) handleError(err error, c echo.Context) {
	if !c.Response().Committed {
		apierror.WriteAs(c.Response(), apierror.From(echoToAPI(err)), c.Response().Header().Get(upstream.RequestIDHeader), wire.ErrorFormat(c.Request().URL.Path))
	}
}

// echoToAPI converts echo's own errors (404, 405, 413...) to API errors.
func echoToAPI(err error) error {
	var he *echo.HTTPError
	if !errors.As(err, &he) {
		return err
	}
	e := &apierror.Error{Status: he.Code, Type: apierror.TypeInvalidRequest, Code: http.StatusText(he.Code), Message: http.StatusText(he.Code), Cause: err}
	switch he.Code {
	case http.StatusNotFound:
		e.Type, e.Code, e.Message = apierror.TypeNotFound, "not_found", "no such route"
	case http.StatusMethodNotAllowed:
		e.Code, e.Message = "method_not_allowed", "method not allowed on this route"
	case http.StatusRequestEntityTooLarge:
		e.Code, e.Message = "request_too_large", "request body too large"
	default:
		if he.Code >= 500 {
			e.Type = apierror.TypeAPI
		}
	}
	return e
}

package conn

import (
	"crypto/tls"
	"errors"
	stdlog "log"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/logging"
)

// MaxHeaderBytes bounds a request's line and headers (net/http's default); a larger head gets
// a 431.
const MaxHeaderBytes = 1 << 20

// NewHTTPServer is the http.Server of a listener (the API's, the admin's) around h.
func NewHTTPServer(h http.Handler, log logr.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    MaxHeaderBytes,
		ConnContext:       connContext,
		ErrorLog:          stdlog.New(logWriter{log.V(logging.Verbose)}, "", 0),
	}
}

// logWriter turns net/http's own log lines (a client's broken TLS handshake, a panic it
// recovered) into structured log lines.
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Info("net/http", "message", strings.TrimSpace(string(p)))
	return len(p), nil
}

// Serve runs hs on l through the listener every connection needs (see listener): TLS when cfg is
// set, request framing checks, lingering close, JSON for the errors net/http writes itself.
func Serve(hs *http.Server, l net.Listener, cfg *tls.Config, log logr.Logger) error {
	err := hs.Serve(&listener{Listener: l, tls: cfg, maxHeaderBytes: hs.MaxHeaderBytes, handshakeTimeout: hs.ReadHeaderTimeout, log: log})
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

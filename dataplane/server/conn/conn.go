// Package conn is the connection layer under the coordinator's listeners (the API's and the
// admin's): the listener that checks each request's framing before net/http reads it (refusing
// smuggling shapes), closes with a linger so a client still sending reads the answer, turns the
// errors net/http writes itself into JSON, and runs TLS handshakes in the connection's goroutine;
// the guard that answers what the framer refused; the request ids; the idle memory trim; and the
// listeners' TLS configuration.
package conn

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/uuid"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
)

// Lingering close: when the server closes a connection whose client may still be sending (a
// 413 before the body was read, a 431, a refused request), it keeps reading and discarding up
// to lingerBytes for up to lingerTime first. Closing with unread data makes the kernel answer
// with a reset, and a client that sends its whole body before reading (Python's urllib) then
// sees "connection reset" instead of the response that is already on its way.
const (
	lingerBytes = 64 << 20
	lingerTime  = 5 * time.Second
)

// listener accepts the connections of a Server or an Admin: each is followed by a framer, closed
// with a linger, gets JSON bodies for the errors net/http answers itself, and, with a TLS config,
// is a TLS connection whose handshake runs in the connection's own goroutine.
type listener struct {
	net.Listener
	tls              *tls.Config
	maxHeaderBytes   int
	handshakeTimeout time.Duration
	log              logr.Logger
	closing          atomic.Bool
}

func (l *listener) Accept() (net.Conn, error) {
	raw, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &conn{Conn: raw, raw: raw, l: l, framer: newFramer(l.maxHeaderBytes)}
	if l.tls != nil {
		c.tls = tls.Server(raw, l.tls)
		c.Conn = c.tls
	}
	return c, nil
}

// Close stops accepting; connections closed from then on (a shutdown) do not linger.
func (l *listener) Close() error {
	l.closing.Store(true)
	return l.Listener.Close()
}

// conn is one accepted connection (see listener).
type conn struct {
	net.Conn          // raw, or the TLS connection over it
	raw      net.Conn // the TCP connection
	tls      *tls.Conn
	l        *listener

	handshake sync.Once
	failed    atomic.Bool // the TLS handshake failed: reads see EOF
	plain     atomic.Bool // ...because the client spoke plain HTTP (and was answered so)

	// handling counts the connection's requests in a handler; tail is set when one ends, until
	// the next read: net/http flushes a response's last bytes after its handler returned, and
	// only reads the next request after that. Writes then are a handler's, never canned.
	handling atomic.Int32
	tail     atomic.Bool

	mu         sync.Mutex
	framer     *framer
	served     int  // requests handed to the handler
	readErr    bool // a read failed or hit EOF: the client is not sending
	closed     bool
	lingerDone chan struct{} // closed when the linger is over
}

// ConnectionState runs the TLS handshake: net/http calls it (the connection is not a *tls.Conn)
// in the connection's goroutine before reading a request, and sets Request.TLS from it.
func (c *conn) ConnectionState() tls.ConnectionState {
	if c.tls == nil {
		return tls.ConnectionState{}
	}
	c.handshake.Do(func() {
		if d := c.l.handshakeTimeout; d > 0 {
			_ = c.raw.SetDeadline(time.Now().Add(d))
		}
		err := c.tls.Handshake()
		_ = c.raw.SetDeadline(time.Time{})
		if err == nil {
			return
		}
		c.failed.Store(true)
		var rh tls.RecordHeaderError
		if errors.As(err, &rh) && rh.Conn != nil && looksLikeHTTP(rh.RecordHeader[:]) {
			e := &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest, Code: "tls_required",
				Message: "this port serves HTTPS: the client sent plain HTTP"}
			_, _ = c.raw.Write(rawResponse(e, uuid.NewString()))
			c.plain.Store(true)
			err = errors.New("client sent an HTTP request to an HTTPS server")
		}
		c.l.log.V(logging.Verbose).Info("TLS handshake failed", "remote", c.raw.RemoteAddr().String(), "err", err.Error())
	})
	return c.tls.ConnectionState()
}

// looksLikeHTTP reports a TLS record header (5 bytes) that is the start of an HTTP/1 request.
func looksLikeHTTP(h []byte) bool {
	switch string(h) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO", "DELET", "PATCH", "TRACE", "CONNE":
		return true
	}
	return false
}

func (c *conn) Read(p []byte) (int, error) {
	if c.failed.Load() {
		return 0, io.EOF
	}
	n, err := c.Conn.Read(p)
	c.tail.Store(false)
	c.mu.Lock()
	c.framer.feed(p[:n])
	// A deadline is how net/http cancels its background read between requests: the client may
	// still send (and a later close must linger), so only a real error or EOF counts.
	c.readErr = err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
	c.mu.Unlock()
	return n, err
}

// Write sends p; the canned plain-text errors net/http writes itself for requests it cannot
// read (431, 400, 501, 505) are rewritten as OpenAI JSON. Bytes written while a handler answers
// pass as they are, so a response that looks like a canned error is never rewritten.
func (c *conn) Write(p []byte) (int, error) {
	if c.handling.Load() > 0 || c.tail.Load() {
		return c.Conn.Write(p) // a handler's response, whatever its bytes look like
	}
	if e, ok := cannedError(p); ok {
		if _, err := c.Conn.Write(rawResponse(e, uuid.NewString())); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// CloseWrite half-closes the connection, as net/http does before it closes after an error, and
// starts the linger (see Close) at once: net/http waits half a second before closing, and a
// client blocked sending would wait with it.
func (c *conn) CloseWrite() error {
	c.mu.Lock()
	started := c.lingerLocked()
	c.mu.Unlock()
	if started {
		return nil
	}
	return c.closeWrite()
}

func (c *conn) closeWrite() error {
	if c.tls != nil && !c.plain.Load() { // the plain-HTTP answer went out on the TCP connection
		return c.tls.CloseWrite()
	}
	if cw, ok := c.raw.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Close closes the connection. While the client may still be sending, it first reads and
// discards what comes, in the background, until the client closes, lingerBytes or lingerTime.
func (c *conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.l.closing.Load() || c.lingerDone == nil && !c.lingerLocked() {
		return c.Conn.Close() // a shutdown cuts a linger short
	}
	done := c.lingerDone
	go func() {
		<-done
		_ = c.Conn.Close()
	}()
	return nil
}

// lingerLocked starts the linger unless it ran or the client is not sending; it reports whether
// it started it.
func (c *conn) lingerLocked() bool {
	if c.lingerDone != nil || c.readErr && !c.plain.Load() || c.l.closing.Load() || c.failed.Load() && !c.plain.Load() {
		return false
	}
	c.lingerDone = make(chan struct{})
	_ = c.closeWrite()
	from := c.Conn
	if c.plain.Load() {
		from = c.raw
	}
	go func() {
		defer close(c.lingerDone)
		_ = c.raw.SetReadDeadline(time.Now().Add(lingerTime))
		_, _ = io.CopyN(io.Discard, from, lingerBytes)
	}()
	return true
}

// nextRequest counts a request handed to the handler and returns how it must be served.
func (c *conn) nextRequest() (refusal string, closeAfter bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := c.served
	c.served++
	return c.framer.verdict(i)
}

type connKey struct{}

// connContext makes the connection reachable from its requests (http.Server.ConnContext).
func connContext(ctx context.Context, c net.Conn) context.Context {
	if hc, ok := c.(*conn); ok {
		return context.WithValue(ctx, connKey{}, hc)
	}
	return ctx
}

// Guard serves the requests of a connection the framer vetted: a request with ambiguous framing
// gets a 400 and the connection is closed, and after the framer lost track every answer closes
// the connection. It also records how the request body ended (see trackedBody).
func Guard(next http.Handler, log logr.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hc, ok := r.Context().Value(connKey{}).(*conn); ok { // every request the framer counted
			hc.handling.Add(1)
			defer func() {
				hc.tail.Store(true)
				hc.handling.Add(-1)
			}()
			refusal, closeAfter := hc.nextRequest()
			if closeAfter {
				w.Header().Set("Connection", "close")
			}
			if refusal != "" {
				id, _ := RequestID(r.Header.Get("X-Request-Id"))
				w.Header().Set("X-Request-Id", id)
				log.V(logging.Verbose).Info("refused a request with ambiguous framing", "request_id", id, "remote", r.RemoteAddr, "why", refusal)
				apierror.Write(w, &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest, Code: "ambiguous_framing",
					Message: refusal}, id)
				return
			}
		}
		if r.Body != nil && r.Body != http.NoBody {
			// On a copy: net/http inspects its own request's body after the handler.
			r = r.WithContext(r.Context())
			r.Body = &trackedBody{ReadCloser: r.Body}
		}
		next.ServeHTTP(w, r)
	})
}

// trackedBody records the error that ended a request body, so that a body the client did not
// finish sending in time is told apart from a failed upstream.
type trackedBody struct {
	io.ReadCloser
	mu  sync.Mutex
	err error
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		b.mu.Lock()
		b.err = err
		b.mu.Unlock()
	}
	return n, err
}

// BodyError is the client-facing error of a request body that failed to arrive: 408 when
// the client did not send it within server.read_timeout, 400 when it broke off; nil when it did
// not fail.
func BodyError(r *http.Request) *apierror.Error {
	b, ok := r.Body.(*trackedBody)
	if !ok {
		return nil
	}
	b.mu.Lock()
	err := b.err
	b.mu.Unlock()
	var mbe *http.MaxBytesError
	var ne net.Error
	switch {
	case err == nil, errors.As(err, &mbe):
		return nil
	case errors.As(err, &ne) && ne.Timeout():
		return &apierror.Error{Status: http.StatusRequestTimeout, Type: apierror.TypeInvalidRequest, Code: "request_timeout",
			Message: "the request body did not arrive within the server's read timeout", Cause: err}
	}
	return &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest, Code: "unreadable_body",
		Message: "failed to read request body", Cause: err}
}

// net/http's canned error responses: "HTTP/1.1 <code> <text>" + cannedHeaders + a text body.
var (
	cannedHeaders = []byte("\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n")
	cannedCodes   = map[int]string{
		http.StatusBadRequest:                  "bad_request",
		http.StatusRequestHeaderFieldsTooLarge: "request_header_fields_too_large",
		http.StatusNotImplemented:              "not_implemented",
		http.StatusHTTPVersionNotSupported:     "http_version_not_supported",
	}
)

// cannedError recognises a response net/http wrote itself, before any handler, for a request it
// could not read: it has no Date header and exactly cannedHeaders (a handler's responses always
// carry Date), and is written at once.
func cannedError(p []byte) (*apierror.Error, bool) {
	const prefix = "HTTP/1.1 "
	if len(p) > 1024 || len(p) < len(prefix)+4 || !bytes.HasPrefix(p, []byte(prefix)) {
		return nil, false
	}
	code := 0
	for _, d := range p[len(prefix) : len(prefix)+3] {
		if d < '0' || d > '9' {
			return nil, false
		}
		code = code*10 + int(d-'0')
	}
	name, known := cannedCodes[code]
	i := bytes.Index(p, cannedHeaders)
	if !known || p[len(prefix)+3] != ' ' || i < 0 || bytes.Contains(p[:i], []byte("\r\n")) {
		return nil, false
	}
	// The body repeats the status line ("400 Bad Request: missing required Host header").
	msg := strings.TrimPrefix(string(p[i+len(cannedHeaders):]), strconv.Itoa(code)+" ")
	e := &apierror.Error{Status: code, Type: apierror.TypeInvalidRequest, Code: name, Message: msg}
	if code == http.StatusRequestHeaderFieldsTooLarge {
		e.Message = "request header fields too large: at most 1 MiB of request line and headers"
	}
	if code >= 500 {
		e.Type = apierror.TypeAPI
	}
	return e, true
}

// rawResponse is a complete HTTP/1.1 error response that closes the connection.
func rawResponse(e *apierror.Error, requestID string) []byte {
	body := e.Body(requestID)
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\nX-Request-Id: %s\r\n"+
		"Connection: close\r\nContent-Length: %d\r\n\r\n%s", e.Status, http.StatusText(e.Status), requestID, len(body), body)
}

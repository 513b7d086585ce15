package upstream

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// h1Transport is the HTTP/1.1 transport of one plain-HTTP upstream (the gateway, a render
// service). Unlike net/http's Transport it runs no goroutine per connection: the calling
// goroutine writes the request, its header block and body in one vectored write, and reads the
// answer's headers; the body it returns reads the connection directly, and hands the connection
// back to the pool at its end. An open stream therefore costs its connection and one read
// buffer, not net/http's two goroutines and two buffers, and a call costs no goroutine
// hand-offs.
//
// Idle connections are reused last-in first-out and checked before reuse (a connection the
// upstream closed while idle is dropped, not written to); a connection idle longer than its
// timeout is closed. Answers are never decompressed (no Accept-Encoding is sent) and redirects
// are the Client's business.
type h1Transport struct {
	dial          func(ctx context.Context, network, addr string) (net.Conn, error)
	maxIdle       int
	idleTimeout   time.Duration
	headerTimeout time.Duration

	mu     sync.Mutex
	idle   map[string][]*h1Conn // by host:port, most recently used last
	nIdle  int
	sweep  *time.Timer // closes expired idle connections; armed while any is idle
	closed bool
}

// h1DefaultMaxIdle is the idle pool of a transport whose options set none (net/http's default).
const h1DefaultMaxIdle = 2

// h1ReadBuffer is the read buffer of a connection in use; an idle connection holds none. It holds
// an answer's headers and a stream's chunk framing: larger reads (a whole answer) bypass it.
const h1ReadBuffer = 2 << 10

var h1Readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, h1ReadBuffer) }}

// h1Headers are the header blocks being written.
var h1Headers = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

func newH1Transport(o TransportOptions, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *h1Transport {
	t := &h1Transport{dial: dial, maxIdle: o.MaxIdleConnsPerHost, idleTimeout: o.IdleConnTimeout,
		headerTimeout: o.ResponseHeaderTimeout, idle: map[string][]*h1Conn{}}
	if t.maxIdle == 0 {
		t.maxIdle = h1DefaultMaxIdle
	}
	return t
}

// h1MaxHeaderBytes bounds an answer's status line and headers (what net/http's transport reads
// at most is 10 MiB; a gateway's answers carry a few hundred bytes).
const h1MaxHeaderBytes = 1 << 20

// errHeadersTooLarge fails an answer whose headers do not end within h1MaxHeaderBytes.
var errHeadersTooLarge = fmt.Errorf("upstream: the answer's headers exceed %d bytes", h1MaxHeaderBytes)

// h1Conn is one upstream connection.
type h1Conn struct {
	net.Conn
	t         *h1Transport
	key       string
	br        *bufio.Reader // while in use; reads through limit
	limit     readLimit
	idleSince time.Time

	// dl guards the connection's deadlines against a call's cancellation, which may fire while
	// the call clears its header timeout.
	dl        sync.Mutex
	cancelled bool
}

// readLimit is a connection's reader with an optional budget: while headers are read, a peer
// that never ends them fails the read instead of growing the buffer.
type readLimit struct {
	r       io.Reader
	left    int64
	limited bool
}

func (l *readLimit) Read(p []byte) (int, error) {
	if !l.limited {
		return l.r.Read(p)
	}
	if l.left <= 0 {
		return 0, errHeadersTooLarge
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

// errH1Closed fails calls on a transport that was closed.
var errH1Closed = errors.New("upstream transport closed")

// RoundTrip sends req on a pooled or new connection and returns the answer with its headers.
func (t *h1Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" {
		closeBody(req)
		return nil, fmt.Errorf("upstream: unsupported scheme %q (this transport speaks plain HTTP/1.1)", req.URL.Scheme)
	}
	if err := validHeader(req.Header); err != nil {
		closeBody(req)
		return nil, err
	}
	key := hostPort(req.URL)
	c, err := t.get(req.Context(), key)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	ctx := req.Context()
	stop := context.AfterFunc(ctx, c.cancel)
	resp, err := c.exchange(req, t.headerTimeout)
	if err != nil {
		stop()
		c.Close()
		return nil, c.failure(ctx, err)
	}
	if resp.Body == http.NoBody {
		c.release(stop, resp.Close || req.Close)
		return resp, nil
	}
	resp.Body = &h1Body{body: resp.Body, c: c, ctx: ctx, stop: stop, closeAfter: resp.Close || req.Close}
	return resp, nil
}

// failure is err, or the cause of the call's cancellation when that is what failed it (the
// connection's deadline, not the upstream), as net/http reports it.
func (c *h1Conn) failure(ctx context.Context, err error) error {
	if c.isCancelled() && ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}

// CloseIdleConnections closes every idle connection (http.Client.CloseIdleConnections).
func (t *h1Transport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle, t.nIdle = map[string][]*h1Conn{}, 0
	t.mu.Unlock()
	for _, conns := range idle {
		for _, c := range conns {
			c.Conn.Close()
		}
	}
}

// close closes the idle connections and makes the transport refuse new calls; calls under way
// finish on their connections, which are then closed.
func (t *h1Transport) close() {
	t.mu.Lock()
	t.closed = true
	if t.sweep != nil {
		t.sweep.Stop()
	}
	t.mu.Unlock()
	t.CloseIdleConnections()
}

// get returns a live idle connection to key, or dials one.
func (t *h1Transport) get(ctx context.Context, key string) (*h1Conn, error) {
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return nil, errH1Closed
		}
		conns := t.idle[key]
		if len(conns) == 0 {
			t.mu.Unlock()
			break
		}
		c := conns[len(conns)-1]
		t.idle[key] = conns[:len(conns)-1]
		t.nIdle--
		t.mu.Unlock()
		if t.expired(c, time.Now()) || !alive(c.Conn) {
			c.Conn.Close()
			continue
		}
		c.attach()
		return c, nil
	}
	raw, err := t.dial(ctx, "tcp", key)
	if err != nil {
		return nil, err
	}
	c := &h1Conn{Conn: raw, t: t, key: key}
	c.attach()
	return c, nil
}

// attach gives the connection a read buffer for a call.
func (c *h1Conn) attach() {
	c.limit.r = c.Conn
	c.br = h1Readers.Get().(*bufio.Reader)
	c.br.Reset(&c.limit)
}

func (t *h1Transport) expired(c *h1Conn, now time.Time) bool {
	return t.idleTimeout > 0 && now.Sub(c.idleSince) >= t.idleTimeout
}

// put returns c to the idle pool, or closes it when the pool is full or closed.
func (t *h1Transport) put(c *h1Conn) {
	if c.br != nil {
		c.br.Reset(nil)
		h1Readers.Put(c.br)
		c.br = nil
	}
	c.idleSince = time.Now()
	t.mu.Lock()
	if t.closed || len(t.idle[c.key]) >= t.maxIdle {
		t.mu.Unlock()
		c.Conn.Close()
		return
	}
	t.idle[c.key] = append(t.idle[c.key], c)
	t.nIdle++
	if t.idleTimeout > 0 && t.sweep == nil {
		t.sweep = time.AfterFunc(t.idleTimeout, t.sweepIdle)
	} else if t.idleTimeout > 0 && t.nIdle == 1 {
		t.sweep.Reset(t.idleTimeout)
	}
	t.mu.Unlock()
}

// sweepIdle closes the connections idle past their timeout and re-arms for the next one to
// expire.
func (t *h1Transport) sweepIdle() {
	now := time.Now()
	var expired []*h1Conn
	t.mu.Lock()
	next := time.Duration(0)
	for key, conns := range t.idle {
		keep := conns[:0]
		for _, c := range conns { // oldest first
			if t.expired(c, now) {
				expired = append(expired, c)
				continue
			}
			keep = append(keep, c)
			if left := t.idleTimeout - now.Sub(c.idleSince); next == 0 || left < next {
				next = left
			}
		}
		clear(conns[len(keep):])
		t.idle[key] = keep
	}
	t.nIdle -= len(expired)
	if next > 0 && !t.closed {
		t.sweep.Reset(next)
	}
	t.mu.Unlock()
	for _, c := range expired {
		c.Conn.Close()
	}
}

// cancel fails the connection's pending and future reads and writes: the call's context ended.
func (c *h1Conn) cancel() {
	c.dl.Lock()
	c.cancelled = true
	_ = c.SetDeadline(aLongTimeAgo)
	c.dl.Unlock()
}

// aLongTimeAgo is a deadline in the past: it fails blocked reads and writes at once.
var aLongTimeAgo = time.Unix(1, 0)

// release ends a call whose answer was read to its end: the connection goes back to the pool
// when it can carry another call.
func (c *h1Conn) release(stop func() bool, closeAfter bool) {
	if !stop() || closeAfter || c.br.Buffered() > 0 {
		c.Close() // cancelled (its deadline is spent), closing, or holding bytes nobody asked for
		return
	}
	c.t.put(c)
}

// Close closes the connection and frees its read buffer.
func (c *h1Conn) Close() error {
	if c.br != nil {
		c.br.Reset(nil)
		h1Readers.Put(c.br)
		c.br = nil
	}
	return c.Conn.Close()
}

// exchange writes req and reads the answer's headers (skipping interim 1xx answers).
func (c *h1Conn) exchange(req *http.Request, headerTimeout time.Duration) (*http.Response, error) {
	// A failed write is not the end yet: the upstream may have answered and closed before
	// taking the whole body (a 413, say), and an answer already received is the answer.
	werr := c.write(req)
	if headerTimeout > 0 {
		c.setReadDeadline(time.Now().Add(headerTimeout))
	}
	// The budget covers the headers and what the buffer reads ahead of them.
	c.limit.limited, c.limit.left = true, h1MaxHeaderBytes+int64(c.br.Size())
	defer func() { c.limit.limited = false }()
	for {
		resp, err := http.ReadResponse(c.br, req)
		if err != nil {
			if werr != nil {
				return nil, werr
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // the connection ended before any answer
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && headerTimeout > 0 && !c.isCancelled() {
				return nil, headerTimeoutError{err}
			}
			return nil, err
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			continue // 100 Continue, 103 Early Hints
		}
		resp.Close = resp.Close || werr != nil
		if headerTimeout > 0 {
			c.setReadDeadline(time.Time{})
		}
		return resp, nil
	}
}

// headerTimeoutError is a call that got no answer within the header timeout (a net.Error whose
// Timeout is true, as net/http's).
type headerTimeoutError struct{ err error }

func (e headerTimeoutError) Error() string {
	return "timeout awaiting response headers: " + e.err.Error()
}
func (e headerTimeoutError) Unwrap() error   { return e.err }
func (e headerTimeoutError) Timeout() bool   { return true }
func (e headerTimeoutError) Temporary() bool { return false }

func (c *h1Conn) isCancelled() bool {
	c.dl.Lock()
	defer c.dl.Unlock()
	return c.cancelled
}

// setReadDeadline sets the read deadline unless the call was cancelled (whose deadline stays).
func (c *h1Conn) setReadDeadline(t time.Time) {
	c.dl.Lock()
	if !c.cancelled {
		_ = c.SetReadDeadline(t)
	}
	c.dl.Unlock()
}

// write sends req: the header block and a WholeBody in one vectored write, any other body after
// the headers (chunked when its length is unknown). The body is closed.
func (c *h1Conn) write(req *http.Request) error {
	hp := h1Headers.Get().(*[]byte)
	defer h1Headers.Put(hp)
	body := req.Body
	if body == http.NoBody {
		body = nil
	}
	length := req.ContentLength
	if body == nil {
		length = 0
	}
	hdr := appendRequestHead((*hp)[:0], req, length)
	*hp = hdr
	switch b := body.(type) {
	case nil:
		_, err := c.Write(hdr)
		return err
	case piecewise:
		if b.Len() == length {
			pieces := b.Pieces()
			bufs := make(net.Buffers, 0, 1+len(pieces))
			bufs = append(append(bufs, hdr), pieces...)
			_, err := bufs.WriteTo(c.Conn)
			b.Close()
			return err
		}
	}
	defer body.Close()
	if _, err := c.Write(hdr); err != nil {
		return err
	}
	if b, ok := body.(WholeBody); ok && b.Len() == length {
		_, err := b.WriteTo(c.Conn)
		return err
	}
	if length < 0 {
		bw := bufio.NewWriterSize(c.Conn, 32<<10)
		cw := httputil.NewChunkedWriter(bw)
		if _, err := io.Copy(cw, body); err != nil {
			return err
		}
		if err := cw.Close(); err != nil {
			return err
		}
		bw.WriteString("\r\n") // the end of the (empty) trailer
		return bw.Flush()
	}
	n, err := io.Copy(c.Conn, io.LimitReader(body, length))
	if err == nil && n != length {
		err = fmt.Errorf("http: ContentLength=%d with Body length %d", length, n)
	}
	return err
}

// piecewise is a WholeBody made of slices it can hand over for a vectored write (bodybuf.Body);
// Close releases them once written.
type piecewise interface {
	WholeBody
	io.Closer
	Pieces() net.Buffers
}

// appendRequestHead appends req's request line and header block, with Host, a Content-Length
// (or chunked framing when length is -1) and Connection: close when req.Close.
func appendRequestHead(b []byte, req *http.Request, length int64) []byte {
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	b = append(append(append(b, method...), ' '), req.URL.RequestURI()...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	b = append(append(b, host...), "\r\n"...)
	for k, vs := range req.Header {
		if k == "Host" || k == "Content-Length" || k == "Transfer-Encoding" || k == "Connection" {
			continue // framing is this transport's
		}
		for _, v := range vs {
			b = append(append(append(append(b, k...), ": "...), v...), "\r\n"...)
		}
	}
	switch {
	case length < 0:
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	case length > 0 || methodHasBody(method):
		b = append(strconv.AppendInt(append(b, "Content-Length: "...), length, 10), "\r\n"...)
	}
	if req.Close {
		b = append(b, "Connection: close\r\n"...)
	}
	return append(b, "\r\n"...)
}

func methodHasBody(m string) bool {
	return m == http.MethodPost || m == http.MethodPut || m == http.MethodPatch
}

// validHeader refuses a header a peer would read differently than meant: an invalid field name,
// or a value with a line break or another control byte (header injection).
func validHeader(h http.Header) error {
	for k, vs := range h {
		if !httpguts.ValidHeaderFieldName(k) {
			return fmt.Errorf("upstream: invalid header field name %q", k)
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return fmt.Errorf("upstream: invalid header field value for %q", k)
			}
		}
	}
	return nil
}

// hostPort is the address u dials.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// h1Body is an answer's body on an h1Conn: at its end the connection goes back to the pool;
// closed before its end, the connection is closed (the rest of the answer is not drained).
type h1Body struct {
	body       io.ReadCloser
	c          *h1Conn
	ctx        context.Context
	stop       func() bool
	closeAfter bool
	done       atomic.Bool
	end        error // what ended the body, when a Read did (read again: the same)
}

// errBodyClosed fails a read after Close.
var errBodyClosed = errors.New("http: read on closed response body")

func (b *h1Body) Read(p []byte) (int, error) {
	if b.done.Load() {
		if b.end != nil {
			return 0, b.end
		}
		return 0, errBodyClosed
	}
	n, err := b.body.Read(p)
	if err != nil && b.done.CompareAndSwap(false, true) {
		if errors.Is(err, io.EOF) {
			b.c.release(b.stop, b.closeAfter)
		} else {
			b.stop()
			b.c.Close()
			err = b.c.failure(b.ctx, err)
		}
		b.end = err
	}
	return n, err
}

// Close ends the call and closes the connection, which fails a Read under way on another
// goroutine; the read buffer is left to the garbage collector, since that Read may still hold
// it. The body's own Close is not called: net/http's would read the rest of the answer, a
// whole stream, to drain the connection.
func (b *h1Body) Close() error {
	if b.done.CompareAndSwap(false, true) {
		b.stop()
		b.c.Conn.Close()
	}
	return nil
}

package upstream

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"sync"
)

// relayBufSize is the copy buffer of a relayed response: large enough for any SSE event, small
// enough to pool.
const relayBufSize = 32 << 10

var relayBufs = sync.Pool{New: func() any { b := make([]byte, relayBufSize); return &b }}

// ErrResponseTruncated reports a relayed response that broke off after its status was sent: the
// client saw a partial body and nothing else can be written to it.
var ErrResponseTruncated = errors.New("worker response truncated")

// ErrClientGone reports a client that stopped reading during a relayed response.
var ErrClientGone = errors.New("client went away during the response")

// ErrNotStarted reports a relayed response whose body failed before its first byte: nothing was
// written to the client, so the call may be tried again.
var ErrNotStarted = errors.New("worker response failed before its first byte")

// Relay streams an upstream response to the client byte for byte: status, headers (minus
// hop-by-hop, plus x-request-id) and body. When the answer is an event stream (or stream is true)
// every read is flushed at once, so each SSE event reaches the client as soon as the worker sends
// it; nothing is buffered beyond one read. The status is written once the body's first read
// succeeds: a body that fails before its first byte returns ErrNotStarted with nothing written.
func Relay(w http.ResponseWriter, resp *http.Response, requestID string, stream bool, named []string) error {
	defer resp.Body.Close()
	bp := relayBufs.Get().(*[]byte)
	defer relayBufs.Put(bp)
	buf := *bp
	n, rerr := resp.Body.Read(buf)
	for n == 0 && rerr == nil {
		n, rerr = resp.Body.Read(buf)
	}
	if n == 0 && rerr != nil && rerr != io.EOF {
		return errors.Join(ErrNotStarted, rerr)
	}
	h := w.Header()
	CopyResponseHeader(h, resp.Header, named)
	if requestID != "" {
		h.Set(RequestIDHeader, requestID)
	}
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	flush := flusher != nil && (stream || IsEventStream(resp.Header))
	for first := true; ; first = false {
		if !first {
			n, rerr = resp.Body.Read(buf)
		}
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return errors.Join(ErrClientGone, werr)
			}
		}
		if flush && (n > 0 || first) {
			flusher.Flush() // at once, so the client sees each event (or the stream open) as it comes
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return errors.Join(ErrResponseTruncated, rerr)
		}
	}
}

// IsEventStream reports a text/event-stream response.
func IsEventStream(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && mt == "text/event-stream"
}

// Discard drains (up to a bound, so the connection can be reused) and closes a response.
func Discard(resp *http.Response) { Drain(resp) }

// Drain is Discard that returns how many bytes of the body it read.
func Drain(resp *http.Response) int64 {
	n, _ := io.CopyN(io.Discard, resp.Body, 64<<10)
	resp.Body.Close()
	return n
}

// RelayWhole is Relay for an answer that is not streamed: the body is read to its end before
// the status is written, so a body that breaks off or stalls anywhere returns ErrNotStarted
// with nothing written (the leg may be tried again). A body over limit bytes is relayed as it
// comes once limit bytes were read (a break after that truncates it). inspect, when set, is
// handed a body read whole before it is written (it must not keep it); an error it returns is
// returned as is, with nothing written.
func RelayWhole(w http.ResponseWriter, resp *http.Response, requestID string, limit int64, named []string, inspect func(body []byte) error) error {
	bp := relayBufs.Get().(*[]byte)
	defer relayBufs.Put(bp)
	buf := *bp
	n := 0
	for {
		if n == len(buf) {
			if int64(n) >= limit {
				// Too large to hold: what was read goes first, the rest streams.
				resp.Body = struct {
					io.Reader
					io.Closer
				}{io.MultiReader(bytes.NewReader(buf[:n]), resp.Body), resp.Body}
				return Relay(w, resp, requestID, false, named)
			}
			grown := make([]byte, n+int(min(int64(n), limit-int64(n))))
			copy(grown, buf[:n])
			buf = grown
		}
		m, err := resp.Body.Read(buf[n:])
		n += m
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			resp.Body.Close()
			return errors.Join(ErrNotStarted, err)
		}
	}
	resp.Body.Close()
	if inspect != nil {
		if err := inspect(buf[:n]); err != nil {
			return err
		}
	}
	h := w.Header()
	CopyResponseHeader(h, resp.Header, named)
	if requestID != "" {
		h.Set(RequestIDHeader, requestID)
	}
	if resp.ContentLength != int64(n) {
		h.Set("Content-Length", strconv.Itoa(n))
	}
	w.WriteHeader(resp.StatusCode)
	if _, err := w.Write(buf[:n]); err != nil {
		return errors.Join(ErrClientGone, err)
	}
	return nil
}

// Head is the start of an upstream body, for logs and errors: at most 512 bytes.
func Head(b []byte) []byte { return b[:min(len(b), 512)] }

package upstream

import (
	"errors"
	"io"
	"mime"
	"net/http"
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

// Relay streams an upstream response to the client byte for byte: status, headers (minus
// hop-by-hop, plus x-request-id) and body. When the answer is an event stream (or stream is true)
// every read is flushed at once, so each SSE event reaches the client as soon as the worker sends
// it; nothing is buffered beyond one read.
func Relay(w http.ResponseWriter, resp *http.Response, requestID string, stream bool) error {
	defer resp.Body.Close()
	h := w.Header()
	CopyResponseHeader(h, resp.Header)
	if requestID != "" {
		h.Set(RequestIDHeader, requestID)
	}
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	flush := flusher != nil && (stream || IsEventStream(resp.Header))
	if flush {
		flusher.Flush() // the client sees the stream open before the first token
	}
	bp := relayBufs.Get().(*[]byte)
	defer relayBufs.Put(bp)
	buf := *bp
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return errors.Join(ErrClientGone, werr)
			}
			if flush {
				flusher.Flush()
			}
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
func Discard(resp *http.Response) {
	_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
	resp.Body.Close()
}

package upstream

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Fuzz targets of the response relay; their seed corpora are in testdata/fuzz/<target>/ and run
// with every go test (make fuzz explores further).

// sizedReads is a response body that returns data in reads of the given sizes (cycled; a size
// of 0 is an empty read, never twice in a row), then end (io.EOF for a complete body).
type sizedReads struct {
	data  []byte
	sizes []byte
	i     int
	reads int // non-empty reads
	empty bool
	end   error
}

func (r *sizedReads) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.end
	}
	n := len(r.data)
	if len(r.sizes) > 0 {
		n = int(r.sizes[r.i%len(r.sizes)]) * 97 // up to ~24 KiB, below and across relayBufSize
		r.i++
	}
	if n == 0 && r.empty {
		n = 1
	}
	r.empty = n == 0
	n = min(n, len(p), len(r.data))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	if n > 0 {
		r.reads++
	}
	return n, nil
}

func (*sizedReads) Close() error { return nil }

// FuzzRelay: whatever the worker sends, however its reads are cut, the client gets the same
// bytes, the status and the request id; an event stream (or a streamed request) is flushed after
// every read, and a body that breaks off is reported as truncated after the bytes that came.
func FuzzRelay(f *testing.F) {
	sse := "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n: keep-alive\n\nevent: x\r\ndata: a\r\ndata: b\r\n\r\ndata: [DONE]\n\n"
	f.Add([]byte(sse), []byte{0}, "text/event-stream", false, false, uint16(200))
	f.Add([]byte(sse), []byte{1, 0, 2}, "text/event-stream; charset=utf-8", false, false, uint16(200))
	f.Add([]byte(sse), []byte{3}, "TEXT/Event-Stream ; charset=\"utf-8\"", false, true, uint16(200))
	f.Add([]byte(`{"id":"x","choices":[]}`), []byte{}, "application/json", false, false, uint16(200))
	f.Add([]byte(`{"error":{"message":"no such model"}}`), []byte{}, "application/json", false, false, uint16(404))
	f.Add([]byte("data: partial"), []byte{1}, "text/event-stream", true, false, uint16(200))
	f.Add(bytes.Repeat([]byte("data: x\n\n"), 5000), []byte{255, 7}, "text/event-stream", false, false, uint16(200))
	f.Add([]byte("\x00\xff\r\n\r\n"), []byte{0, 0, 1}, "text/event-stream;;", false, true, uint16(599))
	f.Fuzz(func(t *testing.T, data, sizes []byte, contentType string, truncated, stream bool, status uint16) {
		code := int(status)
		if code < 200 || code > 599 || code == http.StatusNoContent || code == http.StatusNotModified {
			code = http.StatusOK // the statuses a worker answers with a body
		}
		end := io.EOF
		if truncated {
			end = io.ErrUnexpectedEOF
		}
		src := &sizedReads{data: bytes.Clone(data), sizes: sizes, end: end}
		resp := &http.Response{StatusCode: code, Header: http.Header{"Content-Type": {contentType}, "Connection": {"close"}}, Body: src}
		rec := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
		err := Relay(rec, resp, "req-1", stream, nil)

		if truncated && len(data) == 0 {
			// Broken before its first byte: nothing is written, so the leg may be retried.
			if !errors.Is(err, ErrNotStarted) || rec.Body.Len() != 0 || len(rec.flushes) != 0 || len(rec.Header()) != 0 {
				t.Fatalf("broken before any byte: err %v, wrote %q, flushes %v, header %v", err, rec.Body.Bytes(), rec.flushes, rec.Header())
			}
			return
		}
		if !bytes.Equal(rec.Body.Bytes(), data) {
			t.Fatalf("relayed %d bytes %.80q, the worker sent %d %.80q", rec.Body.Len(), rec.Body.Bytes(), len(data), data)
		}
		switch {
		case truncated && (err == nil || !errors.Is(err, ErrResponseTruncated) || !errors.Is(err, io.ErrUnexpectedEOF)):
			t.Fatalf("a broken body: %v", err)
		case !truncated && err != nil:
			t.Fatalf("a complete body: %v", err)
		}
		if rec.Code != code || rec.Header().Get(RequestIDHeader) != "req-1" || rec.Header().Get("Content-Type") != contentType ||
			rec.Header().Get("Connection") != "" {
			t.Fatalf("status %d, headers %v", rec.Code, rec.Header())
		}
		sse := IsEventStream(resp.Header)
		if sse && !strings.HasPrefix(strings.ToLower(strings.TrimSpace(contentType)), "text/event-stream") {
			t.Fatalf("%q taken for an event stream", contentType)
		}
		if flushing := sse || stream; flushing {
			// The status goes with the first bytes: one flush after every read that brought
			// some (an empty stream is flushed once, at its end).
			want := max(src.reads, 1)
			if len(rec.flushes) != want || rec.flushes[len(rec.flushes)-1] != len(data) {
				t.Fatalf("%d non-empty reads, flushes at %v", src.reads, rec.flushes)
			}
		} else if len(rec.flushes) != 0 {
			t.Fatalf("a plain answer was flushed: %v", rec.flushes)
		}
	})
}

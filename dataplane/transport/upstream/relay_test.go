package upstream

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// flushRecorder counts flushes and the bytes written before each.
type flushRecorder struct {
	*httptest.ResponseRecorder
	flushes []int
}

func (f *flushRecorder) Flush() {
	f.flushes = append(f.flushes, f.Body.Len())
	f.ResponseRecorder.Flush()
}

// chunks is a response body that returns one chunk per Read, then err (io.EOF at the end).
type chunks struct {
	parts []string
	err   error
}

func (c *chunks) Read(p []byte) (int, error) {
	if len(c.parts) == 0 {
		return 0, c.err
	}
	n := copy(p, c.parts[0])
	c.parts = c.parts[1:]
	return n, nil
}

func (c *chunks) Close() error { return nil }

// failWriter fails every write.
type failWriter struct{ *httptest.ResponseRecorder }

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

// A body that fails before its first byte writes nothing: the leg may be tried again.
func TestRelayNotStarted(t *testing.T) {
	rec := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
	resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}},
		Body: &chunks{parts: []string{""}, err: io.ErrUnexpectedEOF}}
	err := Relay(rec, resp, "rid", true, nil)
	if !errors.Is(err, ErrNotStarted) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err = %v, want ErrNotStarted with the cause", err)
	}
	if rec.Body.Len() != 0 || len(rec.flushes) != 0 || len(rec.Header()) != 0 {
		t.Fatalf("wrote %q, flushes %v, header %v", rec.Body.String(), rec.flushes, rec.Header())
	}
}

func TestRelay(t *testing.T) {
	sse := http.Header{"Content-Type": {"text/event-stream; charset=utf-8"}}
	plain := http.Header{"Content-Type": {"application/json"}}
	tests := map[string]struct {
		header  http.Header
		stream  bool
		parts   []string
		end     error
		flushes []int
		err     error
	}{
		"event stream flushed after every read": {
			header: sse, parts: []string{"data: a\n\n", "data: b\n\n"}, end: io.EOF,
			flushes: []int{9, 18},
		},
		"stream requested flushes whatever the type": {
			header: plain, stream: true, parts: []string{"{", "}"}, end: io.EOF,
			flushes: []int{1, 2},
		},
		"empty stream flushed once": {
			header: sse, end: io.EOF, flushes: []int{0},
		},
		"plain answer not flushed": {
			header: plain, parts: []string{`{"a":`, `1}`}, end: io.EOF,
		},
		"broken upstream body is a truncation": {
			header: sse, parts: []string{"data: a\n\n"}, end: io.ErrUnexpectedEOF,
			flushes: []int{9}, err: ErrResponseTruncated,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rec := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
			resp := &http.Response{StatusCode: http.StatusCreated, Header: tc.header.Clone(), Body: &chunks{parts: tc.parts, err: tc.end}}
			resp.Header.Set("Connection", "close")
			err := Relay(rec, resp, "rid", tc.stream, nil)
			if tc.err == nil && err != nil || tc.err != nil && !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if rec.Code != 201 || rec.Header().Get(RequestIDHeader) != "rid" || rec.Header().Get("Connection") != "" {
				t.Fatalf("status %d, header %v", rec.Code, rec.Header())
			}
			if got := rec.Body.String(); got != strings.Join(tc.parts, "") {
				t.Fatalf("body %q", got)
			}
			if len(rec.flushes) != len(tc.flushes) {
				t.Fatalf("flushes after %v bytes, want %v", rec.flushes, tc.flushes)
			}
			for i := range tc.flushes {
				if rec.flushes[i] != tc.flushes[i] {
					t.Fatalf("flushes after %v bytes, want %v", rec.flushes, tc.flushes)
				}
			}
		})
	}
}

func TestRelayClientGone(t *testing.T) {
	resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: &chunks{parts: []string{"x"}, err: io.EOF}}
	if err := Relay(failWriter{httptest.NewRecorder()}, resp, "", false, nil); !errors.Is(err, ErrClientGone) {
		t.Fatalf("err = %v, want ErrClientGone", err)
	}
}

func TestIsEventStream(t *testing.T) {
	for ct, want := range map[string]bool{
		"text/event-stream": true, "Text/Event-Stream; charset=utf-8": true, "application/json": false, "": false, "text/event-stream;;": false,
	} {
		if got := IsEventStream(http.Header{"Content-Type": {ct}}); got != want {
			t.Errorf("IsEventStream(%q) = %v, want %v", ct, got, want)
		}
	}
}

func TestRelayWhole(t *testing.T) {
	big := strings.Repeat("x", 100<<10)
	tests := map[string]struct {
		parts   []string
		end     error
		limit   int64
		err     error
		written string
	}{
		"whole answer":                     {parts: []string{`{"a":`, `1}`}, end: io.EOF, limit: 1 << 20, written: `{"a":1}`},
		"larger than the pool buffer":      {parts: []string{big[:40<<10], big[40<<10:]}, end: io.EOF, limit: 1 << 20, written: big},
		"broken mid-body: nothing written": {parts: []string{`{"a":`}, end: io.ErrUnexpectedEOF, limit: 1 << 20, err: ErrNotStarted},
		"over the limit streams":           {parts: []string{big[:40<<10], big[40<<10:]}, end: io.EOF, limit: 32 << 10, written: big},
		"over the limit, then broken":      {parts: []string{big[:40<<10]}, end: io.ErrUnexpectedEOF, limit: 32 << 10, err: ErrResponseTruncated, written: big[:40<<10]},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			var rs []io.Reader
			for _, p := range tc.parts {
				rs = append(rs, strings.NewReader(p))
			}
			resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}},
				Body: &endReader{r: io.MultiReader(rs...), end: tc.end}}
			err := RelayWhole(rec, resp, "rid", tc.limit, nil, nil)
			if tc.err == nil && err != nil || tc.err != nil && !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if rec.Body.String() != tc.written {
				t.Fatalf("wrote %d bytes, want %d", rec.Body.Len(), len(tc.written))
			}
			if tc.err == nil && tc.limit > int64(len(tc.written)) && rec.Header().Get("Content-Length") != strconv.Itoa(len(tc.written)) {
				t.Fatalf("Content-Length %q", rec.Header().Get("Content-Length"))
			}
			if errors.Is(tc.err, ErrNotStarted) && len(rec.Header()) != 0 {
				t.Fatalf("headers written: %v", rec.Header())
			}
		})
	}
}

// endReader reads r (partial reads honoured), then fails with end.
type endReader struct {
	r   io.Reader
	end error
}

func (e *endReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if errors.Is(err, io.EOF) {
		err = e.end
	}
	return n, err
}

func (*endReader) Close() error { return nil }

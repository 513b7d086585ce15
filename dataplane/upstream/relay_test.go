package upstream

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
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
		"event stream flushed at open and after every read": {
			header: sse, parts: []string{"data: a\n\n", "data: b\n\n"}, end: io.EOF,
			flushes: []int{0, 9, 18},
		},
		"stream requested flushes whatever the type": {
			header: plain, stream: true, parts: []string{"{", "}"}, end: io.EOF,
			flushes: []int{0, 1, 2},
		},
		"plain answer not flushed": {
			header: plain, parts: []string{`{"a":`, `1}`}, end: io.EOF,
		},
		"broken upstream body is a truncation": {
			header: sse, parts: []string{"data: a\n\n"}, end: io.ErrUnexpectedEOF,
			flushes: []int{0, 9}, err: ErrResponseTruncated,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rec := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
			resp := &http.Response{StatusCode: http.StatusCreated, Header: tc.header.Clone(), Body: &chunks{parts: tc.parts, err: tc.end}}
			resp.Header.Set("Connection", "close")
			err := Relay(rec, resp, "rid", tc.stream)
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
	if err := Relay(failWriter{httptest.NewRecorder()}, resp, "", false); !errors.Is(err, ErrClientGone) {
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

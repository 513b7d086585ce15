package conn

import (
	"net/http"
	"testing"
)

// TestCannedError: only net/http's own error responses are rewritten, never a handler's.
func TestCannedError(t *testing.T) {
	const canned = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
	tests := map[string]struct {
		written string
		status  int // 0: left alone
		message string
	}{
		"431":           {written: "HTTP/1.1 431 Request Header Fields Too Large" + canned + "431 Request Header Fields Too Large", status: 431},
		"400 with text": {written: "HTTP/1.1 400 Bad Request: missing required Host header" + canned + "400 Bad Request: missing required Host header", status: 400, message: "Bad Request: missing required Host header"},
		"501":           {written: "HTTP/1.1 501 Not Implemented" + canned + "Unsupported transfer encoding", status: 501, message: "Unsupported transfer encoding"},
		"a handler's plain-text error": {written: "HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n" +
			"Date: Tue, 01 Dec 2026 12:00:00 GMT\r\nContent-Length: 3\r\n\r\nbad"},
		"a header before the canned ones": {written: "HTTP/1.1 400 Bad Request\r\nDate: x" + canned + "400 Bad Request"},
		"another status":                  {written: "HTTP/1.1 200 OK" + canned + "ok"},
		"not a status code":               {written: "HTTP/1.1 4x1 Nope" + canned + "x"},
		"a body chunk":                    {written: "data: HTTP/1.1 431 " + canned},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e, ok := cannedError([]byte(tc.written))
			if ok != (tc.status != 0) {
				t.Fatalf("rewritten: %v", ok)
			}
			if !ok {
				return
			}
			if e.Status != tc.status || e.Message == "" || tc.message != "" && e.Message != tc.message {
				t.Fatalf("error %+v", e)
			}
			if tc.status >= 500 && e.Type != "api_error" || tc.status < 500 && e.Type != "invalid_request_error" {
				t.Fatalf("type %q for %d", e.Type, e.Status)
			}
			if http.StatusText(e.Status) == "" {
				t.Fatal("unknown status")
			}
		})
	}
}

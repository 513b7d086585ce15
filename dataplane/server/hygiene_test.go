package server_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/test/harness/prereq"
)

// TestAmbiguousFraming: a request with Content-Length and Transfer-Encoding (or Transfer-Encoding
// on HTTP/1.0) gets a JSON 400 and the connection closes, so nothing behind it is served; clean
// pipelined requests are all served.
func TestAmbiguousFraming(t *testing.T) {
	h := start(t, jsonAnswer, nil)
	const behind = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
	tests := map[string]struct {
		raw      string
		statuses []int
		legs     int
	}{
		"Content-Length and Transfer-Encoding": {
			raw:      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + behind,
			statuses: []int{400},
		},
		"the same, on the passthrough": {
			raw:      "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n0\r\n\r\n" + behind,
			statuses: []int{400},
		},
		"Transfer-Encoding on HTTP/1.0": {
			raw:      "POST /v1/embeddings HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n0\r\n\r\n" + behind,
			statuses: []int{400},
		},
		"after a clean request": {
			raw:      behind + "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + behind,
			statuses: []int{200, 400}, legs: 1,
		},
		"clean chunked and pipelined requests": {
			raw: "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n" + behind +
				"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
			statuses: []int{200, 200, 200}, legs: 3,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := h.up.count()
			resps, closed := exchange(t, h.addr, tc.raw)
			if len(resps) != len(tc.statuses) || !closed {
				t.Fatalf("%d responses (closed %v), want %d and the connection closed", len(resps), closed, len(tc.statuses))
			}
			for i, want := range tc.statuses {
				if resps[i].StatusCode != want {
					t.Fatalf("response %d: HTTP %d, want %d: %s", i, resps[i].StatusCode, want, resps[i].body)
				}
				if want == 400 {
					if e := decodeError(t, resps[i].Response, resps[i].body); e.Error.Code != "ambiguous_framing" || !resps[i].Close {
						t.Fatalf("code %q, Connection: close %v", e.Error.Code, resps[i].Close)
					}
				}
			}
			if got := h.up.count() - before; got != tc.legs {
				t.Fatalf("%d legs reached the gateway, want %d", got, tc.legs)
			}
		})
	}
}

// TestOversizedBodyIsAnswered: a body over the limit gets its JSON 413 whatever the client: one
// that reads while it sends (Go), one that keeps sending before it reads (a raw connection,
// Python's urllib). The connection is drained, not reset under the client.
func TestOversizedBodyIsAnswered(t *testing.T) {
	h := start(t, jsonAnswer, func(c *config.Config) { c.Server.MaxRequestBodySize = 1 })
	big := bytes.Repeat([]byte("x"), 8<<20)
	for _, path := range []string{"/v1/chat/completions", "/v1/embeddings"} {
		t.Run("Go client "+path, func(t *testing.T) {
			for i := range 5 {
				for _, chunked := range []bool{false, true} {
					var body io.Reader = bytes.NewReader(big)
					if chunked {
						body = io.MultiReader(body)
					}
					resp, err := http.Post(h.url+path, "application/json", body)
					if err != nil {
						t.Fatalf("attempt %d (chunked %v): %v", i, chunked, err)
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusRequestEntityTooLarge {
						t.Fatalf("attempt %d: HTTP %d", i, resp.StatusCode)
					}
					decodeError(t, resp, b)
				}
			}
		})
		t.Run("client that keeps sending "+path, func(t *testing.T) {
			for i := range 5 {
				conn, err := net.Dial("tcp", h.addr)
				if err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, len(big))
				if _, err := conn.Write(big); err != nil { // all of it before reading, like urllib
					t.Fatalf("attempt %d: writing the body: %v", i, err)
				}
				_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
				if err != nil {
					t.Fatalf("attempt %d: reading the 413: %v", i, err)
				}
				b, _ := io.ReadAll(resp.Body)
				conn.Close()
				if resp.StatusCode != http.StatusRequestEntityTooLarge {
					t.Fatalf("attempt %d: HTTP %d", i, resp.StatusCode)
				}
				decodeError(t, resp, b)
			}
		})
	}
	t.Run("Python urllib", func(t *testing.T) {
		python, err := exec.LookPath("python3")
		if err != nil {
			prereq.Missing(t, "python3 is not installed (apt-get install python3)")
			return
		}
		const script = `
import json, sys, urllib.error, urllib.request
for i in range(20):
    req = urllib.request.Request(sys.argv[1], data=b"x" * (8 << 20), headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=30)
        sys.exit("attempt %d: no error" % i)
    except urllib.error.HTTPError as e:
        body = json.loads(e.read())
        if e.code != 413 or body["error"]["code"] != "request_too_large":
            sys.exit("attempt %d: HTTP %d %r" % (i, e.code, body))
    except Exception as e:
        sys.exit("attempt %d: %r" % (i, e))
print("ok")
`
		out, err := exec.Command(python, "-c", script, h.url+"/v1/chat/completions").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "ok" {
			t.Fatalf("urllib: %v\n%s", err, out)
		}
	})
}

// TestSlowBody: a body the client does not finish within read_timeout is a JSON 408 that closes
// the connection, on the inference routes (read before any leg) and on the passthrough (streamed
// to the gateway), not a 502.
func TestSlowBody(t *testing.T) {
	h := start(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		jsonAnswer(w, r)
	}, func(c *config.Config) { c.Server.ReadTimeout = config.Duration(300 * time.Millisecond) })
	tests := map[string]struct{ path, framing, partial string }{
		"inference, Content-Length":   {path: "/v1/chat/completions", framing: "Content-Length: 100", partial: `{"model":`},
		"inference, chunked":          {path: "/v1/completions", framing: "Transfer-Encoding: chunked", partial: "9\r\n{\"model\":\r\n"},
		"passthrough, Content-Length": {path: "/v1/embeddings", framing: "Content-Length: 100", partial: `{"input":`},
		"passthrough, chunked":        {path: "/v1/embeddings", framing: "Transfer-Encoding: chunked", partial: "9\r\n{\"input\":\r\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			conn, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s\r\n\r\n%s", tc.path, tc.framing, tc.partial)
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer to a stalled body: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusRequestTimeout || !resp.Close {
				t.Fatalf("HTTP %d (Connection: close %v), want 408 closing: %s", resp.StatusCode, resp.Close, b)
			}
			if e := decodeError(t, resp, b); e.Error.Code != "request_timeout" {
				t.Fatalf("code %q", e.Error.Code)
			}
		})
	}
}

// TestErrorsBeforeTheHandler: what net/http answers itself, before any handler runs, is OpenAI
// JSON too, and the client reads it even while it is still sending.
func TestErrorsBeforeTheHandler(t *testing.T) {
	h := start(t, jsonAnswer, nil)
	tests := map[string]struct {
		raw    string
		status int
		code   string
	}{
		"oversized headers": {raw: "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 2<<20) + "\r\n\r\n",
			status: 431, code: "request_header_fields_too_large"},
		"no Host header":          {raw: "GET /v1/models HTTP/1.1\r\n\r\n", status: 400, code: "bad_request"},
		"malformed request line":  {raw: "GET\r\n\r\n", status: 400, code: "bad_request"},
		"unknown transfer coding": {raw: "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", status: 501, code: "not_implemented"},
		"HTTP/2 request line":     {raw: "GET /v1/models HTTP/2.0\r\nHost: x\r\n\r\n", status: 505, code: "http_version_not_supported"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			resps, closed := exchange(t, h.addr, tc.raw)
			if len(resps) != 1 || !closed {
				t.Fatalf("%d responses (closed %v)", len(resps), closed)
			}
			r := resps[0]
			if r.StatusCode != tc.status {
				t.Fatalf("HTTP %d, want %d: %s", r.StatusCode, tc.status, r.body)
			}
			if e := decodeError(t, r.Response, r.body); e.Error.Code != tc.code {
				t.Fatalf("code %q, want %q", e.Error.Code, tc.code)
			}
		})
	}
	if h.up.count() != 0 {
		t.Fatal("a refused request reached the gateway")
	}
}

// A response body that looks like one of net/http's canned errors is a handler's: it reaches
// the client byte for byte, never rewritten as JSON.
func TestCannedLookalikeBodyPasses(t *testing.T) {
	const lookalike = "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: injected"
	h := start(t, func(w http.ResponseWriter, _ *http.Request) {
		// An event stream is flushed after its headers, so the body goes out in a write of its own.
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(lookalike)))
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, lookalike)
	}, nil)
	resps, _ := exchange(t, h.addr, "GET /v1/files/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if len(resps) != 1 || resps[0].StatusCode != http.StatusOK || string(resps[0].body) != lookalike {
		t.Fatalf("got %d responses: %+v", len(resps), resps)
	}
}

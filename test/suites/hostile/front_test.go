//go:build linux

package hostile

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/test/harness/prereq"
)

// TestPassthroughStaysInV1 tries to reach past /v1 through the passthrough, with methods the API
// does not use and with routing headers a client must not set, and the admin endpoints on the
// public port (where the admin listener binds: cmd/coordinator's TestAdminListener).
func TestPassthroughStaysInV1(t *testing.T) {
	st := startStack(t)
	rec := startRecorder(t, st.Gateway.URL())
	co := startCoordinator(t, rec.url, config{})
	addr := strings.TrimPrefix(co.url, "http://")

	refused := map[string]struct {
		method, target string
		status         int
	}{
		"dot segments":             {http.MethodGet, "/v1/../healthz", http.StatusNotFound},
		"encoded dot segments":     {http.MethodGet, "/v1/%2e%2e/healthz", http.StatusNotFound},
		"mixed-case encoding":      {http.MethodGet, "/v1/%2E%2e/%2e%2E/metrics", http.StatusNotFound},
		"encoded slash":            {http.MethodGet, "/v1/models/..%2f..%2fhealthz", http.StatusNotFound},
		"backslash":                {http.MethodGet, "/v1/..\\..\\healthz", http.StatusNotFound},
		"double-encoded dot":       {http.MethodGet, "/v1/%252e%252e/healthz", http.StatusNotFound},
		"TRACE":                    {"TRACE", "/v1/models", http.StatusMethodNotAllowed},
		"PROPFIND":                 {"PROPFIND", "/v1/models", http.StatusMethodNotAllowed},
		"BREW":                     {"BREW", "/v1/models", http.StatusMethodNotAllowed},
		"PATCH":                    {"PATCH", "/v1/models", http.StatusMethodNotAllowed},
		"GET on an inference path": {http.MethodGet, "/v1/chat/completions", http.StatusMethodNotAllowed},
		"no such route":            {http.MethodGet, "/admin", http.StatusNotFound},
		"debug on the public port": {http.MethodGet, "/debug/pipeline", http.StatusNotFound},
	}
	for name, tc := range refused {
		t.Run(name, func(t *testing.T) {
			rec.taken()
			out, _ := rawExchange(t, addr, fmt.Sprintf("%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", tc.method, tc.target), 5*time.Second)
			r := parseRaw(t, out)
			if r.status != tc.status && !(tc.status == http.StatusNotFound && r.status == http.StatusBadRequest) {
				t.Fatalf("HTTP %d, want %d: %s", r.status, tc.status, out)
			}
			r.jsonError(t)
			if legs := rec.taken(); len(legs) > 0 {
				t.Errorf("forwarded to the gateway: %s %s", legs[0].method, legs[0].uri)
			}
		})
	}

	t.Run("remote URLs where no media guard runs", func(t *testing.T) {
		// Workers fetch media URLs themselves: on the passthrough, and on the pipeline's routes
		// when it has no replace-media-urls step (this one is decode alone), a remote URL is refused.
		for path, body := range map[string]string{
			"/v1/chat/completions": `{"model":"sim-model","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://` + metadata + `/"}}]}]}`,
			"/v1/embeddings":       `{"model":"sim-model","input":[{"type":"image_url","image_url":"http://` + metadata + `/"}]}`,
			"/v1/responses":        `{"model":"sim-model","input":[{"role":"user","content":[{"type":"input_image","image_url":"http://` + metadata + `/"}]}]}`,
			"/v1/messages":         `{"model":"sim-model","max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://` + metadata + `/"}}]}]}`,
		} {
			rec.taken()
			r := do(t, http.MethodPost, co.url+path, []byte(body), nil)
			if r.status != http.StatusBadRequest {
				t.Fatalf("%s: HTTP %d, want 400: %s", path, r.status, r.body)
			}
			if e := r.jsonError(t); !strings.Contains(e.Error.Message, "remote URLs are refused") {
				t.Errorf("%s: %q", path, e.Error.Message)
			}
			if legs := rec.taken(); len(legs) > 0 {
				t.Errorf("%s was forwarded", path)
			}
		}
		// Text that mentions a URL is not a media reference.
		rec.taken()
		do(t, http.MethodPost, co.url+"/v1/embeddings", []byte(`{"model":"sim-model","input":"see http://example.com"}`), nil)
		if legs := rec.taken(); len(legs) != 1 {
			t.Errorf("%d legs for an embeddings request, want it forwarded", len(legs))
		}
	})

	t.Run("routing headers are dropped", func(t *testing.T) {
		rec.taken()
		hdr := map[string]string{
			"X-Gateway-Destination-Endpoint":  "10.0.0.9:8000",
			"X-Gateway-Inference-Objective":   "premium",
			"X-Gateway-Inference-Fairness-Id": "victim",
			"X-Prefill-Pin-Host-Port":         "10.0.0.9:8000",
			"EPP-Profile":                     "prefill",
			"Authorization":                   "Bearer sk-client",
		}
		for _, path := range []string{"/v1/models", "/v1/chat/completions"} {
			method, body := http.MethodGet, []byte(nil)
			if path != "/v1/models" {
				method, body = http.MethodPost, chat("sim-model")
			}
			if r := do(t, method, co.url+path, body, hdr); r.status != http.StatusOK {
				t.Fatalf("%s: HTTP %d %s", path, r.status, r.body)
			}
		}
		legs := rec.taken()
		if len(legs) != 2 {
			t.Fatalf("%d legs, want 2", len(legs))
		}
		for _, leg := range legs {
			for _, h := range []string{"X-Gateway-Destination-Endpoint", "X-Gateway-Inference-Objective", "X-Gateway-Inference-Fairness-Id", "X-Prefill-Pin-Host-Port"} {
				if v := leg.header.Get(h); v != "" {
					t.Errorf("%s %s carried the client's %s: %q", leg.method, leg.uri, h, v)
				}
			}
			if p := leg.header.Get("Epp-Profile"); p != "decode" {
				t.Errorf("%s %s: EPP-Profile %q, want the coordinator's decode", leg.method, leg.uri, p)
			}
		}
	})
}

// workerHeaders are added to every answer the recorder passes back.
var workerHeaders = map[string]string{"Set-Cookie": "session=worker", "X-Worker-Pod": "decode-0", "Server": "envoy", "Openai-Processing-Ms": "7"}

// TestWorkerHeaders: a worker's answer reaches the client with the allow-listed headers only,
// relayed whole, streamed, or passed through.
func TestWorkerHeaders(t *testing.T) {
	st := startStack(t)
	rec := startRecorder(t, st.Gateway.URL())
	co := startCoordinator(t, rec.url, config{})
	streamed, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 4, "stream": true,
		"messages": []any{map[string]any{"role": "user", "content": "hello"}}})
	tests := []struct {
		name, method, path string
		body               []byte
	}{
		{"chat", http.MethodPost, "/v1/chat/completions", chat("sim-model")},
		{"streamed chat", http.MethodPost, "/v1/chat/completions", streamed},
		{"passthrough", http.MethodGet, "/v1/models", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, tc.method, co.url+tc.path, tc.body, nil)
			if r.status != http.StatusOK {
				t.Fatalf("HTTP %d %s", r.status, r.body)
			}
			for _, h := range []string{"Set-Cookie", "X-Worker-Pod"} {
				if v := r.header.Get(h); v != "" {
					t.Errorf("the client got the worker's %s: %q", h, v)
				}
			}
			if v := r.header.Get("Server"); v == "envoy" {
				t.Errorf("the client got the gateway's Server: %q", v)
			}
			if v := r.header.Get("Openai-Processing-Ms"); v != "7" {
				t.Errorf("openai-processing-ms %q, want the worker's 7", v)
			}
			if r.header.Get("X-Request-Id") == "" {
				t.Error("no x-request-id")
			}
		})
	}
}

// TestHTTPHygiene covers what the server answers before or around the handlers: smuggling,
// oversized bodies, slow bodies, oversized headers.
func TestHTTPHygiene(t *testing.T) {
	st := startStack(t)
	rec := startRecorder(t, st.Gateway.URL())
	co := startCoordinator(t, rec.url, config{server: "max_request_body_size: 1, read_timeout: 2s"})
	addr := strings.TrimPrefix(co.url, "http://")

	t.Run("Content-Length with Transfer-Encoding", func(t *testing.T) {
		rec.taken()
		smuggled := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"0\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
		out, closed := rawExchange(t, addr, smuggled, 5*time.Second)
		if n := strings.Count(out, "HTTP/1.1 "); n != 1 {
			t.Fatalf("%d responses on the connection, want 1:\n%s", n, out)
		}
		r := parseRaw(t, out)
		if r.status != http.StatusBadRequest || !closed {
			t.Fatalf("HTTP %d, closed %v; want 400 and the connection closed:\n%s", r.status, closed, out)
		}
		r.jsonError(t)
		if legs := rec.taken(); len(legs) > 0 {
			t.Errorf("the smuggled request was forwarded: %s %s", legs[0].method, legs[0].uri)
		}
	})

	t.Run("what follows a chunked body whose trailer ends in a bare LF is refused", func(t *testing.T) {
		rec.taken()
		// net/http takes the bare LF for the trailer line's end and reads the next request; an
		// intermediary that does not may have taken it for body.
		body := chat("sim-model")
		raw := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
			fmt.Sprintf("%x\r\n%s\r\n0\r\nX-Trailer: 1\n\r\n", len(body), body) +
			"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
		out, closed := rawExchange(t, addr, raw, 5*time.Second)
		br := bufio.NewReader(strings.NewReader(out))
		var statuses []int
		var last []byte
		for {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				break
			}
			last, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			statuses = append(statuses, resp.StatusCode)
		}
		if !slices.Equal(statuses, []int{http.StatusOK, http.StatusBadRequest}) || !closed {
			t.Fatalf("statuses %v, closed %v; want [200 400] and the connection closed:\n%.2000s", statuses, closed, out)
		}
		if !bytes.Contains(last, []byte(`"code":"ambiguous_framing"`)) || !bytes.Contains(last, []byte("chunked body whose framing is malformed")) {
			t.Errorf("refusal body %s", last)
		}
		for _, leg := range rec.taken() {
			if leg.uri == "/v1/models" {
				t.Errorf("the request behind the broken chunked body was forwarded: %s %s", leg.method, leg.uri)
			}
		}
	})

	t.Run("a relayed answer closes a connection the framer lost track of", func(t *testing.T) {
		rec.taken()
		// A Content-Length net/http accepts but too long for the framer to follow: every answer on
		// the connection must close it, a relayed worker answer included.
		lost := "GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: " + strings.Repeat("0", 300) + "\r\n\r\n" +
			"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" +
			"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
		out, closed := rawExchange(t, addr, lost, 5*time.Second)
		if n := strings.Count(out, "HTTP/1.1 "); n != 1 || !closed {
			t.Fatalf("%d responses, closed %v; want one answer and the connection closed:\n%.2000s", n, closed, out)
		}
		if legs := rec.taken(); len(legs) > 1 {
			t.Errorf("%d legs forwarded, want only the first request's", len(legs))
		}
	})

	big := bytes.Repeat([]byte("x"), 8*mib)
	t.Run("oversized body, Go client", func(t *testing.T) {
		for i := range 20 {
			r := do(t, http.MethodPost, co.url+"/v1/chat/completions", big, nil)
			if r.status != http.StatusRequestEntityTooLarge {
				t.Fatalf("attempt %d: HTTP %d", i, r.status)
			}
			r.jsonError(t)
		}
	})
	t.Run("oversized body, Python urllib", func(t *testing.T) {
		python, err := exec.LookPath("python3")
		if err != nil {
			prereq.Missing(t, "python3 is not installed (apt-get install python3)")
			return
		}
		script := `
import sys, urllib.request, urllib.error, json
ok = 0
for i in range(20):
    req = urllib.request.Request(sys.argv[1], data=b"x" * (8 << 20), headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=30)
        print("attempt %d: no error" % i); sys.exit(1)
    except urllib.error.HTTPError as e:
        body = json.loads(e.read())
        if e.code != 413 or not body["error"]["message"]:
            print("attempt %d: HTTP %d %r" % (i, e.code, body)); sys.exit(1)
        ok += 1
    except Exception as e:
        print("attempt %d: %r" % (i, e)); sys.exit(1)
print(ok)
`
		out, err := exec.Command(python, "-c", script, co.url+"/v1/chat/completions").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "20" {
			t.Fatalf("urllib: %v\n%s", err, out)
		}
	})
	t.Run("oversized body, client that keeps sending", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(big))
		go func() { _, _ = conn.Write(big) }() // the server reads what it must, then answers
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufioReader(conn), nil)
		if err != nil {
			t.Fatalf("reading the 413: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		r := response{status: resp.StatusCode, header: resp.Header, body: b}
		if r.status != http.StatusRequestEntityTooLarge {
			t.Fatalf("HTTP %d", r.status)
		}
		r.jsonError(t)
	})

	t.Run("oversized body after a kept-alive request", func(t *testing.T) {
		for i := range 10 {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			br := bufioReader(conn)
			fmt.Fprint(conn, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
			first, err := http.ReadResponse(br, nil)
			if err != nil || first.StatusCode != http.StatusOK {
				t.Fatalf("attempt %d: the first request: %v", i, err)
			}
			_, _ = io.Copy(io.Discard, first.Body)
			first.Body.Close()
			// Like urllib: send the whole body, then read.
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(big))
			_, _ = conn.Write(big)
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				conn.Close()
				t.Fatalf("attempt %d: reading the 413 after a kept-alive request: %v", i, err)
			}
			b, _ := io.ReadAll(resp.Body)
			conn.Close()
			if r := (response{status: resp.StatusCode, header: resp.Header, body: b}); r.status != http.StatusRequestEntityTooLarge {
				t.Fatalf("attempt %d: HTTP %d", i, r.status)
			} else {
				r.jsonError(t)
			}
		}
	})

	for _, path := range []string{"/v1/chat/completions", "/v1/embeddings"} {
		t.Run("slow body on "+path, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":", path)
			_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
			resp, err := http.ReadResponse(bufioReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer to a stalled body: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			r := response{status: resp.StatusCode, header: resp.Header, body: b}
			if r.status != http.StatusRequestTimeout {
				t.Fatalf("HTTP %d, want 408: %s", r.status, b)
			}
			r.jsonError(t)
		})
	}

	t.Run("oversized headers", func(t *testing.T) {
		out, _ := rawExchange(t, addr, "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 2<<20)+"\r\n\r\n", 5*time.Second)
		r := parseRaw(t, out)
		if r.status != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("HTTP %d, want 431", r.status)
		}
		r.jsonError(t)
	})
}

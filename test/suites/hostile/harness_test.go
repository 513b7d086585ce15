//go:build linux

// Package hostile is the hostile-client suite: it runs the real coordinator binary in front of the
// gateway double and simworkers and attacks it the way a client that reaches the gateway could —
// memory amplification through media, metric-label abuse, URLs to internal hosts in every content
// part shape, passthrough path and method tricks, request smuggling and oversized bodies, admin
// endpoints on the public port — and asserts what comes out: statuses and JSON error bodies,
// nothing forwarded that must not be, no panic in the logs, and the process's peak RSS under a
// stated bound while ordinary requests keep being served.
//
// HOSTILE_COORDINATOR=/path/to/coordinator runs the suite against another build (for before and
// after figures); by default it builds ./cmd/coordinator.
package hostile

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/test/harness/stack"
	coordinatorproc "github.com/epd-dev/coordinator/test/internal/coordinator"
	"github.com/epd-dev/coordinator/test/internal/loopback"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hostile-bin-")
	if err != nil {
		panic(err)
	}
	if binary, err = coordinatorproc.Binary("HOSTILE_COORDINATOR", dir); err != nil {
		panic(err)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// coordinator is a running coordinator process.
type coordinator struct {
	*coordinatorproc.Process
	// url is the serving listener's base URL, admin the admin (metrics) listener's.
	url, admin string
	logs       *loopback.Log
}

// config is what a test varies in the coordinator's configuration.
type config struct {
	// server, gateway and pipeline are extra YAML of their sections ("key: value, ..."), steps
	// the pipeline's steps (YAML flow sequence items).
	server, gateway, pipeline, steps string
	// env is added to the coordinator's environment (NAME=value).
	env []string
}

// startCoordinator runs the binary on free loopback ports against gateway and waits until it is
// ready. The process is killed when the test ends; its log is checked for panics.
func startCoordinator(t *testing.T, gateway string, c config) *coordinator {
	t.Helper()
	if c.steps == "" {
		c.steps = "{type: decode}"
	}
	p := coordinatorproc.Start(t, binary, func(addr, adminPort string) string {
		server := fmt.Sprintf("listen_addr: %q, metrics_port: %s", addr, adminPort)
		if c.server != "" {
			server += ", " + c.server
		}
		gw := "address: " + gateway
		if c.gateway != "" {
			gw += ", " + c.gateway
		}
		pipe := "steps: [" + c.steps + "]"
		if c.pipeline != "" {
			pipe += ", " + c.pipeline
		}
		return fmt.Sprintf("log_level: 3\nserver: {%s}\ngateway: {%s}\npipeline: {%s}\n", server, gw, pipe)
	}, c.env...)
	return &coordinator{Process: p, url: p.URL, admin: p.Admin, logs: p.Logs}
}

// memory reads a VmXXX field of the process's /proc status, in bytes.
func (c *coordinator) memory(t *testing.T, field string) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.Cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc status", field)
	return 0
}

// peakRSS is the process's resident-set high-water mark.
func (c *coordinator) peakRSS(t *testing.T) int64 { return c.memory(t, "VmHWM") }

// metricsSize fetches /metrics from the admin listener and returns its size and text.
func (c *coordinator) metrics(t *testing.T) string {
	t.Helper()
	resp, err := http.Get(c.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	return string(b)
}

// startStack starts the worker pool and the gateway double for one test.
func startStack(t *testing.T) *stack.Stack {
	t.Helper()
	st, err := stack.Start(stack.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// response is what a client read back.
type response struct {
	status int
	header http.Header
	body   []byte
}

// apiError is the OpenAI error body.
type apiError struct {
	Error struct {
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"` // a string here, a number in vLLM's errors
		Param   *string         `json:"param"`
	} `json:"error"`
}

// jsonError decodes r's body as the OpenAI error JSON, failing the test when it is not one.
func (r response) jsonError(t *testing.T) apiError {
	t.Helper()
	var e apiError
	if err := json.Unmarshal(r.body, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("HTTP %d: not an OpenAI error body (%v): %.300q", r.status, err, r.body)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("HTTP %d: error Content-Type %q", r.status, ct)
	}
	return e
}

var client = &http.Client{Timeout: 60 * time.Second}

// do sends one request and reads the whole answer.
func do(t *testing.T, method, url string, body []byte, header map[string]string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, url, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// chat is a small chat request for model.
func chat(model string) []byte {
	b, _ := json.Marshal(map[string]any{
		"model": model, "max_tokens": 4,
		"messages": []any{map[string]any{"role": "user", "content": "hello"}},
	})
	return b
}

// chatWithParts is a chat request whose one user message has the given content parts.
func chatWithParts(parts ...any) []byte {
	b, _ := json.Marshal(map[string]any{
		"model": "sim-model", "max_tokens": 4,
		"messages": []any{map[string]any{"role": "user", "content": append([]any{map[string]any{"type": "text", "text": "describe"}}, parts...)}},
	})
	return b
}

// ordinary sends small chat requests in a loop until stop is called, which returns how many were
// answered and the statuses that were not 200.
func ordinary(t *testing.T, url string) (stop func() (served int, failures []string)) {
	t.Helper()
	done := make(chan struct{})
	var (
		mu       sync.Mutex
		served   int
		failures []string
		wg       sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			resp, err := client.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(chat("sim-model")))
			mu.Lock()
			if err != nil {
				failures = append(failures, err.Error())
			} else {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					served++
				} else {
					failures = append(failures, fmt.Sprintf("HTTP %d %.200s", resp.StatusCode, b))
				}
			}
			mu.Unlock()
		}
	}()
	return func() (int, []string) {
		close(done)
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return served, failures
	}
}

// rawExchange writes raw bytes on a fresh TCP connection and reads until the server closes it or
// idle passes without a byte; it returns everything read and whether the server closed.
func rawExchange(t *testing.T, addr string, raw string, idle time.Duration) (string, bool) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	r := bufio.NewReader(conn)
	buf := make([]byte, 4096)
	for {
		_ = conn.SetReadDeadline(time.Now().Add(idle))
		n, err := r.Read(buf)
		out.Write(buf[:n])
		if err == io.EOF {
			return out.String(), true
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return out.String(), false
			}
			return out.String(), true // reset: closed
		}
	}
}

const mib = 1 << 20

// recorder sits between the coordinator and the gateway double and records every request the
// coordinator sent: what must not be forwarded is checked here.
type recorder struct {
	url  string
	mu   sync.Mutex
	legs []recordedLeg
}

// recordedLeg is one outbound request as the gateway received it.
type recordedLeg struct {
	method, uri string
	header      http.Header
	body        []byte
}

func startRecorder(t *testing.T, gateway string) *recorder {
	t.Helper()
	target, err := url.Parse(gateway)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	proxy := httputil.NewSingleHostReverseProxy(target)
	// Every answer carries what a worker, a sidecar or the gateway may add: the coordinator lets
	// through only its allow list (TestWorkerHeaders).
	proxy.ModifyResponse = func(resp *http.Response) error {
		for k, v := range workerHeaders {
			resp.Header.Set(k, v)
		}
		return nil
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rec.mu.Lock()
		rec.legs = append(rec.legs, recordedLeg{method: r.Method, uri: r.RequestURI, header: r.Header.Clone(), body: body})
		rec.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	rec.url = srv.URL
	return rec
}

// taken returns the legs recorded since the last call and forgets them.
func (r *recorder) taken() []recordedLeg {
	r.mu.Lock()
	defer r.mu.Unlock()
	legs := r.legs
	r.legs = nil
	return legs
}

// parseRaw parses the first HTTP response of raw bytes read from a connection.
func parseRaw(t *testing.T, out string) response {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(out)), nil)
	if err != nil {
		t.Fatalf("not an HTTP response (%v): %.300q", err, out)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

func bufioReader(r io.Reader) *bufio.Reader { return bufio.NewReader(r) }

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/harness/endpoints"
)

var binary string

// The build information TestMain stamps into the binary, as the Dockerfile does.
const (
	testVersion = "v0.0.0-test"
	testCommit  = "0123abc"
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "coordinator-bin-")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "coordinator")
	ldflags := "-X main.version=" + testVersion + " -X main.commit=" + testCommit
	if out, err := exec.Command("go", "build", "-ldflags", ldflags, "-o", binary, ".").CombinedOutput(); err != nil {
		panic(fmt.Sprintf("building the coordinator: %v\n%s", err, out))
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func TestAnnotatedConfigBuilds(t *testing.T) {
	path := "../../config/coordinator/coordinator.yaml"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := builder.Build(cfg, builder.Options{}); err != nil {
		t.Fatal(err)
	}
	annotated, _ := os.ReadFile(path)
	reference, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range config.EnvKeys() {
		leaf := key[strings.LastIndex(key, ".")+1:]
		if !bytes.Contains(annotated, []byte(leaf+":")) {
			t.Errorf("%s is missing from %s", key, path)
		}
		if !bytes.Contains(reference, []byte("`"+key+"`")) || !bytes.Contains(reference, []byte(config.EnvName(key))) {
			t.Errorf("docs/configuration.md does not document %s (%s)", key, config.EnvName(key))
		}
	}
	for _, step := range builder.Types.Names() {
		if !bytes.Contains(annotated, []byte("type: "+step)) || !bytes.Contains(reference, []byte("`"+step+"`")) {
			t.Errorf("step %s is not documented in both files", step)
		}
	}
}

// writeConfig writes a config file and returns its path.
func writeConfig(t *testing.T, doc string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "coordinator.yaml")
	if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestInvalidConfigFailsStartup(t *testing.T) {
	tests := map[string]struct {
		doc string
		env []string
		key string
	}{
		"unknown step":          {doc: "gateway: {address: http://gw}\npipeline: {steps: [{type: prefil}, {type: decode}]}", key: "pipeline.steps[0].type"},
		"bad param type":        {doc: "gateway: {address: http://gw}\npipeline: {steps: [{type: render, params: {address: http://r, timeout: 30}}, {type: decode}]}", key: "pipeline.steps[0].params.timeout"},
		"negative limit":        {doc: "server: {max_request_body_size: -1}\ngateway: {address: http://gw}\npipeline: {steps: [{type: decode}]}", key: "server.max_request_body_size"},
		"duration without unit": {doc: "server: {read_timeout: '30'}\ngateway: {address: http://gw}\npipeline: {steps: [{type: decode}]}", key: "server.read_timeout"},
		"tokens-in w/o render":  {doc: "gateway: {address: http://gw}\npipeline: {use_openai_format: false, steps: [{type: decode}]}", key: "pipeline.use_openai_format"},
		"unknown connector":     {doc: "gateway: {address: http://gw}\npipeline: {kv_connector: kv-mooncake, steps: [{type: prefill}, {type: decode}]}", key: "pipeline.steps[0].params.kv_connector"},
		"missing gateway":       {doc: "pipeline: {steps: [{type: decode}]}", key: "gateway.address"},
		"bad env override":      {doc: "gateway: {address: http://gw}\npipeline: {steps: [{type: decode}]}", env: []string{"COORDINATOR_GATEWAY_TIMEOUT=5"}, key: "gateway.timeout"},
		"missing file":          {key: "reading config"},
		"unknown cipher suite": {doc: "server: {tls_cipher_suites: [TLS_CHACHA20_ROT13]}\ngateway: {address: http://gw}\npipeline: {steps: [{type: decode}]}",
			key: `server.tls_cipher_suites[0]: cipher suite "TLS_CHACHA20_ROT13"`},
		"unknown TLS version": {doc: "gateway: {address: http://gw}\npipeline: {steps: [{type: decode}]}",
			env: []string{"COORDINATOR_SERVER_TLS_MIN_VERSION=TLS1.3"}, key: "server.tls_min_version"},
		"no certificate in cert_path": {doc: "server: {secure_serving: true, cert_path: /nonexistent}\ngateway: {address: http://gw}\npipeline: {steps: [{type: decode}]}",
			key: "server.cert_path"},
		"no certificate in metrics_cert_dir": {doc: "server: {metrics_cert_dir: /nonexistent}\ngateway: {address: http://gw}\npipeline: {steps: [{type: decode}]}",
			key: "server.metrics_cert_dir"},
		"missing gateway CA": {doc: "gateway: {address: https://gw, ca_file: /nonexistent/ca.crt}\npipeline: {steps: [{type: decode}]}",
			key: "gateway.ca_file"},
		"metrics host with a port": {doc: "server: {metrics_host: '127.0.0.1:9090'}\ngateway: {address: http://gw}\npipeline: {steps: [{type: decode}]}",
			key: "server.metrics_host"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := "/nonexistent/coordinator.yaml"
			if tc.doc != "" {
				path = writeConfig(t, tc.doc)
			}
			cmd := exec.Command(binary, "--config", path)
			cmd.Env = append(os.Environ(), tc.env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("exit: %v (stderr %s)", err, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			last := lines[len(lines)-1]
			if !strings.Contains(last, tc.key) {
				t.Fatalf("the error line does not name %s: %q", tc.key, last)
			}
		})
	}
}

// runBinary runs the coordinator binary with args and extra environment, and returns its exit
// code, stdout and stderr.
func runBinary(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String()
	}
	t.Fatalf("running the coordinator: %v", err)
	return 0, "", ""
}

// lastLine is the last line of out.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}

func TestVersion(t *testing.T) {
	// No config is read: a missing one does not matter.
	code, stdout, stderr := runBinary(t, nil, "--version", "--config", "/nonexistent/coordinator.yaml")
	want := fmt.Sprintf("coordinator %s (commit %s, %s %s/%s, config schema %d)\n", testVersion, testCommit, runtime.Version(), runtime.GOOS, runtime.GOARCH, config.SchemaVersion)
	if code != 0 || stdout != want || stderr != "" {
		t.Fatalf("--version: exit %d, stdout %q (want %q), stderr %q", code, stdout, want, stderr)
	}
}

func TestDefaultConfigPath(t *testing.T) {
	if _, err := os.Stat(config.DefaultPath); err == nil {
		t.Skipf("%s exists on this machine", config.DefaultPath)
	}
	// Without --config the binary reads the default path.
	code, _, stderr := runBinary(t, nil, "--check")
	if want := "coordinator: reading config: open " + config.DefaultPath + ": "; code != 1 || !strings.HasPrefix(stderr, want) {
		t.Fatalf("--check without --config: exit %d, stderr %q, want %q...", code, stderr, want)
	}
}

func TestCheck(t *testing.T) {
	// A port in use: --check opens no listener, so it does not notice.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	annotated, err := os.ReadFile("../../config/coordinator/coordinator.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const decodeOnly = "gateway: {address: http://gw}\npipeline: {steps: [{type: decode}]}"
	inUse := fmt.Sprintf("server: {listen_addr: %q, metrics_port: 0}\n%s", busy.Addr(), decodeOnly)
	tests := map[string]struct {
		doc  string // empty: a missing file
		env  []string
		want string // the line on stdout after the path (exit 0), or the start of the last line on stderr (exit 1)
		code int
	}{
		"annotated example": {doc: string(annotated), code: 0,
			want: "(revision " + config.FileRevision(annotated) + ", steps prefill, decode)"},
		"listen address in use": {doc: inUse, code: 0, want: "(revision " + config.FileRevision([]byte(inUse)) + ", steps decode)"},
		"revision ignores environment overrides": {doc: decodeOnly, env: []string{"COORDINATOR_LOG_LEVEL=3"}, code: 0,
			want: "(revision " + config.FileRevision([]byte(decodeOnly)) + ", steps decode)"},
		"unknown key":        {doc: "server: {listen_adr: ':8080'}\n" + decodeOnly, code: 1, want: "invalid config %s: server.listen_adr"},
		"bad env override":   {doc: decodeOnly, env: []string{"COORDINATOR_GATEWAY_TIMEOUT=5"}, code: 1, want: "invalid config %s: gateway.timeout"},
		"unknown step":       {doc: "gateway: {address: http://gw}\npipeline: {steps: [{type: prefil}, {type: decode}]}", code: 1, want: "invalid pipeline in %s: pipeline.steps[0].type"},
		"missing gateway CA": {doc: "gateway: {address: https://gw, ca_file: /nonexistent/ca.crt}\npipeline: {steps: [{type: decode}]}", code: 1, want: "invalid config %s: gateway.ca_file"},
		"missing file":       {code: 1, want: "reading config: open %s: no such file"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "missing.yaml")
			if tc.doc != "" {
				path = writeConfig(t, tc.doc)
			}
			code, stdout, stderr := runBinary(t, tc.env, "--check", "--config", path)
			if code != tc.code {
				t.Fatalf("exit %d, want %d (stdout %q, stderr %q)", code, tc.code, stdout, stderr)
			}
			if tc.code == 0 {
				if want := "coordinator: config OK: " + path + " " + tc.want + "\n"; stdout != want {
					t.Fatalf("stdout %q, want %q", stdout, want)
				}
				return
			}
			if want := "coordinator: " + strings.ReplaceAll(tc.want, "%s", path); !strings.HasPrefix(lastLine(stderr), want) || stdout != "" {
				t.Fatalf("stderr %q, want a last line starting with %q (stdout %q)", stderr, want, stdout)
			}
			// The same line as a normal start prints for the same file.
			startCode, _, startStderr := runBinary(t, tc.env, "--config", path)
			if startCode != 1 || lastLine(startStderr) != lastLine(stderr) {
				t.Fatalf("startup: exit %d, last line %q; --check: %q", startCode, lastLine(startStderr), lastLine(stderr))
			}
		})
	}
}

// startBinary runs the coordinator binary on a free port against gateway, with server (YAML
// flow items added to the server section, e.g. "shutdown_timeout: 5s"), and waits until ready.
func startBinary(t *testing.T, gateway, server string) (*exec.Cmd, string, *syncBuffer) {
	t.Helper()
	addr := freeAddr(t)
	path := writeConfig(t, fmt.Sprintf("server: {listen_addr: %q, metrics_port: 0, %s}\ngateway: {address: %s}\npipeline: {steps: [{type: decode}]}", addr, server, gateway))
	cmd := exec.Command(binary, "--config", path)
	logs := &syncBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("coordinator not ready: %s", logs.String())
		}
	}
	return cmd, "http://" + addr, logs
}

// streamWords starts a streamed chat and returns a channel with the number of content chunks read
// and whether the stream ended with [DONE], and one closed when the first chunk arrived.
func streamWords(url string, words int) (<-chan [2]int, <-chan struct{}) {
	res := make(chan [2]int, 1)
	started := make(chan struct{})
	go func() {
		var once sync.Once
		defer once.Do(func() { close(started) })
		body := fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":"drain"}],"max_tokens":%d,"stream":true}`, words)
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			res <- [2]int{0, 0}
			return
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		n, done := 0, 0
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "data: ") {
				once.Do(func() { close(started) })
				n++
				if line == "data: [DONE]" {
					done = 1
				}
			}
		}
		res <- [2]int{n, done}
	}()
	return res, started
}

// idleConn is a kept-alive connection to addr that served one request and is left idle.
func idleConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: coordinator\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("healthz %d, close %v: want a kept-alive 200", resp.StatusCode, resp.Close)
	}
	return c
}

// TestGracefulTermination is a rolling update's termination of one coordinator, as a pod behind
// a Service sees it (docs/upgrades.md#graceful-termination): two coordinators a and b behind the
// loopback Service model of package endpoints (new connections balanced over the ready ones, a
// backend dropped after two failed readiness probes 100ms apart, kept-alive connections pinned),
// a steady client load through the Service, and SIGTERM to a. Then a's readiness fails at once,
// a still accepts and serves new connections during the drain delay (each answer closing its
// connection), a stream in flight completes, a's idle kept-alive connections are closed when the
// drain delay ends (not before), a exits 0 within drain_delay + shutdown_timeout, and no request
// of the load fails.
func TestGracefulTermination(t *testing.T) {
	// The delay leaves the Service model ample time to drop a (about 200ms) on a loaded machine.
	const drainDelay, shutdownTimeout = 3 * time.Second, 10 * time.Second
	w, err := simworker.Start(simworker.Config{Role: simworker.RoleDecode, ITL: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	settings := fmt.Sprintf("drain_delay: %s, shutdown_timeout: %s", drainDelay, shutdownTimeout)
	a, aURL, aLogs := startBinary(t, w.URL(), settings)
	_, bURL, _ := startBinary(t, w.URL(), settings)
	aAddr, bAddr := strings.TrimPrefix(aURL, "http://"), strings.TrimPrefix(bURL, "http://")

	svc, err := endpoints.NewService(endpoints.Probe{Path: "/readyz", Period: 100 * time.Millisecond, FailureThreshold: 2}, aAddr, bAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := svc.WaitEndpoints(ctx, aAddr, bAddr); err != nil {
		t.Fatal(err)
	}
	load := endpoints.StartLoad(svc.URL(), 4, endpoints.Chat(simworker.DefaultModelName, 3)) // ~40ms a request
	defer load.Stop()
	if err := load.WaitServed(ctx, 40); err != nil {
		t.Fatal(err)
	}
	stream, started := streamWords(aURL, 200) // ~4s of tokens: past the drain delay
	<-started
	idle := idleConn(t, aAddr)

	signalled := time.Now()
	if err := a.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- a.Wait() }()

	// Readiness fails at once (the probe's own connection is accepted: the listener is open).
	for {
		resp, err := http.Get(aURL + "/readyz")
		if err != nil {
			t.Fatalf("readyz refused while draining: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable && string(b) == "draining" {
			break
		}
		if time.Since(signalled) > time.Second {
			t.Fatalf("readyz still %d %q 1s after SIGTERM", resp.StatusCode, b)
		}
	}
	// A new connection during the drain delay is served, and told to close.
	resp, err := http.Post(aURL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"late"}]}`))
	if err != nil {
		t.Fatalf("a new connection during the drain delay: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if servedIn := time.Since(signalled); resp.StatusCode != http.StatusOK || !resp.Close || servedIn >= drainDelay {
		t.Fatalf("during the drain delay: HTTP %d, close %v, %s after SIGTERM (delay %s)", resp.StatusCode, resp.Close, servedIn, drainDelay)
	}
	if err := svc.WaitEndpoints(ctx, bAddr); err != nil {
		t.Fatal(err)
	}

	// The idle kept-alive connection is closed when the drain delay ends, not before.
	_ = idle.SetReadDeadline(time.Now().Add(drainDelay + shutdownTimeout))
	if n, err := idle.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("idle connection: read %d bytes, %v; want EOF", n, err)
	}
	if closedAfter := time.Since(signalled); closedAfter < drainDelay {
		t.Fatalf("idle connection closed %s after SIGTERM, before the drain delay (%s) ended", closedAfter, drainDelay)
	}

	if got := <-stream; got != [2]int{200 + 2, 1} { // role chunk, 200 words, finish chunk; then [DONE]
		t.Fatalf("the stream in flight got %d events, done=%d; want 202 and [DONE]", got[0], got[1])
	}
	if err := <-exited; err != nil {
		t.Fatalf("exit after a clean drain: %v\n%s", err, aLogs)
	}
	if took := time.Since(signalled); took > drainDelay+shutdownTimeout {
		t.Fatalf("exited %s after SIGTERM, beyond drain_delay + shutdown_timeout", took)
	}
	if !strings.Contains(aLogs.String(), "drained; bye") {
		t.Fatalf("no clean drain in the log:\n%s", aLogs)
	}

	// The load goes on through b alone, then counts its failures across the whole termination.
	if err := load.WaitServed(ctx, load.Result().Served+40); err != nil {
		t.Fatal(err)
	}
	res := load.Stop()
	if res.Failed != 0 || svc.Refused() != 0 {
		t.Fatalf("%d of %d requests failed (%d connections found no endpoint):\n%s", res.Failed, res.Failed+res.Served, svc.Refused(),
			strings.Join(res.Failures, "\n"))
	}
	t.Logf("%d requests served through the termination, none failed", res.Served)
}

func TestGracefulShutdown(t *testing.T) {
	w, err := simworker.Start(simworker.Config{Role: simworker.RoleDecode, ITL: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	t.Run("without a drain delay the listener closes at once", func(t *testing.T) {
		cmd, url, logs := startBinary(t, w.URL(), "drain_delay: 0s, shutdown_timeout: 5s")
		res, started := streamWords(url, 40) // ~0.8s of tokens
		<-started
		exited := make(chan error, 1)
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		go func() { exited <- cmd.Wait() }()
		got := <-res // the stream ends before the process exits: the listener closed meanwhile
		if err := <-exited; err != nil {
			t.Fatalf("exit after a clean drain: %v\n%s", err, logs)
		}
		if got != [2]int{40 + 2, 1} {
			t.Fatalf("stream cut: %d events, done=%d", got[0], got[1])
		}
		if !strings.Contains(logs.String(), `"drain_delay":"0s"`) {
			t.Fatalf("the drain did not log its delay of 0s:\n%s", logs)
		}
	})

	t.Run("drain timeout cuts streams and exits 1", func(t *testing.T) {
		cmd, url, _ := startBinary(t, w.URL(), "drain_delay: 0s, shutdown_timeout: 200ms")
		res, started := streamWords(url, 200) // ~4s of tokens
		<-started
		_ = cmd.Process.Signal(syscall.SIGTERM)
		got := <-res
		var exit *exec.ExitError
		if err := cmd.Wait(); !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Fatalf("exit after a timed-out drain: %v", err)
		}
		if got[1] != 0 {
			t.Fatal("the stream finished although the drain timed out")
		}
	})

	t.Run("a second signal ends the drain delay at once", func(t *testing.T) {
		cmd, url, logs := startBinary(t, w.URL(), "drain_delay: 1h")
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		for { // the first signal was handled: the server drains
			resp, err := http.Get(url + "/readyz")
			if err != nil {
				t.Fatalf("readyz while draining: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable {
				break
			}
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		var exit *exec.ExitError
		if err := cmd.Wait(); !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
			t.Fatalf("after a second SIGTERM: %v, want killed by the signal\n%s", err, logs)
		}
	})
}

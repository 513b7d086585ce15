//go:build linux

// Package faults is the worker-fault suite: the real coordinator binary in front of the gateway
// double (round-robin picks, ejection after a failed connection, Envoy's and the EPP's own
// failures) and several simworker processes per role, driven through the official OpenAI Go SDK
// under load while workers are SIGKILLed mid-stream, hang after their headers, reset
// connections and answer 503. Every client answer is checked whole: the exact text, one id, a
// clean end of stream.
//
// FAULTS_COORDINATOR=/path/to/coordinator runs the suite against another build (for before and
// after figures); by default it builds ./cmd/coordinator. FAULTS_LEGACY_CONFIG=1 writes only
// settings an older build knows.
package faults

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/epd-dev/coordinator/dataplane/connectors/kv"
	"github.com/epd-dev/coordinator/test/doubles/gateway"
	"github.com/epd-dev/coordinator/test/doubles/simworker"
	coordinatorproc "github.com/epd-dev/coordinator/test/internal/coordinator"
	"github.com/epd-dev/coordinator/test/internal/loopback"
)

var coordinatorBin, simworkerBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "faults-bin-")
	if err != nil {
		panic(err)
	}
	if coordinatorBin, err = coordinatorproc.Binary("FAULTS_COORDINATOR", dir); err != nil {
		panic(err)
	}
	if simworkerBin, err = coordinatorproc.Build("./test/doubles/simworker/cmd/simworker", dir); err != nil {
		panic(err)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// worker is a simworker process.
type worker struct {
	role simworker.Role
	url  string
	cmd  *exec.Cmd
	logs *loopback.Log
}

// startWorker runs a simworker process with fault control and waits for its URL.
func startWorker(t *testing.T, role simworker.Role, name string, extra ...string) *worker {
	t.Helper()
	args := append([]string{"--role", string(role), "--name", name, "--fault-control", "--no-record", "--itl", "2ms"}, extra...)
	w := &worker{role: role, logs: &loopback.Log{}, cmd: exec.Command(simworkerBin, args...)}
	w.cmd.Stderr = w.logs
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.kill(t) })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("simworker %s printed no URL: %v\n%s", name, err, w.logs.Tail(2000))
	}
	w.url = strings.TrimSpace(line)
	return w
}

// kill SIGKILLs the worker (idempotent) and reaps it.
func (w *worker) kill(t *testing.T) {
	if w.cmd.ProcessState != nil {
		return
	}
	_ = w.cmd.Process.Signal(syscall.SIGKILL)
	_ = w.cmd.Wait()
}

// inject queues a fault on the worker through its control endpoint.
func (w *worker) inject(t *testing.T, f simworker.Fault) {
	t.Helper()
	b, _ := json.Marshal(f)
	resp, err := http.Post(w.url+simworker.PathFaults, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("inject %+v: %d %s", f, resp.StatusCode, msg)
	}
}

// cluster is the gateway double in process, worker processes behind it and a coordinator
// process in front.
type cluster struct {
	gw     *gateway.Gateway
	pools  map[string][]*worker
	url    string // the coordinator
	admin  string
	logs   *loopback.Log // the coordinator's
	client openai.Client
}

// options shape a cluster.
type options struct {
	prefill, decode, encode int
	// steps is the pipeline (YAML flow sequence items), gateway extra YAML of the gateway section,
	// pipeline extra YAML of the pipeline section.
	steps, gateway, pipeline string
	gwConfig                 gateway.Config
	// sglang runs kv-sglang workers, each prefill on a loopback address of its own with its
	// bootstrap server on one port (as pods have IPs), and a kv-sglang pipeline.
	sglang bool
}

func startCluster(t *testing.T, o options) *cluster {
	t.Helper()
	c := &cluster{pools: map[string][]*worker{}}
	roles := []struct {
		profile string
		role    simworker.Role
		n       int
	}{{"prefill", simworker.RolePrefill, o.prefill}, {"decode", simworker.RoleDecode, o.decode}, {"encode", simworker.RoleEncode, o.encode}}
	cfg := o.gwConfig
	cfg.Pools = map[string][]string{}
	var env []string
	var bootstrapPort string
	var prefillIPs []string
	if o.sglang {
		for range o.prefill {
			prefillIPs = append(prefillIPs, fmt.Sprintf("127.%d.%d.%d", 1+rand.IntN(254), rand.IntN(256), 1+rand.IntN(254)))
		}
		bootstrapPort = sharedPort(t, prefillIPs)
		env = append(env, kv.SGLangBootstrapPortEnv+"="+bootstrapPort)
	}
	for _, r := range roles {
		for i := range r.n {
			var extra []string
			if o.sglang {
				extra = append(extra, "--kv-connector", "kv-sglang")
				if r.role == simworker.RolePrefill {
					ip := prefillIPs[i]
					extra = append(extra, "--addr", ip+":0", "--bootstrap-addr", net.JoinHostPort(ip, bootstrapPort))
				}
			}
			w := startWorker(t, r.role, fmt.Sprintf("%s-%d", r.profile, i), extra...)
			c.pools[r.profile] = append(c.pools[r.profile], w)
			cfg.Pools[r.profile] = append(cfg.Pools[r.profile], w.url)
		}
	}
	gw, err := gateway.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	c.gw = gw

	legacy := os.Getenv("FAULTS_LEGACY_CONFIG") != ""
	gwYAML := "address: " + gw.URL()
	if !legacy {
		// The picker's reservations name the workers' loopback addresses.
		gwYAML += ", allowed_hint_networks: [127.0.0.0/8]"
	}
	if o.gateway != "" && !legacy {
		gwYAML += ", " + o.gateway
	}
	kvName := "kv-nixl"
	if o.sglang {
		kvName = "kv-sglang"
	}
	pipe := "kv_connector: " + kvName + ", ec_connector: ec-nixl, steps: [" + o.steps + "]"
	if o.pipeline != "" && !legacy {
		pipe += ", " + o.pipeline
	}
	p := coordinatorproc.Start(t, coordinatorBin, func(addr, adminPort string) string {
		return fmt.Sprintf("log_level: 3\nserver: {listen_addr: %q, metrics_port: %s}\ngateway: {%s}\npipeline: {%s}\n", addr, adminPort, gwYAML, pipe)
	}, env...)
	c.url, c.admin, c.logs = p.URL, p.Admin, p.Logs
	c.client = openai.NewClient(option.WithBaseURL(c.url+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0),
		option.WithHTTPClient(&http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}))
	return c
}

// metric sums the samples of a metric family whose labels include every given pair.
func (c *cluster) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get(c.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var sum float64
	for line := range strings.SplitSeq(string(b), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			match = match && strings.Contains(line, labels[i]+`="`+labels[i+1]+`"`)
		}
		if !match {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// outcome is one client request's result.
type outcome struct {
	stream    bool
	err       error
	truncated string // why the answer is not the whole expected answer
	duration  time.Duration
}

// tally counts outcomes.
type tally struct {
	mu                      sync.Mutex
	sent, failed, truncated int
	examples                []string
	maxDuration             time.Duration
	byStatus                map[int]int
}

func (ta *tally) add(o outcome) {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	ta.sent++
	ta.maxDuration = max(ta.maxDuration, o.duration)
	switch {
	case o.err != nil:
		ta.failed++
		var apiErr *openai.Error
		if errors.As(o.err, &apiErr) {
			if ta.byStatus == nil {
				ta.byStatus = map[int]int{}
			}
			ta.byStatus[apiErr.StatusCode]++
		}
		if len(ta.examples) < 5 {
			msg := o.err.Error()
			if apiErr != nil {
				msg = fmt.Sprintf("%d %s", apiErr.StatusCode, apiErr.Message)
			}
			ta.examples = append(ta.examples, fmt.Sprintf("stream=%v: %s", o.stream, msg))
		}
	case o.truncated != "":
		ta.truncated++
		if len(ta.examples) < 5 {
			ta.examples = append(ta.examples, fmt.Sprintf("stream=%v truncated: %s", o.stream, o.truncated))
		}
	}
}

func (ta *tally) String() string {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	return fmt.Sprintf("sent %d, failed %d, truncated %d (statuses %v; slowest %s) %q", ta.sent, ta.failed, ta.truncated,
		ta.byStatus, ta.maxDuration.Round(time.Millisecond), ta.examples)
}

// prompt is the n-th distinct prompt of a client, and want the answer simworker gives it: the
// words of the user message cycled to maxTokens words.
func prompt(client, n int) (string, string) {
	words := []string{fmt.Sprintf("c%d", client), fmt.Sprintf("n%d", n), "alpha", "beta", "gamma", "delta", "epsilon"}
	var out []string
	for i := range maxTokens {
		out = append(out, words[i%len(words)])
	}
	return strings.Join(words, " "), strings.Join(out, " ")
}

// maxTokens is the answer length of every request: long enough that a kill lands mid-stream.
const maxTokens = 24

// ask sends one chat, streamed or not, and checks the whole answer.
func (c *cluster) ask(ctx context.Context, client, n int, stream bool) outcome {
	text, want := prompt(client, n)
	params := openai.ChatCompletionNewParams{
		Model:     "sim-model",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(text)},
		MaxTokens: openai.Int(maxTokens),
	}
	start := time.Now()
	o := outcome{stream: stream}
	if !stream {
		resp, err := c.client.Chat.Completions.New(ctx, params)
		o.duration, o.err = time.Since(start), err
		if err == nil && (len(resp.Choices) != 1 || resp.Choices[0].Message.Content != want) {
			o.truncated = fmt.Sprintf("got %q", resp.Choices[0].Message.Content)
		}
		return o
	}
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	s := c.client.Chat.Completions.NewStreaming(ctx, params)
	var sb strings.Builder
	ids := map[string]bool{}
	var usage openai.CompletionUsage
	for s.Next() {
		ch := s.Current()
		ids[ch.ID] = true
		for _, choice := range ch.Choices {
			sb.WriteString(choice.Delta.Content)
		}
		if ch.Usage.TotalTokens > 0 {
			usage = ch.Usage
		}
	}
	o.duration, o.err = time.Since(start), s.Err()
	switch {
	case o.err != nil:
	case sb.String() != want:
		o.truncated = fmt.Sprintf("got %q", sb.String())
	case len(ids) != 1:
		o.truncated = fmt.Sprintf("ids %v", ids)
	case usage.CompletionTokens != maxTokens || usage.TotalTokens != usage.PromptTokens+usage.CompletionTokens:
		o.truncated = fmt.Sprintf("usage %+v", usage)
	}
	return o
}

// load runs clients concurrently, each sending requests (alternating streamed and not) until ctx
// ends or until each sent perClient; it returns the tally.
func (c *cluster) load(ctx context.Context, clients, perClient int, progress func(done int)) *tally {
	ta := &tally{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	for i := range clients {
		wg.Go(func() {
			for n := 0; perClient == 0 || n < perClient; n++ {
				if ctx.Err() != nil {
					return
				}
				ta.add(c.ask(context.WithoutCancel(ctx), i, n, (i+n)%2 == 0))
				if progress != nil {
					mu.Lock()
					done++
					d := done
					mu.Unlock()
					progress(d)
				}
			}
		})
	}
	wg.Wait()
	return ta
}

// awaitInFlight waits until the gateway has a decode leg in flight on backend (a stream to
// cut), or fails the test after a bound.
func (c *cluster) awaitInFlight(t *testing.T, backend string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		for _, l := range c.gw.Legs() {
			if l.Backend == backend && l.Status == 0 {
				return
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("no leg in flight on %s", backend)
}

// sharedPort returns a port every one of ips can listen on, below the ephemeral range (Linux's
// default starts at 32768), so that no connection of another test takes it as its source port
// between now and the workers' listening on it (a port from 127.0.0.1:0 could be:
// "bind: address already in use").
func sharedPort(t *testing.T, ips []string) string {
	t.Helper()
	for range 100 {
		port := strconv.Itoa(20000 + rand.IntN(12000))
		free := true
		for _, ip := range ips {
			l, err := net.Listen("tcp", net.JoinHostPort(ip, port))
			if err != nil {
				free = false
				break
			}
			l.Close()
		}
		if free {
			return port
		}
	}
	t.Fatal("no port below the ephemeral range is free on every prefill address")
	return ""
}

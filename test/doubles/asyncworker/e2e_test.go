package asyncworker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/broker"
	"github.com/epd-dev/coordinator/dataplane/broker/redisbroker"
	"github.com/epd-dev/coordinator/test/doubles/asyncworker"
	"github.com/epd-dev/coordinator/test/doubles/asyncworker/redistest"
	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/harness/stack"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"), goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		// After PoolSize failed dials go-redis probes the address once a second until the pool is
		// closed; a closed pool's prober exits at its next wake-up.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// e2e is Redis, a worker pool behind the gateway double, an in-process coordinator whose pipeline
// is async-broker then decode, and (once started) an async worker.
type e2e struct {
	t      *testing.T
	redis  *redistest.Server
	rdb    *redis.Client
	stack  *stack.Stack
	coord  *stack.Coordinator
	client openai.Client
	worker *asyncworker.Worker
}

// startE2E starts everything but the worker. brokerParams is the YAML of the async-broker
// params (indented by 8), after redis_url.
func startE2E(t *testing.T, o stack.Options, brokerParams string) *e2e {
	t.Helper()
	rs := redistest.Start(t, redistest.Options{Notify: "Kl"})
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	st, err := stack.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	doc := fmt.Sprintf(`gateway:
  address: %s
pipeline:
  kv_connector: kv-nixl
  ec_connector: ec-nixl
  steps:
    - type: async-broker
      params:
        redis_url: %s
%s    - type: decode
`, st.Gateway.URL(), rs.URL(), brokerParams)
	cfg, err := config.Parse([]byte(doc), nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	coord, err := stack.StartCoordinatorWith(cfg, stack.CoordinatorOptions{Log: testLogger(),
		Broker: redisbroker.Options{PollInterval: 20 * time.Millisecond, BackupPollInterval: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		coord.Close()
		coord.Pipeline.Close()
	})
	client := openai.NewClient(option.WithBaseURL(coord.URL()+"/v1/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0),
		option.WithRequestTimeout(30*time.Second))
	return &e2e{t: t, redis: rs, rdb: rdb, stack: st, coord: coord, client: client}
}

// startWorker runs an async worker against the coordinator until the test ends.
func (e *e2e) startWorker() {
	e.t.Helper()
	w, err := asyncworker.New(asyncworker.Config{
		RedisURL: e.redis.URL(), Coordinator: e.coord.URL(), Concurrency: 2, CancelPoll: 50 * time.Millisecond, Log: testLogger(),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(ctx); close(done) }()
	e.t.Cleanup(func() {
		cancel()
		<-done
		_ = w.Close()
	})
	e.worker = w
}

func chatParams(text string, maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     "sim-model",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage(text)},
		MaxTokens: openai.Int(maxTokens),
	}
}

// post sends a raw chat request (enqueue answers 202 {"id","status"}, which is no completion).
func (e *e2e) post(text string, hdr map[string]string) (int, map[string]any) {
	e.t.Helper()
	body, _ := json.Marshal(chatParams(text, 5))
	return e.do(http.MethodPost, "/v1/chat/completions", string(body), hdr)
}

func (e *e2e) do(method, path, body string, hdr map[string]string) (int, map[string]any) {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.coord.URL()+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if len(b) > 0 {
		if err := json.Unmarshal(b, &m); err != nil {
			e.t.Fatalf("%s %s answered %d with non-JSON %q", method, path, resp.StatusCode, b)
		}
	}
	return resp.StatusCode, m
}

// poll GETs the request until it is no longer pending.
func (e *e2e) poll(id string, hdr map[string]string, within time.Duration) (int, map[string]any) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		status, m := e.do(http.MethodGet, "/v1/requests/"+id, "", hdr)
		if status != http.StatusAccepted || time.Now().After(deadline) {
			return status, m
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func content(t *testing.T, m map[string]any) string {
	t.Helper()
	b, _ := json.Marshal(m)
	var c openai.ChatCompletion
	if err := json.Unmarshal(b, &c); err != nil || len(c.Choices) != 1 || c.Object != "chat.completion" {
		t.Fatalf("not a chat completion (%v): %s", err, b)
	}
	return c.Choices[0].Message.Content
}

func errorCode(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

// decodeRequests returns the decode workers' requests carrying x-request-id id.
func (e *e2e) decodeRequests(id string) []simworker.Request {
	var out []simworker.Request
	for _, w := range e.stack.Decode {
		for _, r := range w.Requests() {
			if r.Header.Get("X-Request-Id") == id {
				out = append(out, r)
			}
		}
	}
	return out
}

// The full round trip: enqueue through the coordinator, the worker runs it through the
// coordinator again (without the mode header) to a decode worker, GET returns the completion.
func TestEnqueueWorkerGet(t *testing.T) {
	e := startE2E(t, stack.Options{}, "")
	e.startWorker()
	tenant := map[string]string{"X-Team": "teamA"}
	status, m := e.post("alpha beta gamma", map[string]string{"X-AP-Mode": "enqueue", "X-Team": "teamA", "x-request-id": "rt-1", "x-slo-ttft-ms": "250"})
	if status != http.StatusAccepted || m["id"] != "rt-1" || m["status"] != "pending" {
		t.Fatalf("enqueue = %d %v", status, m)
	}
	status, m = e.poll("rt-1", tenant, 10*time.Second)
	if status != 200 {
		t.Fatalf("GET = %d %v", status, m)
	}
	if got := content(t, m); got != "alpha beta gamma alpha beta" {
		t.Fatalf("completion = %q", got)
	}
	legs := e.decodeRequests("rt-1")
	if len(legs) != 1 {
		t.Fatalf("decode got %d requests for rt-1, want 1", len(legs))
	}
	h := legs[0].Header
	if h.Get("X-AP-Mode") != "" || h.Get("x-slo-ttft-ms") != "250" {
		t.Fatalf("decode leg headers = %v", h)
	}
	// Another tenant cannot see it.
	if status, m := e.do(http.MethodGet, "/v1/requests/rt-1", "", map[string]string{"X-Team": "teamB"}); status != http.StatusGone || errorCode(m) != "UNKNOWN_REQUEST" {
		t.Fatalf("GET as another tenant = %d %v", status, m)
	}
	if s := e.worker.Stats(); s.Completed != 1 {
		t.Fatalf("worker stats = %+v", s)
	}
}

// Wait mode through the official SDK: the completion comes back inline.
func TestWaitModeWithSDK(t *testing.T) {
	e := startE2E(t, stack.Options{}, "")
	e.startWorker()
	start := time.Now()
	resp, err := e.client.Chat.Completions.New(context.Background(), chatParams("one two three", 4),
		option.WithHeader("X-AP-Mode", "wait"), option.WithHeader("X-Team", "teamA"), option.WithHeader("X-Request-Id", "sdk-wait"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Message.Content != "one two three one" || resp.Usage.CompletionTokens != 4 {
		t.Fatalf("answer %+v", resp.Choices[0].Message)
	}
	if len(e.decodeRequests("sdk-wait")) != 1 {
		t.Fatal("the wait-mode request did not run exactly once")
	}
	t.Logf("wait mode round trip: %s", time.Since(start))
}

// Passthrough through the SDK: served at once, labelled for the scheduler.
func TestPassthroughWithSDK(t *testing.T) {
	e := startE2E(t, stack.Options{}, `        objectives:
          default: {reserved: interactive, overflow: batch}
        quota:
          limits: {teamA: 5}
`)
	resp, err := e.client.Chat.Completions.New(context.Background(), chatParams("x y", 2),
		option.WithHeader("X-AP-Mode", "passthrough"), option.WithHeader("X-Team", "teamA"), option.WithHeader("X-Request-Id", "pt-1"),
		option.WithHeader("X-Gateway-Inference-Objective", "self-chosen"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Message.Content != "x y" {
		t.Fatalf("answer %q", resp.Choices[0].Message.Content)
	}
	legs := e.decodeRequests("pt-1")
	if len(legs) != 1 {
		t.Fatalf("decode legs = %d", len(legs))
	}
	h := legs[0].Header
	if h.Get("X-Gateway-Inference-Objective") != "interactive" || h.Get("X-Gateway-Inference-Fairness-Id") != "teamA" || h.Get("X-AP-Mode") != "" {
		t.Fatalf("decode leg headers = %v", h)
	}
	// The slot is held until the request's context ends, which the server does once the answer
	// is written: the client may read the answer first.
	deadline := time.Now().Add(5 * time.Second)
	for e.rdb.Exists(context.Background(), "quota:userid:teamA").Val() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the reserved slot was not given back after the request")
		}
	}
}

// Deadlines and the wait cap against a slow decode worker.
func TestDeadlineAndWaitCap(t *testing.T) {
	e := startE2E(t, stack.Options{TTFT: 2 * time.Second}, "        wait_cap_seconds: 1\n")
	e.startWorker()
	// The request's own deadline (1s) comes before the cap: 504 through the SDK.
	_, err := e.client.Chat.Completions.New(context.Background(), chatParams("slow", 2),
		option.WithHeader("X-AP-Mode", "wait"), option.WithHeader("X-Request-Timeout-Seconds", "1"))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusGatewayTimeout || apiErr.Type != "timeout_error" || apiErr.Code != "DEADLINE_EXCEEDED" {
		t.Fatalf("wait past the deadline: %v", err)
	}
	// The cap (1s) comes first: 202, then the completion by GET.
	start := time.Now()
	status, m := e.post("capped request", map[string]string{"X-AP-Mode": "wait", "x-request-id": "capped"})
	if status != http.StatusAccepted || m["status"] != "pending" || time.Since(start) > 4*time.Second {
		t.Fatalf("capped wait = %d %v after %s", status, m, time.Since(start))
	}
	status, m = e.poll("capped", nil, 10*time.Second)
	if status != 200 || content(t, m) != "capped request capped request capped" {
		t.Fatalf("GET after the cap = %d %v", status, m)
	}
}

// DELETE while queued (before any worker runs) and while running (the worker aborts the call).
func TestCancel(t *testing.T) {
	e := startE2E(t, stack.Options{TTFT: 3 * time.Second}, "")
	// Queued.
	if status, _ := e.post("never run", map[string]string{"X-AP-Mode": "enqueue", "x-request-id": "cancel-queued"}); status != http.StatusAccepted {
		t.Fatal(status)
	}
	if status, _ := e.do(http.MethodDelete, "/v1/requests/cancel-queued", "", nil); status != http.StatusNoContent {
		t.Fatalf("DELETE = %d", status)
	}
	if status, m := e.do(http.MethodGet, "/v1/requests/cancel-queued", "", nil); status != 499 || errorCode(m) != "CANCELLED" {
		t.Fatalf("GET after DELETE = %d %v", status, m)
	}
	e.startWorker()
	deadline := time.Now().Add(5 * time.Second)
	for e.worker.Stats().Cancelled == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s := e.worker.Stats(); s.Cancelled != 1 || len(e.decodeRequests("cancel-queued")) != 0 {
		t.Fatalf("the cancelled request ran: stats %+v", s)
	}
	if status, m := e.do(http.MethodGet, "/v1/requests/cancel-queued", "", nil); status != 499 || errorCode(m) != "CANCELLED" {
		t.Fatalf("GET after the worker saw it = %d %v", status, m)
	}

	// Running.
	if status, _ := e.post("long answer", map[string]string{"X-AP-Mode": "enqueue", "x-request-id": "cancel-running"}); status != http.StatusAccepted {
		t.Fatal(status)
	}
	deadline = time.Now().Add(5 * time.Second)
	for len(e.decodeRequests("cancel-running")) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	if status, _ := e.do(http.MethodDelete, "/v1/requests/cancel-running", "", nil); status != http.StatusNoContent {
		t.Fatalf("DELETE = %d", status)
	}
	for e.worker.Stats().Cancelled < 2 && time.Since(start) < 5*time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	// Had the abort failed, the completion (TTFT 3s) would be stored and GET would answer 200.
	if status, m := e.do(http.MethodGet, "/v1/requests/cancel-running", "", nil); status != 499 || errorCode(m) != "CANCELLED" {
		t.Fatalf("GET after cancelling a running request = %d %v", status, m)
	}
	if s := e.worker.Stats(); s.Cancelled != 2 || s.Completed != 0 {
		t.Fatalf("worker stats = %+v", s)
	}
	t.Logf("running request aborted %s after DELETE", time.Since(start))
}

// testLogger shows logs when COORDINATOR_TEST_LOG is set.
func testLogger() logr.Logger {
	if os.Getenv("COORDINATOR_TEST_LOG") == "" {
		return logr.Discard()
	}
	return logging.New(logging.Trace, os.Stderr)
}

// Redis restarts without persistence while a wait-mode request is queued: the coordinator
// queues it again and the client still gets its completion.
func TestWaitSurvivesRedisRestart(t *testing.T) {
	e := startE2E(t, stack.Options{}, "")
	type answer struct {
		resp *openai.ChatCompletion
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := e.client.Chat.Completions.New(context.Background(), chatParams("after the restart", 3),
			option.WithHeader("X-AP-Mode", "wait"), option.WithHeader("X-Request-Id", "restart-1"))
		done <- answer{resp, err}
	}()
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Second)
	for e.rdb.ZCard(ctx, broker.DefaultQueue).Val() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	e.redis.Restart() // the queue and every marker are gone
	e.startWorker()
	select {
	case a := <-done:
		if a.err != nil {
			t.Fatal(a.err)
		}
		if a.resp.Choices[0].Message.Content != "after the restart" {
			t.Fatalf("answer %q", a.resp.Choices[0].Message.Content)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the waiting request never got its answer after the Redis restart")
	}
	if n := len(e.decodeRequests("restart-1")); n != 1 {
		t.Fatalf("the request ran %d times", n)
	}
}

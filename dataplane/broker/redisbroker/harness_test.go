package redisbroker

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/epd-dev/coordinator/dataplane/steps" // the async-broker step

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/broker"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/server"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/test/doubles/asyncworker/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"), goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		// After PoolSize failed dials go-redis probes the address once a second until the pool is
		// closed; a closed pool's prober exits at its next wake-up (within 1s).
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// Test steps: test-noop does nothing (a step before async-broker), test-sink is a terminal step
// that answers 200 with the headers the request would forward; with X-Test-Hold it first waits
// until the test releases it.
const (
	noopStep = "test-noop"
	sinkStep = "test-sink"
)

var (
	holdMu sync.Mutex
	holds  = map[string]chan struct{}{}
)

// holdGate returns the gate that X-Test-Hold: name waits on.
func holdGate(name string) chan struct{} {
	holdMu.Lock()
	defer holdMu.Unlock()
	g, ok := holds[name]
	if !ok {
		g = make(chan struct{})
		holds[name] = g
	}
	return g
}

type funcStep struct {
	name     string
	terminal bool
	fn       func(ctx context.Context, rc *request.Context) error
}

func (f funcStep) Name() string   { return f.name }
func (f funcStep) Terminal() bool { return f.terminal }
func (f funcStep) Execute(ctx context.Context, rc *request.Context) error {
	return f.fn(ctx, rc)
}

func init() {
	builder.Register(builder.Type{Name: noopStep, New: func(builder.Deps, *params.Params) (pipeline.Step, error) {
		return funcStep{name: noopStep, fn: func(context.Context, *request.Context) error { return nil }}, nil
	}})
	builder.Register(builder.Type{Name: sinkStep, New: func(builder.Deps, *params.Params) (pipeline.Step, error) {
		return funcStep{name: sinkStep, terminal: true, fn: sink}, nil
	}})
}

// sinkAnswer is what test-sink answers.
type sinkAnswer struct {
	Forwarded map[string]string `json:"forwarded"`
	Model     string            `json:"model"`
}

func sink(ctx context.Context, rc *request.Context) error {
	if name := rc.Header.Get("X-Test-Hold"); name != "" {
		select {
		case <-holdGate(name):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	a := sinkAnswer{Forwarded: map[string]string{}, Model: rc.Model}
	for k := range rc.Forwarded {
		a.Forwarded[strings.ToLower(k)] = rc.Forwarded.Get(k)
	}
	b, _ := json.Marshal(a)
	rc.Writer.Header().Set("Content-Type", "application/json")
	rc.Writer.WriteHeader(http.StatusOK)
	_, _ = rc.Writer.Write(b)
	return nil
}

// coord is an in-process coordinator whose pipeline is async-broker then test-sink.
type coord struct {
	t    *testing.T
	url  string
	pipe *pipeline.Pipeline
}

// fastHooks poll quickly so tests do not wait on the production intervals.
var fastHooks = Options{PollInterval: 20 * time.Millisecond, BackupPollInterval: 100 * time.Millisecond}

func startCoord(t *testing.T, own map[string]any, o Options) *coord {
	t.Helper()
	cfg := config.Default()
	cfg.Server.ListenAddr = "127.0.0.1:0"
	cfg.Pipeline.Steps = []config.Step{{Type: broker.StepType, Params: own}, {Type: sinkStep}}
	p, err := builder.Build(cfg, builder.Options{Log: logr.Discard(), Shared: builder.Shared{Broker: Runtime(o)}})
	if err != nil {
		t.Fatal(err)
	}
	holder := &pipeline.Holder{}
	holder.Swap(p)
	srv := server.New(server.Options{Server: cfg.Server, Pipelines: holder, Log: logr.Discard()})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = srv.Serve(l); close(done) }()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
		p.Close()
	})
	return &coord{t: t, url: "http://" + l.Addr().String(), pipe: p}
}

// reply is a finished HTTP exchange.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("reply %d is not JSON: %v: %s", r.status, err, r.body)
	}
	return m
}

// apiError returns the OpenAI error object of the reply.
func (r reply) apiError(t *testing.T) map[string]any {
	t.Helper()
	e, ok := r.json(t)["error"].(map[string]any)
	if !ok {
		t.Fatalf("reply %d has no error object: %s", r.status, r.body)
	}
	return e
}

func (r reply) expectError(t *testing.T, status int, typ, code string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d: %s", r.status, status, r.body)
	}
	e := r.apiError(t)
	if e["type"] != typ || e["code"] != code {
		t.Fatalf("error type/code = %v/%v, want %s/%s: %s", e["type"], e["code"], typ, code, r.body)
	}
}

var testHTTP = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

func (c *coord) do(ctx context.Context, method, path, body string, hdr map[string]string) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.url+path, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := testHTTP.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, err
}

func (c *coord) must(method, path, body string, hdr map[string]string) reply {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.do(ctx, method, path, body, hdr)
	if err != nil {
		c.t.Fatal(err)
	}
	return r
}

// chat posts a chat completion with headers.
func (c *coord) chat(hdr map[string]string) reply {
	c.t.Helper()
	return c.must(http.MethodPost, "/v1/chat/completions", chatBody, hdr)
}

const chatBody = `{"model":"m1","messages":[{"role":"user","content":"hello"}],"max_tokens":8}`

// hdr builds a header map from pairs.
func hdr(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// startRedis runs a redis-server with list keyspace notifications.
func startRedis(t *testing.T) *redistest.Server {
	return redistest.Start(t, redistest.Options{Notify: "Kl"})
}

func redisClient(t *testing.T, s *redistest.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), Protocol: 2})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// baseParams are minimal params for a Redis server.
func baseParams(s *redistest.Server) map[string]any {
	return map[string]any{"redis_url": s.URL()}
}

// popEnvelope takes the next envelope of queue, waiting up to 10s (a fake consumer).
func popEnvelope(t *testing.T, rdb *redis.Client, queue string) (Envelope, string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		zs, err := rdb.ZPopMin(context.Background(), queue, 1).Result()
		if err == nil && len(zs) == 1 {
			member := zs[0].Member.(string)
			var env Envelope
			if err := json.Unmarshal([]byte(member), &env); err != nil {
				t.Fatalf("queued member is not an envelope: %v: %s", err, member)
			}
			return env, member
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("nothing was queued on %s", queue)
	return Envelope{}, ""
}

// storeResult does what a consumer does when a request is done.
func storeResult(t *testing.T, rdb *redis.Client, env Envelope, res Result) {
	t.Helper()
	b, _ := json.Marshal(res)
	storeRaw(t, rdb, env, string(b))
}

func storeRaw(t *testing.T, rdb *redis.Client, env Envelope, raw string) {
	t.Helper()
	ctx := context.Background()
	_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.LPush(ctx, env.Internal.ResultQueueName, raw)
		p.Expire(ctx, env.Internal.ResultQueueName, time.Hour)
		p.Del(ctx, ActiveKey(env.Data.ID))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// async runs fn in a goroutine and returns its reply on a channel.
func async(fn func() (reply, error)) <-chan result2 {
	ch := make(chan result2, 1)
	go func() {
		r, err := fn()
		ch <- result2{r, err}
	}()
	return ch
}

type result2 struct {
	reply
	err error
}

func awaitReply(t *testing.T, ch <-chan result2, within time.Duration) reply {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.reply
	case <-time.After(within):
		t.Fatalf("no reply within %s", within)
	}
	return reply{}
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s", within, what)
}

// watchWaiters records the waiters' progress (waitHook) for the rest of the test.
func watchWaiters(t *testing.T) <-chan waitEvent {
	t.Helper()
	ch := make(chan waitEvent, 1024)
	h := func(e waitEvent) {
		select {
		case ch <- e:
		default: // a waiter polling for long: the test reads the events it waits for as they come
		}
	}
	waitHook.Store(&h)
	t.Cleanup(func() { waitHook.Store(nil) })
	return ch
}

// awaitWaitEvent waits up to 10s for a waiter event of kind on mailbox from a waiter that did
// (ours) or did not create the queued copy.
func awaitWaitEvent(t *testing.T, events <-chan waitEvent, kind waitEventKind, mailbox string, ours bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e := <-events:
			if e == (waitEvent{kind: kind, mailbox: mailbox, ours: ours}) {
				return
			}
		case <-timeout:
			t.Fatalf("no waiter event %+v within 10s", waitEvent{kind: kind, mailbox: mailbox, ours: ours})
		}
	}
}

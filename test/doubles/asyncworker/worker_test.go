package asyncworker

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/epd-dev/coordinator/dataplane/broker/redisbroker"
	"github.com/epd-dev/coordinator/test/doubles/asyncworker/redistest"
)

// fakeCoordinator records what the worker sends; answer decides each reply.
type fakeCoordinator struct {
	srv    *httptest.Server
	mu     sync.Mutex
	seen   []*http.Request
	bodies []string
	answer func(w http.ResponseWriter, r *http.Request)
}

func newFakeCoordinator(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) *fakeCoordinator {
	f := &fakeCoordinator{answer: answer}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.seen = append(f.seen, r.Clone(context.Background()))
		f.bodies = append(f.bodies, string(b))
		f.mu.Unlock()
		f.answer(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeCoordinator) request(i int) (*http.Request, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seen[i], f.bodies[i]
}

func (f *fakeCoordinator) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.seen)
}

// rig is a Redis, a fake coordinator and a running worker.
type rig struct {
	t      *testing.T
	rdb    *redis.Client
	coord  *fakeCoordinator
	worker *Worker
	stop   func()
}

func newRig(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) *rig {
	t.Helper()
	srv := redistest.Start(t, redistest.Options{})
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	coord := newFakeCoordinator(t, answer)
	w, err := New(Config{RedisURL: srv.URL(), Coordinator: coord.srv.URL, Queues: []string{"q"}, Concurrency: 2, CancelPoll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
			_ = w.Close()
		})
	}
	t.Cleanup(stop)
	return &rig{t: t, rdb: rdb, coord: coord, worker: w, stop: stop}
}

// enqueue does what the broker does for a request: the live marker and the queued envelope.
func (r *rig) enqueue(id string, deadline time.Time, live bool) redisbroker.Envelope {
	r.t.Helper()
	envID := redisbroker.EnvelopeID("teamA", id)
	env := redisbroker.Envelope{
		Internal:    redisbroker.Routing{RequestQueueName: "q", ResultQueueName: redisbroker.ResultKey("teamA", id), RequestToken: "tok-" + id},
		RequestKind: redisbroker.RequestKindPlain,
		Data: redisbroker.Message{
			ID: envID, Created: time.Now().Unix(), Deadline: deadline.Unix(),
			Payload:  json.RawMessage(`{"model":"m","messages":[]}`),
			Metadata: map[string]string{"userid": "teamA", "traceparent": "00-abc-def-01"},
			Headers:  map[string]string{"x-slo-ttft-ms": "200", "x-ap-mode": "enqueue"},
			Endpoint: "/v1/chat/completions",
		},
	}
	ctx := context.Background()
	if live {
		r.rdb.Set(ctx, redisbroker.ActiveKey(envID), env.Internal.RequestToken, time.Hour)
	}
	b, _ := json.Marshal(env)
	if err := r.rdb.ZAdd(ctx, "q", redis.Z{Score: float64(env.Data.Deadline), Member: string(b)}).Err(); err != nil {
		r.t.Fatal(err)
	}
	return env
}

// result waits for the request's stored result.
func (r *rig) result(env redisbroker.Envelope) redisbroker.Result {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		raw, err := r.rdb.LIndex(context.Background(), env.Internal.ResultQueueName, 0).Result()
		if err == nil {
			var res redisbroker.Result
			if err := json.Unmarshal([]byte(raw), &res); err != nil {
				r.t.Fatalf("stored result is not JSON: %s", raw)
			}
			return res
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.t.Fatalf("no result stored for %s", env.Data.ID)
	return redisbroker.Result{}
}

func TestWorkerRunsAndStores(t *testing.T) {
	r := newRig(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
	env := r.enqueue("req-1", time.Now().Add(time.Minute), true)
	res := r.result(env)
	if res.ID != "teamA:req-1" || res.StatusCode != http.StatusCreated || res.Payload != `{"ok":true}` || res.ErrorCode != "" {
		t.Fatalf("result = %+v", res)
	}
	ctx := context.Background()
	if ttl := r.rdb.TTL(ctx, env.Internal.ResultQueueName).Val(); ttl <= 0 || ttl > time.Hour {
		t.Fatalf("mailbox TTL = %s", ttl)
	}
	if r.rdb.Exists(ctx, redisbroker.ActiveKey(env.Data.ID)).Val() != 0 {
		t.Fatal("the live marker was kept after the result")
	}
	req, body := r.coord.request(0)
	if req.Method != http.MethodPost || req.URL.Path != "/v1/chat/completions" || body != `{"model":"m","messages":[]}` {
		t.Fatalf("coordinator got %s %s %s", req.Method, req.URL.Path, body)
	}
	if req.Header.Get("X-AP-Mode") != "" {
		t.Fatal("the mode header reached the coordinator: the request would be queued again")
	}
	if req.Header.Get("x-request-id") != "req-1" || req.Header.Get("x-slo-ttft-ms") != "200" || req.Header.Get("traceparent") != "00-abc-def-01" {
		t.Fatalf("coordinator headers = %v", req.Header)
	}
	if s := r.worker.Stats(); s.Completed != 1 {
		t.Fatalf("stats = %+v", s)
	}
}

func TestWorkerSkipsCancelledExpiredAndSuperseded(t *testing.T) {
	r := newRig(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{}`) })
	ctx := context.Background()
	// What DELETE leaves behind (before the worker can see the copy): the token in the cancel marker.
	r.rdb.Set(ctx, redisbroker.CancelKey(redisbroker.EnvelopeID("teamA", "c")), "tok-c", time.Hour)
	cancelled := r.enqueue("c", time.Now().Add(time.Minute), false)
	if res := r.result(cancelled); res.ErrorCode != redisbroker.ErrCodeCancelled || res.StatusCode != 0 {
		t.Fatalf("cancelled result = %+v", res)
	}
	expired := r.enqueue("e", time.Now().Add(-time.Second), true)
	if res := r.result(expired); res.ErrorCode != redisbroker.ErrCodeDeadlineExceeded {
		t.Fatalf("expired result = %+v", res)
	}
	r.rdb.Set(ctx, redisbroker.ActiveKey(redisbroker.EnvelopeID("teamA", "s")), "another-token", time.Hour)
	superseded := r.enqueue("s", time.Now().Add(time.Minute), false)
	deadline := time.Now().Add(5 * time.Second)
	for r.worker.Stats().Dropped == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if r.worker.Stats().Dropped != 1 || r.rdb.Exists(ctx, superseded.Internal.ResultQueueName).Val() != 0 {
		t.Fatalf("superseded copy: stats %+v", r.worker.Stats())
	}
	if n := r.coord.count(); n != 0 {
		t.Fatalf("the coordinator got %d requests, want none", n)
	}
}

func TestWorkerCancelAndDeadlineWhileRunning(t *testing.T) {
	gone := make(chan string, 4)
	r := newRig(t, func(w http.ResponseWriter, req *http.Request) {
		<-req.Context().Done() // never answers: only cancellation ends it
		gone <- req.Header.Get("x-request-id")
	})
	ctx := context.Background()
	env := r.enqueue("running", time.Now().Add(time.Minute), true)
	deadline := time.Now().Add(5 * time.Second)
	for r.coord.count() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// What DELETE does: the live token moves to the cancel marker.
	r.rdb.Set(ctx, redisbroker.CancelKey(env.Data.ID), env.Internal.RequestToken, time.Hour)
	r.rdb.Del(ctx, redisbroker.ActiveKey(env.Data.ID))
	if res := r.result(env); res.ErrorCode != redisbroker.ErrCodeCancelled {
		t.Fatalf("result = %+v", res)
	}
	if id := <-gone; id != "running" {
		t.Fatalf("aborted request %q", id)
	}

	start := time.Now()
	late := r.enqueue("late", time.Now().Add(1500*time.Millisecond), true)
	if res := r.result(late); res.ErrorCode != redisbroker.ErrCodeDeadlineExceeded {
		t.Fatalf("result = %+v", res)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("deadline result after %s", d)
	}
	<-gone
}

func TestWorkerStopRequeues(t *testing.T) {
	r := newRig(t, func(w http.ResponseWriter, req *http.Request) { <-req.Context().Done() })
	env := r.enqueue("kept", time.Now().Add(time.Minute), true)
	deadline := time.Now().Add(5 * time.Second)
	for r.coord.count() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	r.stop()
	ctx := context.Background()
	members := r.rdb.ZRangeWithScores(ctx, "q", 0, -1).Val()
	if len(members) != 1 || int64(members[0].Score) != env.Data.Deadline {
		t.Fatalf("queue after stop = %v", members)
	}
	if r.rdb.Exists(ctx, env.Internal.ResultQueueName).Val() != 0 {
		t.Fatal("a stopped worker stored a result")
	}
	// A loop blocked in BZPOPMIN when the worker stopped may pop the request again and put it
	// back once more: what matters is that it is queued exactly once.
	if s := r.worker.Stats(); s.Requeued < 1 || s.Completed+s.Failed+s.Cancelled+s.Expired+s.Dropped != 0 {
		t.Fatalf("stats = %+v", s)
	}
}

func TestWorkerTransportError(t *testing.T) {
	r := newRig(t, func(w http.ResponseWriter, _ *http.Request) {})
	r.coord.srv.Close() // nothing listens any more
	env := r.enqueue("unreachable", time.Now().Add(time.Minute), true)
	if res := r.result(env); res.ErrorCode != redisbroker.ErrCodeInferenceError || res.ErrorMessage == "" {
		t.Fatalf("result = %+v", res)
	}
}

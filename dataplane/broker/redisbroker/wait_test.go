package redisbroker

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/dataplane/broker"
	"github.com/epd-dev/coordinator/test/doubles/asyncworker/redistest"
)

const completion = `{"id":"chatcmpl-9","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}`

func (c *coord) waitAsync(h map[string]string) <-chan result2 {
	return async(func() (reply, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		return c.do(ctx, http.MethodPost, "/v1/chat/completions", chatBody, h)
	})
}

// With keyspace notifications the waiter wakes on the result, not on its (here very slow) poll.
func TestWaitWokenByNotification(t *testing.T) {
	srv := startRedis(t)
	rdb := redisClient(t, srv)
	events := watchWaiters(t)
	c := startCoord(t, baseParams(srv), Options{PollInterval: time.Minute, BackupPollInterval: time.Minute})
	ch := c.waitAsync(hdr("X-AP-Mode", "wait", "X-Team", "teamA", "x-request-id", "w-1"))
	env, _ := popEnvelope(t, rdb, broker.DefaultQueue)
	// Store the result only once the waiter found it missing and parked, and Redis has its
	// subscription: from then on only the notification can wake it within a minute.
	mailbox := env.Internal.ResultQueueName
	awaitWaitEvent(t, events, parked, mailbox, true)
	channel := "__keyspace@0__:" + mailbox
	eventually(t, 5*time.Second, "the waiter's keyspace subscription", func() bool {
		return rdb.PubSubNumSub(context.Background(), channel).Val()[channel] == 1
	})
	stored := time.Now()
	storeResult(t, rdb, env, Result{ID: env.Data.ID, StatusCode: 200, Payload: completion})
	r := awaitReply(t, ch, 10*time.Second)
	if r.status != 200 || string(r.body) != completion {
		t.Fatalf("wait = %d %s", r.status, r.body)
	}
	if d := time.Since(stored); d > 2*time.Second {
		t.Fatalf("the waiter took %s to see the result: not woken by the notification", d)
	}
	if r.header.Get("x-request-id") != "w-1" {
		t.Fatalf("x-request-id = %q", r.header.Get("x-request-id"))
	}
}

// Without notifications (auto detects that) the waiter polls.
func TestWaitPollsWithoutNotifications(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{}) // notify-keyspace-events off
	rdb := redisClient(t, srv)
	c := startCoord(t, baseParams(srv), fastHooks)
	ch := c.waitAsync(hdr("X-AP-Mode", "wait"))
	env, _ := popEnvelope(t, rdb, broker.DefaultQueue)
	storeResult(t, rdb, env, Result{ID: env.Data.ID, StatusCode: 200, Payload: completion})
	if r := awaitReply(t, ch, 5*time.Second); r.status != 200 || string(r.body) != completion {
		t.Fatalf("wait = %d %s", r.status, r.body)
	}
}

// Error results are mapped to OpenAI errors.
func TestWaitErrorResult(t *testing.T) {
	srv := startRedis(t)
	rdb := redisClient(t, srv)
	c := startCoord(t, baseParams(srv), fastHooks)
	ch := c.waitAsync(hdr("X-AP-Mode", "wait"))
	env, _ := popEnvelope(t, rdb, broker.DefaultQueue)
	storeResult(t, rdb, env, Result{ID: env.Data.ID, ErrorCode: ErrCodeGateDropped, ErrorMessage: "Pool gating dropped request"})
	awaitReply(t, ch, 5*time.Second).expectError(t, 429, "rate_limit_error", "GATE_DROPPED")

	ch = c.waitAsync(hdr("X-AP-Mode", "wait"))
	env, _ = popEnvelope(t, rdb, broker.DefaultQueue)
	storeRaw(t, rdb, env, `{"id":"x","status_code":"oops"}`)
	awaitReply(t, ch, 5*time.Second).expectError(t, 502, "api_error", "MALFORMED_RESULT")
}

// At its deadline a waiting request ends with 504; GET then reports the expiry too.
func TestWaitDeadline(t *testing.T) {
	srv := startRedis(t)
	c := startCoord(t, baseParams(srv), fastHooks)
	start := time.Now()
	ch := c.waitAsync(hdr("X-AP-Mode", "wait", "X-Request-Timeout-Seconds", "1", "x-request-id", "late"))
	r := awaitReply(t, ch, 10*time.Second)
	r.expectError(t, http.StatusGatewayTimeout, "timeout_error", "DEADLINE_EXCEEDED")
	if d := time.Since(start); d < time.Second || d > 5*time.Second {
		t.Fatalf("504 after %s, want at the 1s deadline", d)
	}
	c.must(http.MethodGet, "/v1/requests/late", "", nil).expectError(t, http.StatusGatewayTimeout, "timeout_error", "DEADLINE_EXCEEDED")
}

// wait_cap_seconds ends the hold with 202; the result is fetched later.
func TestWaitCapThenGet(t *testing.T) {
	srv := startRedis(t)
	rdb := redisClient(t, srv)
	params := baseParams(srv)
	params["wait_cap_seconds"] = 1
	c := startCoord(t, params, fastHooks)
	start := time.Now()
	r := awaitReply(t, c.waitAsync(hdr("X-AP-Mode", "wait", "x-request-id", "capped")), 10*time.Second)
	if r.status != http.StatusAccepted || r.json(t)["id"] != "capped" || r.json(t)["status"] != "pending" {
		t.Fatalf("capped wait = %d %s", r.status, r.body)
	}
	if d := time.Since(start); d < time.Second || d > 5*time.Second {
		t.Fatalf("202 after %s, want at the 1s cap", d)
	}
	env, _ := popEnvelope(t, rdb, broker.DefaultQueue)
	storeResult(t, rdb, env, Result{ID: env.Data.ID, StatusCode: 200, Payload: completion})
	if g := c.must(http.MethodGet, "/v1/requests/capped", "", nil); g.status != 200 || string(g.body) != completion {
		t.Fatalf("GET after the cap = %d %s", g.status, g.body)
	}
}

// A wait-mode client that goes away cancels its request.
func TestWaitClientGoneCancels(t *testing.T) {
	srv := startRedis(t)
	rdb := redisClient(t, srv)
	events := watchWaiters(t)
	c := startCoord(t, baseParams(srv), fastHooks)
	ctx, cancel := context.WithCancel(context.Background())
	ch := async(func() (reply, error) {
		return c.do(ctx, http.MethodPost, "/v1/chat/completions", chatBody, hdr("X-AP-Mode", "wait", "x-request-id", "gone"))
	})
	bg := context.Background()
	const mailbox = "results:req:default:gone"
	awaitWaitEvent(t, events, parked, mailbox, true)
	tok := rdb.Get(bg, "request-active:default:gone").Val()
	if tok == "" {
		t.Fatal("a parked waiter's request has no live marker")
	}
	cancel()
	<-ch
	awaitWaitEvent(t, events, left, mailbox, true)
	if rdb.Get(bg, "request-cancel:default:gone").Val() != tok || rdb.Exists(bg, "request-active:default:gone").Val() != 0 {
		t.Fatal("the waiter whose client went away did not cancel its request")
	}
	c.must(http.MethodGet, "/v1/requests/gone", "", nil).expectError(t, 499, "cancelled", "CANCELLED")
}

// A second waiter on the same id shares the first copy and does not cancel it when it leaves.
func TestWaitReattach(t *testing.T) {
	srv := startRedis(t)
	rdb := redisClient(t, srv)
	events := watchWaiters(t)
	c := startCoord(t, baseParams(srv), fastHooks)
	bg := context.Background()
	const mailbox = "results:req:default:shared"
	first := c.waitAsync(hdr("X-AP-Mode", "wait", "x-request-id", "shared"))
	awaitWaitEvent(t, events, parked, mailbox, true)
	ctx, cancel := context.WithCancel(bg)
	second := async(func() (reply, error) {
		return c.do(ctx, http.MethodPost, "/v1/chat/completions", chatBody, hdr("X-AP-Mode", "wait", "x-request-id", "shared"))
	})
	// The second waiter attached to the first copy (not ours) and parked; then its client leaves.
	awaitWaitEvent(t, events, parked, mailbox, false)
	cancel()
	<-second
	awaitWaitEvent(t, events, left, mailbox, false)
	if rdb.Exists(bg, "request-active:default:shared").Val() != 1 || rdb.Exists(bg, "request-cancel:default:shared").Val() != 0 ||
		rdb.ZCard(bg, broker.DefaultQueue).Val() != 1 {
		t.Fatal("the reattached waiter cancelled or re-queued the shared request")
	}
	env, _ := popEnvelope(t, rdb, broker.DefaultQueue)
	storeResult(t, rdb, env, Result{ID: env.Data.ID, StatusCode: 200, Payload: completion})
	if r := awaitReply(t, first, 5*time.Second); r.status != 200 {
		t.Fatalf("first waiter = %d %s", r.status, r.body)
	}
}

// Redis restarts without persistence while a request waits: the waiter queues it again and still
// gets its result.
func TestWaitSurvivesRedisRestart(t *testing.T) {
	srv := startRedis(t)
	rdb := redisClient(t, srv)
	c := startCoord(t, baseParams(srv), fastHooks)
	ch := c.waitAsync(hdr("X-AP-Mode", "wait", "X-Request-Timeout-Seconds", "30", "x-request-id", "survivor"))
	bg := context.Background()
	eventually(t, 5*time.Second, "the request to be queued", func() bool { return rdb.ZCard(bg, broker.DefaultQueue).Val() == 1 })
	srv.Restart() // every key is gone
	env, _ := popEnvelope(t, rdb, broker.DefaultQueue)
	if env.Data.ID != "default:survivor" {
		t.Fatalf("re-queued envelope id = %s", env.Data.ID)
	}
	storeResult(t, rdb, env, Result{ID: env.Data.ID, StatusCode: 200, Payload: completion})
	if r := awaitReply(t, ch, 10*time.Second); r.status != 200 || string(r.body) != completion {
		t.Fatalf("wait across a Redis restart = %d %s", r.status, r.body)
	}
}

// Redis goes away for good while a request waits: the client gets a clean 504 at the deadline.
func TestWaitRedisGoneUntilDeadline(t *testing.T) {
	srv := startRedis(t)
	rdb := redisClient(t, srv)
	params := baseParams(srv)
	params["redis_timeout"] = "200ms"
	c := startCoord(t, params, fastHooks)
	start := time.Now()
	ch := c.waitAsync(hdr("X-AP-Mode", "wait", "X-Request-Timeout-Seconds", "2"))
	bg := context.Background()
	eventually(t, 5*time.Second, "the request to be queued", func() bool { return rdb.ZCard(bg, broker.DefaultQueue).Val() == 1 })
	srv.Stop()
	awaitReply(t, ch, 10*time.Second).expectError(t, http.StatusGatewayTimeout, "timeout_error", "DEADLINE_EXCEEDED")
	if d := time.Since(start); d > 7*time.Second {
		t.Fatalf("504 after %s, want at the 2s deadline", d)
	}
}

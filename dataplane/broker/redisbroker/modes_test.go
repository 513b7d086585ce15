package redisbroker

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/dataplane/broker"
	"github.com/epd-dev/coordinator/test/harness/refused"
)

func TestNoModeHeaderIsUntouched(t *testing.T) {
	// Redis is down: a request without the mode header must not need it.
	c := startCoord(t, quotaParams("redis://"+refused.Addr(t)), fastHooks)
	r := c.chat(hdr("X-Team", "teamA", "X-Gateway-Inference-Objective", "client-choice", "X-Gateway-Inference-Fairness-Id", "client-fid"))
	got := sinkHeaders(t, r)
	// The step stamps nothing; the client's own routing headers were dropped by the server
	// (server.trusted_routing_headers is false).
	if got["x-team"] != "teamA" || got["x-gateway-inference-objective"] != "" || got["x-gateway-inference-fairness-id"] != "" {
		t.Fatalf("headers of a request without the mode header: %v", got)
	}
}

func TestPassthroughStampsHeaders(t *testing.T) {
	srv := startRedis(t)
	c := startCoord(t, quotaParams(srv.URL()), fastHooks)
	r := c.chat(hdr("X-AP-Mode", "PassThrough", "X-Team", "teamB",
		"X-Gateway-Inference-Objective", "client-choice", "X-Gateway-Inference-Fairness-Id", "client-fid"))
	got := sinkHeaders(t, r)
	if got["x-gateway-inference-objective"] != "gold-reserved" {
		t.Errorf("objective = %q, want gold-reserved (the client's own value must be replaced)", got["x-gateway-inference-objective"])
	}
	if got["x-gateway-inference-fairness-id"] != "teamB" {
		t.Errorf("fairness id = %q, want the tenant", got["x-gateway-inference-fairness-id"])
	}
	if _, ok := got["x-ap-mode"]; ok {
		t.Error("the mode header was forwarded to the workers")
	}
	// The default tenant.
	r = c.chat(hdr("X-AP-Mode", "passthrough"))
	if got := sinkHeaders(t, r)["x-gateway-inference-fairness-id"]; got != broker.DefaultTenant {
		t.Errorf("fairness id without a tenant header = %q, want %q", got, broker.DefaultTenant)
	}
}

func TestInvalidRequests(t *testing.T) {
	// Redis is down: every rejection below happens before Redis is asked.
	c := startCoord(t, map[string]any{"redis_url": "redis://" + refused.Addr(t)}, fastHooks)
	const chatStream = `{"model":"m1","messages":[],"stream":true}`
	for _, tc := range []struct {
		name, body string
		hdr        map[string]string
		msg, param string
	}{
		{"unknown mode", chatBody, hdr("X-AP-Mode", "later"), "unknown X-AP-Mode", ""},
		{"stream enqueue", chatStream, hdr("X-AP-Mode", "enqueue"), "stream is only supported in passthrough mode", "stream"},
		{"stream wait", chatStream, hdr("X-AP-Mode", "wait"), "stream is only supported in passthrough mode", "stream"},
		{"tenant with colon", chatBody, hdr("X-AP-Mode", "enqueue", "X-Team", "a:b"), "must not contain ':'", ""},
		{"tenant with colon passthrough", chatBody, hdr("X-AP-Mode", "passthrough", "X-Team", "a:b"), "must not contain ':'", ""},
		{"missing model", `{"messages":[]}`, hdr("X-AP-Mode", "enqueue"), "model is required", "model"},
		{"bad timeout", chatBody, hdr("X-AP-Mode", "wait", "X-Request-Timeout-Seconds", "soon"), "positive whole number", ""},
		{"zero timeout", chatBody, hdr("X-AP-Mode", "enqueue", "X-Request-Timeout-Seconds", "0"), "positive whole number", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := c.must(http.MethodPost, "/v1/chat/completions", tc.body, tc.hdr)
			r.expectError(t, 400, "invalid_request_error", "INVALID_REQUEST")
			e := r.apiError(t)
			if msg, _ := e["message"].(string); !strings.Contains(msg, tc.msg) {
				t.Fatalf("message %q does not mention %q", msg, tc.msg)
			}
			if tc.param != "" && e["param"] != tc.param {
				t.Fatalf("param = %v, want %s", e["param"], tc.param)
			}
		})
	}
}

func TestEnqueueStoresEnvelopeAndServesResult(t *testing.T) {
	srv := startRedis(t)
	rdb := redisClient(t, srv)
	params := baseParams(srv)
	params["routes"] = []any{map[string]any{"model": "m1", "tenant": "teamA", "queue": "q-teamA"}}
	params["fetch_grace_seconds"] = 5
	c := startCoord(t, params, fastHooks)

	before := time.Now()
	r := c.chat(hdr("X-AP-Mode", "enqueue", "X-Team", "teamA", "x-request-id", "req-123",
		"X-Request-Timeout-Seconds", "120", "x-slo-ttft-ms", "500", "Authorization", "Bearer secret",
		"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"))
	if r.status != http.StatusAccepted {
		t.Fatalf("enqueue = %d: %s", r.status, r.body)
	}
	if m := r.json(t); m["id"] != "req-123" || m["status"] != "pending" {
		t.Fatalf("enqueue body = %s", r.body)
	}
	if r.header.Get("x-request-id") != "req-123" || r.header.Get("Location") != "/v1/requests/req-123" {
		t.Fatalf("enqueue headers: x-request-id %q, Location %q", r.header.Get("x-request-id"), r.header.Get("Location"))
	}

	ctx := context.Background()
	zs := rdb.ZRangeWithScores(ctx, "q-teamA", 0, -1).Val()
	if len(zs) != 1 {
		t.Fatalf("queue holds %d members, want 1", len(zs))
	}
	var env Envelope
	if err := json.Unmarshal([]byte(zs[0].Member.(string)), &env); err != nil {
		t.Fatal(err)
	}
	d := env.Data
	if env.RequestKind != "plain" || d.ID != "teamA:req-123" || d.Endpoint != "/v1/chat/completions" {
		t.Errorf("envelope kind/id/endpoint = %s/%s/%s", env.RequestKind, d.ID, d.Endpoint)
	}
	if env.Internal.RequestQueueName != "q-teamA" || env.Internal.ResultQueueName != "results:req:teamA:req-123" || len(env.Internal.RequestToken) != 32 {
		t.Errorf("envelope routing = %+v", env.Internal)
	}
	if string(d.Payload) != chatBody {
		t.Errorf("payload = %s, want the client body verbatim", d.Payload)
	}
	if d.Metadata["userid"] != "teamA" || !strings.HasPrefix(d.Metadata["traceparent"], "00-0af7") {
		t.Errorf("metadata = %v", d.Metadata)
	}
	if len(d.Headers) != 1 || d.Headers["x-slo-ttft-ms"] != "500" {
		t.Errorf("headers = %v, want only the forward_headers subset", d.Headers)
	}
	if want := before.Add(120 * time.Second).Unix(); d.Deadline < want || d.Deadline > want+2 || int64(zs[0].Score) != d.Deadline {
		t.Errorf("deadline = %d (score %v), want about %d", d.Deadline, zs[0].Score, want)
	}
	if d.Created < before.Unix() || d.Created > time.Now().Unix() {
		t.Errorf("created = %d", d.Created)
	}
	if tok := rdb.Get(ctx, "request-active:teamA:req-123").Val(); tok != env.Internal.RequestToken {
		t.Errorf("active marker = %q, want the envelope token", tok)
	}

	// Pending until a result is stored; tenant-scoped.
	get := func(tenant string) reply {
		return c.must(http.MethodGet, "/v1/requests/req-123", "", hdr("X-Team", tenant))
	}
	if g := get("teamA"); g.status != http.StatusAccepted || g.json(t)["status"] != "pending" {
		t.Fatalf("GET while queued = %d: %s", g.status, g.body)
	}
	get("teamB").expectError(t, http.StatusGone, "invalid_request_error", "UNKNOWN_REQUEST")

	completion := `{"id":"chatcmpl-1","object":"chat.completion","choices":[]}`
	storeResult(t, rdb, env, Result{ID: d.ID, StatusCode: 200, Payload: completion})
	g := get("teamA")
	if g.status != 200 || string(g.body) != completion || g.header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET after the result = %d %q (%s)", g.status, g.body, g.header.Get("Content-Type"))
	}
	if ttl := rdb.PTTL(ctx, env.Internal.ResultQueueName).Val(); ttl <= 0 || ttl > 5*time.Second {
		t.Fatalf("mailbox TTL after a fetch = %s, want at most fetch_grace_seconds", ttl)
	}
	if g2 := get("teamA"); g2.status != 200 {
		t.Fatalf("second GET within the grace = %d", g2.status)
	}
}

func TestEnqueueIsIdempotentPerRequestID(t *testing.T) {
	srv := startRedis(t)
	rdb := redisClient(t, srv)
	c := startCoord(t, baseParams(srv), fastHooks)
	ctx := context.Background()
	post := func() reply {
		return c.chat(hdr("X-AP-Mode", "enqueue", "x-request-id", "same-id"))
	}
	for i := 0; i < 3; i++ {
		if r := post(); r.status != 202 || r.json(t)["status"] != "pending" {
			t.Fatalf("enqueue #%d = %d: %s", i, r.status, r.body)
		}
	}
	if n := rdb.ZCard(ctx, broker.DefaultQueue).Val(); n != 1 {
		t.Fatalf("three enqueues of one id queued %d copies", n)
	}
	env, _ := popEnvelope(t, rdb, broker.DefaultQueue)
	storeResult(t, rdb, env, Result{ID: env.Data.ID, StatusCode: 200, Payload: `{"done":1}`})
	if r := post(); r.status != 202 || r.json(t)["status"] != "completed" {
		t.Fatalf("enqueue of a completed id = %d: %s", r.status, r.body)
	}
	if n := rdb.ZCard(ctx, broker.DefaultQueue).Val(); n != 0 {
		t.Fatal("a completed request was queued again")
	}
	// A failed result (5xx) does not stick: the request runs again.
	rdb.Del(ctx, env.Internal.ResultQueueName)
	storeResult(t, rdb, env, Result{ID: env.Data.ID, StatusCode: 503, Payload: `busy`})
	if r := post(); r.status != 202 || r.json(t)["status"] != "pending" {
		t.Fatalf("enqueue after a 503 result = %d: %s", r.status, r.body)
	}
	if n := rdb.ZCard(ctx, broker.DefaultQueue).Val(); n != 1 {
		t.Fatal("a request whose result was a 503 was not queued again")
	}
	if n := rdb.Exists(ctx, env.Internal.ResultQueueName).Val(); n != 0 {
		t.Fatal("the stale 503 result was kept")
	}
}

func TestRedisDown(t *testing.T) {
	params := quotaParams("redis://" + refused.Addr(t))
	params["redis_timeout"] = "500ms"
	c := startCoord(t, params, fastHooks)
	for _, mode := range []string{"enqueue", "wait"} {
		start := time.Now()
		r := c.chat(hdr("X-AP-Mode", mode, "X-Team", "teamA"))
		r.expectError(t, http.StatusServiceUnavailable, "service_unavailable_error", "ENQUEUE_FAILED")
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("%s with Redis down took %s", mode, d)
		}
	}
	if r := c.chat(hdr("X-AP-Mode", "passthrough", "X-Team", "teamA")); r.status != 200 {
		t.Fatalf("passthrough with Redis down = %d: %s", r.status, r.body)
	}
	if r := c.chat(nil); r.status != 200 {
		t.Fatalf("a request without the mode header with Redis down = %d", r.status)
	}
	c.must(http.MethodGet, "/v1/requests/abc", "", nil).expectError(t, 500, "api_error", "LOOKUP_FAILED")
	c.must(http.MethodDelete, "/v1/requests/abc", "", nil).expectError(t, 500, "api_error", "DELETE_FAILED")
}

// A Redis that accepts connections but never answers: enqueue must give up at redis_timeout.
func TestRedisSlow(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // never read, never answer
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		for _, c := range conns {
			_ = c.Close()
		}
	})
	params := quotaParams("redis://" + l.Addr().String())
	params["redis_timeout"] = "300ms"
	params["quota"].(map[string]any)["timeout"] = "100ms"
	c := startCoord(t, params, fastHooks)
	start := time.Now()
	c.chat(hdr("X-AP-Mode", "enqueue")).expectError(t, http.StatusServiceUnavailable, "service_unavailable_error", "ENQUEUE_FAILED")
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("enqueue against a hung Redis took %s", d)
	}
	start = time.Now()
	if r := c.chat(hdr("X-AP-Mode", "passthrough", "X-Team", "teamZero")); r.status != 200 {
		t.Fatalf("passthrough against a hung Redis = %d", r.status)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("passthrough against a hung Redis took %s", d)
	}
}

func TestRoutesValidationAndDelete(t *testing.T) {
	srv := startRedis(t)
	rdb := redisClient(t, srv)
	c := startCoord(t, baseParams(srv), fastHooks)
	ctx := context.Background()

	c.must(http.MethodGet, "/v1/requests/no_such!", "", nil).expectError(t, 400, "invalid_request_error", "INVALID_REQUEST")
	c.must(http.MethodGet, "/v1/requests/abc", "", hdr("X-Team", "a:b")).expectError(t, 400, "invalid_request_error", "INVALID_REQUEST")
	c.must(http.MethodGet, "/v1/requests/never-seen", "", nil).expectError(t, 410, "invalid_request_error", "UNKNOWN_REQUEST")
	if r := c.must(http.MethodDelete, "/v1/requests/never-seen", "", nil); r.status != 204 {
		t.Fatalf("DELETE of an unknown request = %d", r.status)
	}

	// DELETE while queued: the request is cancelled.
	if r := c.chat(hdr("X-AP-Mode", "enqueue", "x-request-id", "to-cancel")); r.status != 202 {
		t.Fatal(r.status)
	}
	tok := rdb.Get(ctx, "request-active:default:to-cancel").Val()
	if r := c.must(http.MethodDelete, "/v1/requests/to-cancel", "", nil); r.status != 204 {
		t.Fatalf("DELETE = %d: %s", r.status, r.body)
	}
	if rdb.Exists(ctx, "request-active:default:to-cancel").Val() != 0 || rdb.Get(ctx, "request-cancel:default:to-cancel").Val() != tok {
		t.Fatal("DELETE did not move the live token to the cancel marker")
	}
	c.must(http.MethodGet, "/v1/requests/to-cancel", "", nil).expectError(t, 499, "cancelled", "CANCELLED")
	if r := c.must(http.MethodDelete, "/v1/requests/to-cancel", "", nil); r.status != 204 {
		t.Fatalf("second DELETE = %d", r.status)
	}
	// Enqueueing the id again revives it as a new copy.
	if r := c.chat(hdr("X-AP-Mode", "enqueue", "x-request-id", "to-cancel")); r.status != 202 || r.json(t)["status"] != "pending" {
		t.Fatalf("re-enqueue after cancel = %d: %s", r.status, r.body)
	}
	if rdb.Exists(ctx, "request-cancel:default:to-cancel").Val() != 0 {
		t.Fatal("re-enqueue kept the cancel marker")
	}
	if r := c.must(http.MethodGet, "/v1/requests/to-cancel", "", nil); r.status != 202 {
		t.Fatalf("GET after re-enqueue = %d", r.status)
	}

	// DELETE of a completed request forgets it.
	if r := c.chat(hdr("X-AP-Mode", "enqueue", "x-request-id", "done-one")); r.status != 202 {
		t.Fatal(r.status)
	}
	var env Envelope
	for {
		e, _ := popEnvelope(t, rdb, broker.DefaultQueue)
		if e.Data.ID == "default:done-one" {
			env = e
			break
		}
	}
	storeResult(t, rdb, env, Result{ID: env.Data.ID, StatusCode: 200, Payload: `{}`})
	if r := c.must(http.MethodDelete, "/v1/requests/done-one", "", nil); r.status != 204 {
		t.Fatal(r.status)
	}
	c.must(http.MethodGet, "/v1/requests/done-one", "", nil).expectError(t, 410, "invalid_request_error", "UNKNOWN_REQUEST")
}

func TestServeModels(t *testing.T) {
	params := map[string]any{"redis_url": "redis://" + refused.Addr(t), "serve_models": true,
		"routes": []any{map[string]any{"model": "m1"}, map[string]any{"model": "m2", "tenant": "a"}, map[string]any{"model": "m1", "tenant": "b"}, map[string]any{"model": "*"}}}
	c := startCoord(t, params, fastHooks)
	r := c.must(http.MethodGet, "/v1/models", "", nil)
	if r.status != 200 || strings.TrimSpace(string(r.body)) != `{"object":"list","data":[{"id":"m1","object":"model","owned_by":"llm-d-async"},{"id":"m2","object":"model","owned_by":"llm-d-async"}]}` {
		t.Fatalf("GET /v1/models = %d %s", r.status, r.body)
	}
}

// A client's routing header never rides in an envelope, even when forward_headers names it
// (unless server.trusted_routing_headers keeps it in the request's forwarded headers).
func TestEnqueueDropsClientRoutingHeaders(t *testing.T) {
	srv := startRedis(t)
	rdb := redisClient(t, srv)
	params := baseParams(srv)
	params["routes"] = []any{map[string]any{"model": "m1", "tenant": "teamA", "queue": "q-teamA"}}
	params["forward_headers"] = []any{"x-slo-ttft-ms", "x-gateway-destination-endpoint"}
	c := startCoord(t, params, fastHooks)
	r := c.chat(hdr("X-AP-Mode", "enqueue", "X-Team", "teamA", "x-slo-ttft-ms", "500",
		"X-Gateway-Destination-Endpoint", "10.0.0.9:8000"))
	if r.status != http.StatusAccepted {
		t.Fatalf("enqueue = %d: %s", r.status, r.body)
	}
	zs := rdb.ZRange(context.Background(), "q-teamA", 0, -1).Val()
	if len(zs) != 1 {
		t.Fatalf("queue holds %d members, want 1", len(zs))
	}
	var env Envelope
	if err := json.Unmarshal([]byte(zs[0]), &env); err != nil {
		t.Fatal(err)
	}
	if len(env.Data.Headers) != 1 || env.Data.Headers["x-slo-ttft-ms"] != "500" {
		t.Fatalf("headers = %v, want x-slo-ttft-ms only", env.Data.Headers)
	}
}

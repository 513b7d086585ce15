package redisbroker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/epd-dev/coordinator/test/harness/refused"
)

// The acquire script must hand out exactly limit slots however many replicas race for them.
func TestQuotaScriptsAtomic(t *testing.T) {
	srv := startRedis(t)
	rdb := redisClient(t, srv)
	ctx := context.Background()
	const key, limit, racers = "quota:userid:teamA", 10, 64
	var reserved atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < racers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			// Each racer has its own connection, like separate coordinator replicas.
			c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
			defer c.Close()
			n, err := quotaAcquireScript.Run(ctx, c, []string{key}, limit, 300).Int()
			if err != nil {
				t.Error(err)
				return
			}
			reserved.Add(int32(n))
		}()
	}
	close(start)
	wg.Wait()
	if got := reserved.Load(); got != limit {
		t.Fatalf("%d racers got %d reserved slots, want %d", racers, got, limit)
	}
	if v, _ := rdb.Get(ctx, key).Int(); v != limit {
		t.Fatalf("counter = %d, want %d", v, limit)
	}
	if ttl := rdb.TTL(ctx, key).Val(); ttl <= 0 || ttl > 300*time.Second {
		t.Fatalf("counter TTL = %s, want the window", ttl)
	}
	for i := 0; i < limit; i++ {
		if err := quotaReleaseScript.Run(ctx, rdb, []string{key}, 300).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if n := rdb.Exists(ctx, key).Val(); n != 0 {
		t.Fatal("a counter back at zero must be deleted")
	}
	// A release after the counter expired must not leave it negative.
	if v, err := quotaReleaseScript.Run(ctx, rdb, []string{key}, 300).Int(); err != nil || v != 0 {
		t.Fatalf("release of a missing counter = %d, %v", v, err)
	}
	if n := rdb.Exists(ctx, key).Val(); n != 0 {
		t.Fatal("release of a missing counter created it")
	}
	// Limit 0: always overflow.
	if n, _ := quotaAcquireScript.Run(ctx, rdb, []string{"quota:userid:zero"}, 0, 300).Int(); n != 0 {
		t.Fatal("limit 0 reserved a slot")
	}
}

// quotaParams are params with two tiers and teamA limited to one reserved request.
func quotaParams(url string) map[string]any {
	return map[string]any{
		"redis_url": url,
		"objectives": map[string]any{
			"gold":    map[string]any{"reserved": "gold-reserved", "overflow": "gold-overflow"},
			"default": map[string]any{"reserved": "std-reserved", "overflow": "std-overflow"},
		},
		"routes": []any{map[string]any{"model": "m1", "tier": "gold"}},
		// A generous quota timeout: these tests check reservations, not fail-open on a slow Redis
		// (which a loaded test machine would otherwise trigger).
		"quota": map[string]any{"limits": map[string]any{"teamA": 1, "teamZero": 0}, "timeout": "5s"},
	}
}

func TestPassthroughReservedThenOverflow(t *testing.T) {
	srv := startRedis(t)
	rdb := redisClient(t, srv)
	c := startCoord(t, quotaParams(srv.URL()), fastHooks)

	// The first teamA request holds the only reserved slot while it runs. The gate's name is
	// unique per run (go test -count=N reuses test names).
	gate := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
	first := async(func() (reply, error) {
		return c.do(context.Background(), "POST", "/v1/chat/completions", chatBody,
			hdr("X-AP-Mode", "passthrough", "X-Team", "teamA", "X-Test-Hold", gate))
	})
	eventually(t, 5*time.Second, "the first request to take the slot", func() bool {
		return rdb.Get(context.Background(), "quota:userid:teamA").Val() == "1"
	})
	second := c.chat(hdr("X-AP-Mode", "passthrough", "X-Team", "teamA"))
	if got := sinkHeaders(t, second)["x-gateway-inference-objective"]; got != "gold-overflow" {
		t.Fatalf("second request objective = %q, want gold-overflow", got)
	}
	// Other tenants have no limit: reserved.
	other := c.chat(hdr("X-AP-Mode", "passthrough", "X-Team", "teamB"))
	if got := sinkHeaders(t, other)["x-gateway-inference-objective"]; got != "gold-reserved" {
		t.Fatalf("unlimited tenant objective = %q, want gold-reserved", got)
	}
	close(holdGate(gate))
	r := awaitReply(t, first, 5*time.Second)
	if got := sinkHeaders(t, r)["x-gateway-inference-objective"]; got != "gold-reserved" {
		t.Fatalf("first request objective = %q, want gold-reserved", got)
	}
	// The slot is given back when the request ends.
	eventually(t, 5*time.Second, "the slot to be released", func() bool {
		return rdb.Exists(context.Background(), "quota:userid:teamA").Val() == 0
	})
	third := c.chat(hdr("X-AP-Mode", "passthrough", "X-Team", "teamA"))
	if got := sinkHeaders(t, third)["x-gateway-inference-objective"]; got != "gold-reserved" {
		t.Fatalf("third request objective = %q, want gold-reserved", got)
	}
	// The default tier applies to a model no route names.
	other2 := c.must("POST", "/v1/chat/completions", `{"model":"m2","messages":[]}`, hdr("X-AP-Mode", "passthrough", "X-Team", "teamZero"))
	if got := sinkHeaders(t, other2)["x-gateway-inference-objective"]; got != "std-overflow" {
		t.Fatalf("limit-0 tenant on the default tier = %q, want std-overflow", got)
	}
}

func TestPassthroughQuotaFailsOpen(t *testing.T) {
	params := quotaParams("redis://" + refused.Addr(t))
	c := startCoord(t, params, fastHooks)
	start := time.Now()
	for i := 0; i < 3; i++ {
		// teamZero would be overflow; with Redis down the quota fails open.
		r := c.chat(hdr("X-AP-Mode", "passthrough", "X-Team", "teamZero"))
		if r.status != 200 {
			t.Fatalf("passthrough with Redis down = %d: %s", r.status, r.body)
		}
		if got := sinkHeaders(t, r)["x-gateway-inference-objective"]; got != "gold-reserved" {
			t.Fatalf("objective with Redis down = %q, want gold-reserved (fail open)", got)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("three passthrough requests with Redis down took %s", d)
	}
}

// sinkHeaders returns the headers test-sink saw forwarded.
func sinkHeaders(t *testing.T, r reply) map[string]string {
	t.Helper()
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	m := r.json(t)
	f, _ := m["forwarded"].(map[string]any)
	out := map[string]string{}
	for k, v := range f {
		out[k], _ = v.(string)
	}
	return out
}

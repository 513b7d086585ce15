package server_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/ratelimit"
	"github.com/epd-dev/coordinator/dataplane/server"
	"github.com/epd-dev/coordinator/test/doubles/asyncworker/redistest"
)

// BenchmarkRateLimit is one small decode-only chat (its answer carries usage) without a rate
// limit, then with the tenant's limits checked in a real Redis on loopback (one script before
// the request, one settling the tokens after it), then in the local fallback (Redis refused):
// what the limit check adds to the request path. Compare with
// benchstat -col /limit.
func BenchmarkRateLimit(b *testing.B) {
	worker := httptest.NewServer(http.HandlerFunc(streamingWorker))
	defer worker.Close()
	rs := redistest.Start(b, redistest.Options{})
	raw := benchBodies()["200B"]
	limits := func(url string) *config.RateLimit {
		return &config.RateLimit{RedisURL: url, TenantHeader: "X-Tenant", RedisTimeout: config.Duration(time.Second),
			KeyPrefix: config.DefaultRateLimitKeyPrefix, OnRedisFailure: config.RedisFailureLocal,
			// Never refused: the check and the settling are measured, not 429s.
			Tenants: []config.Tenant{{Name: "team", RequestsPerSecond: 1e6, TokensPerMinute: 1 << 30}}}
	}
	for _, mode := range []struct {
		name string
		rl   *config.RateLimit
	}{{"off", nil}, {"redis", limits(rs.URL())}, {"local", limits("redis://127.0.0.1:1/0")}} {
		b.Run("limit="+mode.name, func(b *testing.B) {
			cfg := config.Default()
			cfg.Gateway.Address = worker.URL
			cfg.Pipeline.Steps = []config.Step{{Type: "decode"}}
			cfg.RateLimit = mode.rl
			p, err := builder.Build(cfg, builder.Options{})
			if err != nil {
				b.Fatal(err)
			}
			holder := &pipeline.Holder{}
			holder.Swap(p)
			lim := ratelimit.New(logr.Discard(), nil)
			defer lim.Close()
			h := server.New(server.Options{Server: cfg.Server, Pipelines: holder, Log: logr.Discard(), RateLimiter: lim}).Handler()
			rd := bytes.NewReader(raw)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				rd.Reset(raw)
				req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", rd)
				req.ContentLength = int64(len(raw))
				req.Header.Set("X-Tenant", "team")
				rec := &discardWriter{h: http.Header{}}
				h.ServeHTTP(rec, req)
				if rec.status != http.StatusOK || (mode.rl != nil && rec.h.Get(ratelimit.HeaderLimitTokens) == "") {
					b.Fatalf("status %d, headers %v", rec.status, rec.h)
				}
			}
		})
	}
}

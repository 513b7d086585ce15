package ratelimit

import (
	"context"
	"testing"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/test/doubles/asyncworker/redistest"
)

// BenchmarkCheck is one limit check and its settling, in a real Redis on loopback (two script
// round trips) and in the local fallback (Redis refused).
func BenchmarkCheck(b *testing.B) {
	rs := redistest.Start(b, redistest.Options{})
	for _, store := range []struct{ name, url string }{{"redis", rs.URL()}, {"local", "redis://127.0.0.1:1/0"}} {
		b.Run("store="+store.name, func(b *testing.B) {
			cfg := block(store.url, config.RedisFailureLocal)
			cfg.Tenants[0].TokensPerMinute = 1 << 30
			l := New(logr.Discard(), nil)
			defer l.Close()
			ctx := context.Background()
			b.ReportAllocs()
			for range b.N {
				d := l.Check(ctx, cfg, "tokens", 100)
				if !d.Allowed {
					b.Fatalf("%+v", d)
				}
				l.Settle(ctx, d, 120)
			}
		})
	}
}

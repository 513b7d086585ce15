package redisbroker

import (
	"context"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/broker"
)

// Classify takes one of the tenant's reserved slots, held until ctx ends (the request context
// ends when the whole response was written or the client left), or reports overflow when they
// are all taken. Tenants without a limit are reserved. Any Redis failure fails open (reserved)
// and skips Redis for quotaOpenFor.
func (b *Broker) Classify(ctx context.Context, log logr.Logger, tenant string) string {
	limit, ok := b.cfg.Quota.Limit(tenant)
	if !ok {
		return broker.ClassReserved
	}
	if b.now().UnixNano() < b.quotaOpenUntil.Load() {
		return broker.ClassReserved
	}
	client, release, err := b.hold()
	if err != nil {
		return broker.ClassReserved
	}
	key := b.cfg.Quota.Key(tenant)
	window := int64(b.cfg.Quota.Window / time.Second)
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.Quota.Timeout)
	got, err := quotaAcquireScript.Run(qctx, client, []string{key}, limit, window).Int()
	cancel()
	if err != nil {
		release()
		b.quotaOpenUntil.Store(b.now().Add(quotaOpenFor).UnixNano())
		log.Info("async-broker quota unavailable; failing open (reserved)", "tenant", tenant, "err", err.Error())
		return broker.ClassReserved
	}
	if got == 0 {
		release()
		return broker.ClassOverflow
	}
	context.AfterFunc(ctx, func() {
		defer release()
		rctx, cancel := context.WithTimeout(context.Background(), b.cfg.RedisTimeout)
		defer cancel()
		if err := quotaReleaseScript.Run(rctx, client, []string{key}, window).Err(); err != nil {
			b.log.Info("async-broker quota release failed; the slot frees when the window expires", "tenant", tenant, "err", err.Error())
		}
	})
	return broker.ClassReserved
}

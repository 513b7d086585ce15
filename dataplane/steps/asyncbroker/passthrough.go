package asyncbroker

import (
	"context"
	"net/http"
	"time"

	"github.com/epd-dev/coordinator/dataplane/request"
)

// Quota classes.
const (
	ClassReserved = "reserved"
	ClassOverflow = "overflow"
)

// passthrough labels the request for the scheduler and lets the pipeline continue: the client's
// own objective and fairness headers are dropped, the tier's objective for the tenant's quota
// class and the tenant as fairness id are stamped on the forwarded headers.
func (s *Step) passthrough(ctx context.Context, rc *request.Context, tenant string) error {
	r := s.cfg.route(rc.Model, tenant)
	class := s.classify(ctx, rc, tenant)
	if rc.Forwarded == nil {
		rc.Forwarded = http.Header{}
	}
	h := rc.Forwarded
	h.Del(s.cfg.modeHeader)
	h.Del(s.cfg.objectiveHeader)
	h.Del(s.cfg.fairnessHeader)
	if obj, ok := s.cfg.objectives[r.tier]; ok {
		name := obj.reserved
		if class == ClassOverflow {
			name = obj.overflow
		}
		if name != "" {
			h.Set(s.cfg.objectiveHeader, name)
		}
	}
	h.Set(s.cfg.fairnessHeader, tenant)
	verbose(rc.Log, "async-broker passthrough", "tenant", tenant, "tier", r.tier, "class", class)
	return nil
}

// classify takes one of the tenant's reserved slots, held until the request ends, or reports
// overflow when they are all taken. Tenants without a limit are reserved. Any Redis failure
// fails open (reserved) and skips Redis for quotaOpenFor.
func (s *Step) classify(ctx context.Context, rc *request.Context, tenant string) string {
	limit, ok := s.cfg.quota.limit(tenant)
	if !ok {
		return ClassReserved
	}
	if s.now().UnixNano() < s.quotaOpenUntil.Load() {
		return ClassReserved
	}
	client, release, err := s.hold()
	if err != nil {
		return ClassReserved
	}
	key := s.cfg.quota.key(tenant)
	window := int64(s.cfg.quota.window / time.Second)
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.quota.timeout)
	got, err := quotaAcquireScript.Run(qctx, client, []string{key}, limit, window).Int()
	cancel()
	if err != nil {
		release()
		s.quotaOpenUntil.Store(s.now().Add(quotaOpenFor).UnixNano())
		rc.Log.Info("async-broker quota unavailable; failing open (reserved)", "tenant", tenant, "err", err.Error())
		return ClassReserved
	}
	if got == 0 {
		release()
		return ClassOverflow
	}
	// The request context ends when the whole response was written (or the client left).
	context.AfterFunc(ctx, func() {
		defer release()
		rctx, cancel := context.WithTimeout(context.Background(), s.cfg.redisTimeout)
		defer cancel()
		if err := quotaReleaseScript.Run(rctx, client, []string{key}, window).Err(); err != nil {
			s.log.Info("async-broker quota release failed; the slot frees when the window expires", "tenant", tenant, "err", err.Error())
		}
	})
	return ClassReserved
}

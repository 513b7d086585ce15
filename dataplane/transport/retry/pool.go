package retry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// PoolPolicy is pipeline.on_pool_failure: what a request does when the pool of one of its
// disaggregated phases (encode, prefill) cannot serve it after its retries.
type PoolPolicy struct {
	// Aggregate serves it on decode alone (aggregate); otherwise it fails with a 503 (fail).
	Aggregate bool
	Metrics   *observe.Metrics
}

// Handle applies the policy to err, the final error of phase's legs. A failure that says the
// pool could not serve (Unserved) either degrades the request (nil: rc.Degraded is set and
// decode serves it alone, prefilling and encoding itself) or is a 503 naming the pool; anything
// else (a worker's rejection) is returned as is.
func (pp PoolPolicy) Handle(ctx context.Context, rc *request.Context, phase string, err error) error {
	if !Unserved(ctx, err) {
		return err
	}
	if pp.Aggregate {
		pp.Metrics.Degraded(phase, observe.DegradedAggregated)
		rc.Degraded = phase
		rc.Log.V(logging.Warn).Info("the pool cannot serve the request; serving it on decode alone (pipeline.on_pool_failure: aggregate)",
			"phase", phase, "err", err.Error())
		trace.SpanFromContext(ctx).AddEvent("degraded", trace.WithAttributes(observe.AttrPhase.String(phase)))
		return nil
	}
	pp.Metrics.Degraded(phase, observe.DegradedFailed)
	e := &apierror.Error{Status: http.StatusServiceUnavailable, Type: apierror.TypeUnavailable, Code: "pool_unavailable",
		Message: fmt.Sprintf("the %s pool cannot serve the request now; try again later", phase), Cause: err, RetryAfter: time.Second}
	var up *apierror.UpstreamError
	if errors.As(err, &up) && up.RetryAfter > 0 {
		e.RetryAfter = up.RetryAfter
	}
	return e
}

package gateway

import (
	"context"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/transport/retry"
)

// Do is the attempt loop every leg runs in. try sends attempt n (from 1) and returns its
// outcome: a result and nil, a final error, or an error marked retry.Again when the attempt
// served nothing. Such an attempt is tried again while r allows (retry.Retrier.Next: attempts,
// Retry-After, the request's allowance, the process's budget), after drop released its result
// (nil: nothing to release) and the wait passed. It returns the last attempt's result and error
// (the marked error's cause, nil for an answer that is the caller's to read, as a 503 from a
// pool that stays down), or ctx's error when ctx ended during a wait.
func Do[T any](ctx context.Context, r retry.Retrier, log logr.Logger, try func(attempt int) (T, error), drop func(T)) (T, error) {
	r.Budget.Attempted()
	for n := 1; ; n++ {
		v, err := try(n)
		again, retryable := err.(*retry.Retryable) //nolint:errorlint // try's own mark only: a final error may wrap one
		if !retryable {
			return v, err
		}
		wait, ok := r.Next(ctx, log, again, n)
		if !ok {
			return v, again.Err
		}
		if drop != nil {
			drop(v)
		}
		if !retry.Sleep(ctx, wait) {
			var zero T
			return zero, ctx.Err()
		}
	}
}

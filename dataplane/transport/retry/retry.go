// Package retry decides whether a failed worker leg is tried again and when: which failures say
// that nothing was served (Classify), the capped exponential backoff with full jitter between
// attempts (Policy), and the process-wide budget that keeps retries a bounded fraction of first
// attempts, so that a dead pool cannot cause a retry storm (Budget).
package retry

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
)

// Reasons a leg failed without being served; they label the retry metrics.
const (
	ReasonConnect = "connect"      // connection refused or unreachable
	ReasonReset   = "reset"        // connection reset or closed before the answer's headers
	ReasonTimeout = "timeout"      // no headers within gateway.timeout
	ReasonIdle    = "idle_timeout" // headers, then silence past gateway.idle_timeout
	Reason429     = "429"
	Reason502     = "502"
	Reason503     = "503"
	Reason504     = "504"
	// ReasonKVTransfer is a decode that refused the KV its prefill produced (the prefill worker
	// died or freed the blocks): retried without the transfer parameters.
	ReasonKVTransfer = "kv_transfer"
)

// Policy is the retry schedule of one leg.
type Policy struct {
	// MaxAttempts counts the first attempt; 1 never retries.
	MaxAttempts int
	// InitialBackoff and MaxBackoff bound the jittered exponential backoff.
	InitialBackoff, MaxBackoff time.Duration
	// MaxRetryAfter is the longest Retry-After waited for.
	MaxRetryAfter time.Duration
}

// Backoff is the wait before retry number n (1 for the first retry): a uniformly random share of
// min(MaxBackoff, InitialBackoff·2ⁿ⁻¹), or retryAfter when that is longer.
func (p Policy) Backoff(n int, retryAfter time.Duration) time.Duration {
	ceiling := p.InitialBackoff
	for i := 1; i < n && ceiling < p.MaxBackoff; i++ {
		ceiling *= 2 // at most ~63 doublings before passing MaxBackoff: no overflow
	}
	ceiling = min(ceiling, p.MaxBackoff)
	var d time.Duration
	if ceiling > 0 {
		d = rand.N(ceiling + 1) //nolint:gosec // jitter, not a secret
	}
	return max(d, retryAfter)
}

// Failure is why an attempt failed without being served.
type Failure struct {
	// Reason is one of the Reason constants.
	Reason string
	// RetryAfter is the answer's Retry-After (429 and 503), 0 when absent.
	RetryAfter time.Duration
}

// ClassifyStatus tells whether an answer's status says that nothing was served and another
// pick may serve it: 502, 503 and 504 from the gateway (no healthy upstream, a connection that
// failed, its route timeout) and 429 (load shed), with the answer's Retry-After. Anything else
// is final.
func ClassifyStatus(status int, retryAfter time.Duration) (Failure, bool) {
	switch status {
	case http.StatusTooManyRequests:
		return Failure{Reason: Reason429, RetryAfter: retryAfter}, true
	case http.StatusBadGateway:
		return Failure{Reason: Reason502}, true
	case http.StatusServiceUnavailable:
		return Failure{Reason: Reason503, RetryAfter: retryAfter}, true
	case http.StatusGatewayTimeout:
		return Failure{Reason: Reason504}, true
	}
	return Failure{}, false
}

// ClassifyError tells whether a failed attempt served nothing: a connection refused or reset
// before the answer's headers, no headers in time, or (for an answer read whole) a body that
// broke off or stalled past the idle timeout. A request its client cancelled is never retried,
// nor one past its overall deadline or with an answer over its size limit.
func ClassifyError(ctx context.Context, err error) (Failure, bool) {
	if ctx.Err() != nil {
		return Failure{}, false
	}
	return classifyError(err)
}

func classifyError(err error) (Failure, bool) {
	var ne net.Error
	switch {
	case errors.Is(err, upstream.ErrIdle):
		return Failure{Reason: ReasonIdle}, true
	case errors.Is(err, upstream.ErrDeadline), errors.Is(err, upstream.ErrResponseTooLarge):
		return Failure{}, false
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return Failure{Reason: ReasonConnect}, true
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return Failure{Reason: ReasonReset}, true
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return Failure{Reason: ReasonTimeout}, true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return Failure{Reason: ReasonConnect}, true
	}
	return Failure{}, false
}

// Budget bounds the retries of a process: each first attempt earns Ratio of a retry, each retry
// spends one, and MinPerSecond retries a second are allowed whatever the traffic (as Finagle's
// and Envoy's retry budgets). Earned retries are capped (burst), so that a quiet hour does not
// bank a storm. It is safe for concurrent use; a nil Budget allows every retry.
type Budget struct {
	mu           sync.Mutex
	ratio        float64
	minPerSecond float64
	tokens       float64
	last         time.Time
	now          func() time.Time
}

// budgetBurst is how many seconds of MinPerSecond, or retries earned, the budget can hold.
const budgetBurst = 10

// NewBudget returns a budget of ratio retries per first attempt plus minPerSecond retries a
// second.
func NewBudget(ratio, minPerSecond float64) *Budget {
	b := &Budget{now: time.Now}
	b.Configure(ratio, minPerSecond)
	b.tokens = b.burst()
	return b
}

// Configure changes the budget's rates (a reload); what was earned is kept.
func (b *Budget) Configure(ratio, minPerSecond float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ratio, b.minPerSecond = ratio, minPerSecond
	b.tokens = min(b.tokens, b.burst())
}

func (b *Budget) burst() float64 { return max(budgetBurst*b.minPerSecond, budgetBurst*b.ratio, 1) }

// refill adds the minimum rate's share since the last call; b.mu is held.
func (b *Budget) refill() {
	now := b.now()
	if !b.last.IsZero() {
		b.tokens = min(b.burst(), b.tokens+now.Sub(b.last).Seconds()*b.minPerSecond)
	}
	b.last = now
}

// Attempted records a first attempt.
func (b *Budget) Attempted() {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.refill()
	b.tokens = min(b.burst(), b.tokens+b.ratio)
	b.mu.Unlock()
}

// Take spends one retry, reporting false when the budget is exhausted.
func (b *Budget) Take() bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill()
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// Sleep waits d or until ctx ends, reporting whether ctx is still live.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ClassifyCall classifies the error of a call whose answer was read whole
// (upstream.Client.Call): a status by ClassifyStatus, anything else by ClassifyError.
func ClassifyCall(ctx context.Context, err error) (Failure, bool) {
	if err == nil {
		return Failure{}, false
	}
	var up *apierror.UpstreamError
	if errors.As(err, &up) && up.Status != 0 && up.Status != http.StatusOK {
		return ClassifyStatus(up.Status, up.RetryAfter)
	}
	return ClassifyError(ctx, err)
}

// requestKey carries a request's retry allowance (WithRequestLimit).
type requestKey struct{}

// WithRequestLimit returns ctx carrying an allowance of n retries for the request it serves:
// every retry Retrier.Next grants under it, and every TakeRequest, spends from it.
func WithRequestLimit(ctx context.Context, n int) context.Context {
	left := &atomic.Int32{}
	left.Store(int32(n)) //nolint:gosec // validated: 0..100
	return context.WithValue(ctx, requestKey{}, left)
}

// TakeRequest spends one retry of ctx's request, reporting false when none is left (a context
// without a limit always allows).
func TakeRequest(ctx context.Context) bool {
	left, ok := ctx.Value(requestKey{}).(*atomic.Int32)
	return !ok || left.Add(-1) >= 0
}

// Retryable is the outcome of an attempt that served nothing: another pick may serve it. The
// attempt loop (gateway.Do) retries it while Retrier.Next allows, and otherwise returns Err.
type Retryable struct {
	// Phase names the leg in the retry metrics, spans and logs.
	Phase string
	Failure
	// Err is the attempt's error; nil when the attempt's answer is its outcome (a 503 that is
	// the caller's to read when no retry is left).
	Err error
}

func (e *Retryable) Error() string {
	if e.Err != nil {
		return e.Err.Error()
	}
	return "the " + e.Phase + " attempt served nothing (" + e.Reason + ")"
}

func (e *Retryable) Unwrap() error { return e.Err }

// Again marks err, the outcome of an attempt of phase, as one that served nothing for f's reason.
func Again(phase string, f Failure, err error) error {
	return &Retryable{Phase: phase, Failure: f, Err: err}
}

// IfUnserved is err marked Again when ClassifyCall says that it served nothing (a status of
// an *apierror.UpstreamError, or a transport error), and err itself otherwise.
func IfUnserved(ctx context.Context, phase string, err error) error {
	if f, again := ClassifyCall(ctx, err); again {
		return Again(phase, f, err)
	}
	return err
}

// Retrier is the retry policy of a leg and the budgets it spends from.
type Retrier struct {
	Policy  Policy
	Budget  *Budget
	Metrics *observe.Metrics
}

// Next decides whether attempt n, which served nothing (a), is followed by another, and after
// what wait: not past Policy.MaxAttempts, nor for a Retry-After over Policy.MaxRetryAfter, nor
// once the request's allowance (WithRequestLimit) or the process's budget is spent. A retry is
// logged on log, counted and recorded as an event of ctx's span.
func (r Retrier) Next(ctx context.Context, log logr.Logger, a *Retryable, n int) (time.Duration, bool) {
	if n >= r.Policy.MaxAttempts || a.RetryAfter > r.Policy.MaxRetryAfter {
		return 0, false
	}
	if !TakeRequest(ctx) {
		log.V(logging.Warn).Info("the request's retries are used up; not retrying the leg", "phase", a.Phase, "attempt", n, "reason", a.Reason)
		return 0, false
	}
	if !r.Budget.Take() {
		r.Metrics.RetryBudgetExhausted(a.Phase)
		log.V(logging.Warn).Info("retry budget exhausted; not retrying the leg", "phase", a.Phase, "attempt", n, "reason", a.Reason)
		return 0, false
	}
	wait := r.Policy.Backoff(n, a.RetryAfter)
	r.Metrics.Retry(a.Phase, a.Reason)
	log.V(logging.Warn).Info("retrying the leg on another pick", "phase", a.Phase, "attempt", n+1, "reason", a.Reason, "backoff", wait.String())
	trace.SpanFromContext(ctx).AddEvent("retry", trace.WithAttributes(observe.AttrPhase.String(a.Phase),
		attribute.Int("attempt", n+1), attribute.String("reason", a.Reason), attribute.String("backoff", wait.String())))
	return wait, true
}

// Unserved reports whether err, the final error of a leg (an *apierror.UpstreamError), says
// that its pool could not serve the request, as opposed to a worker rejecting it: the failures
// ClassifyStatus and ClassifyError retry, and a leg past its overall deadline. A request its
// client cancelled is not.
func Unserved(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if errors.Is(err, upstream.ErrDeadline) {
		return true
	}
	_, ok := ClassifyCall(ctx, err)
	return ok
}

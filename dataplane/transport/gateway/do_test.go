package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/transport/retry"
)

const (
	metricRetries   = "coordinator_upstream_retries_total"
	metricExhausted = "coordinator_retry_budget_exhausted_total"
)

// counter is the value of the counter name{labels} gathered from reg, 0 when it has no such
// series.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; !ok || v != l.GetValue() {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// series is how many series of name reg holds.
func series(t *testing.T, reg *prometheus.Registry, name string) int {
	t.Helper()
	n, err := testutil.GatherAndCount(reg, name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// outcome is what one attempt's try returns.
type outcome struct {
	f     retry.Failure
	again bool
	err   error
}

var (
	fail503   = outcome{f: retry.Failure{Reason: retry.Reason503}, again: true}
	failReset = outcome{f: retry.Failure{Reason: retry.ReasonReset}, again: true}
	served    = outcome{}
	errBuild  = errors.New("cannot build the leg")
)

// script is a try and a drop that play outcomes (the last one repeats) and record the calls.
type script struct {
	outcomes []outcome
	events   []string
	tries    int
}

func (s *script) try(attempt int) (struct{}, error) {
	o := s.outcomes[min(s.tries, len(s.outcomes)-1)]
	s.tries++
	if attempt != s.tries {
		panic(fmt.Sprintf("attempt %d, the script's try %d", attempt, s.tries))
	}
	s.events = append(s.events, fmt.Sprintf("try%d", s.tries))
	switch {
	case o.err != nil:
		return struct{}{}, o.err
	case o.again:
		return struct{}{}, retry.Again("prefill", o.f, nil)
	}
	return struct{}{}, nil
}

func (s *script) drop(struct{}) { s.events = append(s.events, fmt.Sprintf("drop%d", s.tries)) }

// wantEvents is attempts tries, each but the last followed by its drop.
func wantEvents(attempts int) []string {
	var ev []string
	for i := 1; i <= attempts; i++ {
		if i > 1 {
			ev = append(ev, fmt.Sprintf("drop%d", i-1))
		}
		ev = append(ev, fmt.Sprintf("try%d", i))
	}
	return ev
}

// drain takes every token of b (at most limit).
func drain(t *testing.T, b *retry.Budget, limit int) {
	t.Helper()
	for n := 0; n < limit; n++ {
		if !b.Take() {
			return
		}
	}
	t.Fatalf("the budget still allows retries after %d", limit)
}

// oneRetry is a budget of one retry that earns none (no ratio, no minimum rate).
func oneRetry(*testing.T) *retry.Budget { return retry.NewBudget(0, 0) }

func exhaustedBudget(t *testing.T) *retry.Budget {
	b := oneRetry(t)
	drain(t, b, 10)
	return b
}

func TestDo(t *testing.T) {
	fast := retry.Policy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, MaxRetryAfter: 100 * time.Millisecond}
	with := func(p retry.Policy, f func(*retry.Policy)) retry.Policy { f(&p); return p }
	tests := []struct {
		name      string
		policy    retry.Policy
		budget    func(t *testing.T) *retry.Budget
		outcomes  []outcome
		wantErr   error
		attempts  int
		retries   map[string]float64 // by reason
		exhausted float64
		minTime   time.Duration
	}{
		{name: "retryable until MaxAttempts", policy: fast, outcomes: []outcome{fail503},
			attempts: 3, retries: map[string]float64{retry.Reason503: 2}},
		{name: "served after two failures", policy: with(fast, func(p *retry.Policy) { p.MaxAttempts = 5 }),
			outcomes: []outcome{failReset, fail503, served}, attempts: 3, retries: map[string]float64{retry.ReasonReset: 1, retry.Reason503: 1}},
		{name: "served at once", policy: fast, outcomes: []outcome{served}, attempts: 1},
		{name: "not retryable", policy: fast, outcomes: []outcome{{f: retry.Failure{Reason: retry.Reason503}}, fail503}, attempts: 1},
		{name: "MaxAttempts 1 never retries", policy: with(fast, func(p *retry.Policy) { p.MaxAttempts = 1 }), outcomes: []outcome{fail503}, attempts: 1},
		{name: "MaxAttempts 0 makes one attempt", policy: with(fast, func(p *retry.Policy) { p.MaxAttempts = 0 }), outcomes: []outcome{fail503}, attempts: 1},
		{name: "Retry-After over MaxRetryAfter is final", policy: fast,
			outcomes: []outcome{{f: retry.Failure{Reason: retry.Reason429, RetryAfter: time.Second}, again: true}}, attempts: 1},
		{name: "Retry-After at MaxRetryAfter is waited", policy: with(fast, func(p *retry.Policy) { p.MaxAttempts = 2; p.MaxRetryAfter = 5 * time.Millisecond }),
			outcomes: []outcome{{f: retry.Failure{Reason: retry.Reason429, RetryAfter: 5 * time.Millisecond}, again: true}},
			attempts: 2, retries: map[string]float64{retry.Reason429: 1}, minTime: 5 * time.Millisecond},
		{name: "a longer Retry-After later is final", policy: with(fast, func(p *retry.Policy) { p.MaxAttempts = 5 }),
			outcomes: []outcome{fail503, {f: retry.Failure{Reason: retry.Reason503, RetryAfter: time.Hour}, again: true}, fail503},
			attempts: 2, retries: map[string]float64{retry.Reason503: 1}},
		{name: "budget exhausted", policy: fast, budget: exhaustedBudget, outcomes: []outcome{fail503}, attempts: 1, exhausted: 1},
		{name: "budget of one retry", policy: with(fast, func(p *retry.Policy) { p.MaxAttempts = 5 }),
			budget:   oneRetry,
			outcomes: []outcome{fail503}, attempts: 2, retries: map[string]float64{retry.Reason503: 1}, exhausted: 1},
		{name: "nil budget", policy: with(fast, func(p *retry.Policy) { p.MaxAttempts = 4 }),
			budget:   func(*testing.T) *retry.Budget { return nil },
			outcomes: []outcome{failReset}, attempts: 4, retries: map[string]float64{retry.ReasonReset: 3}},
		{name: "error at once", policy: fast, outcomes: []outcome{{err: errBuild, f: retry.Failure{Reason: retry.Reason503}, again: true}},
			wantErr: errBuild, attempts: 1},
		{name: "error after a retry", policy: with(fast, func(p *retry.Policy) { p.MaxAttempts = 5 }),
			outcomes: []outcome{fail503, {err: errBuild}}, wantErr: errBuild, attempts: 2, retries: map[string]float64{retry.Reason503: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			r := retry.Retrier{Policy: tt.policy, Budget: retry.NewBudget(1, 0), Metrics: observe.NewMetrics(reg)}
			if tt.budget != nil {
				r.Budget = tt.budget(t)
			}
			s := &script{outcomes: tt.outcomes}
			start := time.Now()
			_, err := Do(context.Background(), r, logr.Discard(), s.try, s.drop)
			elapsed := time.Since(start)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("Do = %v, want %v", err, tt.wantErr)
			}
			if s.tries != tt.attempts {
				t.Fatalf("%d attempts, want %d", s.tries, tt.attempts)
			}
			if want := wantEvents(tt.attempts); !slices.Equal(s.events, want) {
				t.Fatalf("calls %v, want %v", s.events, want)
			}
			var total float64
			for reason, want := range tt.retries {
				total += want
				if got := counter(t, reg, metricRetries, map[string]string{"phase": "prefill", "reason": reason}); got != want {
					t.Errorf("%s{reason=%q} = %v, want %v", metricRetries, reason, got, want)
				}
			}
			if got := series(t, reg, metricRetries); got != len(tt.retries) {
				t.Errorf("%d series of %s, want %d", got, metricRetries, len(tt.retries))
			}
			if total != float64(tt.attempts-1) && tt.exhausted == 0 && tt.wantErr == nil {
				t.Errorf("%v retries counted for %d attempts", total, tt.attempts)
			}
			if got := counter(t, reg, metricExhausted, map[string]string{"phase": "prefill"}); got != tt.exhausted {
				t.Errorf("%s = %v, want %v", metricExhausted, got, tt.exhausted)
			}
			if elapsed < tt.minTime {
				t.Errorf("Do took %v, want at least the Retry-After %v", elapsed, tt.minTime)
			}
		})
	}
}

// Each Do records one first attempt in the budget, and only one.
func TestDoEarnsBudget(t *testing.T) {
	b := retry.NewBudget(0.5, 0)
	drain(t, b, 100)
	reg := prometheus.NewRegistry()
	r := retry.Retrier{Policy: retry.Policy{MaxAttempts: 3}, Budget: b, Metrics: observe.NewMetrics(reg)}
	for i, want := range []int{1, 2, 1, 2} { // 0.5, then 1 (one retry), then 0.5, then 1
		s := &script{outcomes: []outcome{fail503}}
		if _, err := Do(context.Background(), r, logr.Discard(), s.try, s.drop); err != nil {
			t.Fatal(err)
		}
		if s.tries != want {
			t.Fatalf("run %d: %d attempts, want %d", i, s.tries, want)
		}
	}
	if got := counter(t, reg, metricExhausted, map[string]string{"phase": "prefill"}); got != 4 {
		t.Fatalf("%s = %v, want 4", metricExhausted, got)
	}
	if got := counter(t, reg, metricRetries, map[string]string{"phase": "prefill", "reason": retry.Reason503}); got != 2 {
		t.Fatalf("%s = %v, want 2", metricRetries, got)
	}
}

func TestDoContextEnds(t *testing.T) {
	// The Retry-After (under MaxRetryAfter) makes every wait an hour.
	p := retry.Policy{MaxAttempts: 3, MaxRetryAfter: 2 * time.Hour}
	hour := outcome{f: retry.Failure{Reason: retry.Reason503, RetryAfter: time.Hour}, again: true}

	t.Run("cancelled before the wait", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		reg := prometheus.NewRegistry()
		s := &script{outcomes: []outcome{hour}}
		drop := func(v struct{}) { s.drop(v); cancel() }
		_, err := Do(ctx, retry.Retrier{Policy: p, Metrics: observe.NewMetrics(reg)}, logr.Discard(), s.try, drop)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Do = %v, want context.Canceled", err)
		}
		if !slices.Equal(s.events, []string{"try1", "drop1"}) {
			t.Fatalf("calls %v", s.events)
		}
		if got := counter(t, reg, metricRetries, map[string]string{"phase": "prefill", "reason": retry.Reason503}); got != 1 {
			t.Fatalf("%s = %v, want 1", metricRetries, got)
		}
	})

	t.Run("deadline during the wait", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		s := &script{outcomes: []outcome{hour}}
		start := time.Now()
		_, err := Do(ctx, retry.Retrier{Policy: p}, logr.Discard(), s.try, s.drop)
		if elapsed := time.Since(start); elapsed > 5*time.Second {
			t.Fatalf("Do took %v, it waited out the backoff", elapsed)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Do = %v, want context.DeadlineExceeded", err)
		}
		if !slices.Equal(s.events, []string{"try1", "drop1"}) {
			t.Fatalf("calls %v", s.events)
		}
	})

	t.Run("cancelled by another goroutine during the wait", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		dropped := make(chan struct{})
		s := &script{outcomes: []outcome{hour}}
		drop := func(v struct{}) { s.drop(v); close(dropped) }
		go func() {
			<-dropped
			cancel()
		}()
		_, err := Do(ctx, retry.Retrier{Policy: p}, logr.Discard(), s.try, drop)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Do = %v, want context.Canceled", err)
		}
		if s.tries != 1 {
			t.Fatalf("%d attempts, want 1", s.tries)
		}
	})
}

// Each retry is an event of the caller's span and a warning in the log.
func TestDoRecordsRetries(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, span := tp.Tracer("test").Start(context.Background(), "leg")

	var logs []string
	log := funcr.New(func(_, args string) { logs = append(logs, args) }, funcr.Options{Verbosity: 1})

	s := &script{outcomes: []outcome{fail503, failReset}}
	r := retry.Retrier{Policy: retry.Policy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}}
	if _, err := Do(ctx, r, log, s.try, s.drop); err != nil {
		t.Fatal(err)
	}
	span.End()

	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans ended", len(spans))
	}
	events := spans[0].Events()
	if len(events) != 2 {
		t.Fatalf("%d span events, want 2 retries", len(events))
	}
	for i, want := range []struct {
		attempt int64
		reason  string
	}{{2, retry.Reason503}, {3, retry.ReasonReset}} {
		ev := events[i]
		attrs := map[string]string{}
		var attempt int64
		for _, kv := range ev.Attributes {
			if kv.Key == "attempt" {
				attempt = kv.Value.AsInt64()
				continue
			}
			attrs[string(kv.Key)] = kv.Value.String()
		}
		if ev.Name != "retry" || attempt != want.attempt || attrs["reason"] != want.reason || attrs[string(observe.AttrPhase)] != "prefill" {
			t.Fatalf("event %d: %s attempt %d %v, want retry attempt %d reason %s phase prefill", i, ev.Name, attempt, attrs, want.attempt, want.reason)
		}
		if d, err := time.ParseDuration(attrs["backoff"]); err != nil || d < 0 || d > time.Millisecond {
			t.Fatalf("event %d backoff %q", i, attrs["backoff"])
		}
	}
	if len(logs) != 2 {
		t.Fatalf("logged %q, want one line per retry", logs)
	}
	for i, want := range []string{`"attempt"=2 "reason"="503"`, `"attempt"=3 "reason"="reset"`} {
		if !strings.Contains(logs[i], want) || !strings.Contains(logs[i], "retrying the leg on another pick") {
			t.Fatalf("log %d = %s, want %s", i, logs[i], want)
		}
	}
}

// A request's allowance caps the retries of all its legs together.
func TestDoRequestLimit(t *testing.T) {
	r := retry.Retrier{Policy: retry.Policy{MaxAttempts: 5, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}, Budget: retry.NewBudget(1, 0)}
	ctx := retry.WithRequestLimit(context.Background(), 3)
	var tries []int
	for range 3 { // three legs of one request, each failing retryably every time
		s := &script{outcomes: []outcome{fail503}}
		if _, err := Do(ctx, r, logr.Discard(), s.try, s.drop); err != nil {
			t.Fatal(err)
		}
		tries = append(tries, s.tries)
	}
	if !slices.Equal(tries, []int{4, 1, 1}) {
		t.Fatalf("attempts per leg %v, want [4 1 1]: three retries for the whole request", tries)
	}
	if retry.TakeRequest(ctx) {
		t.Fatal("the allowance is spent, TakeRequest must refuse")
	}
	if !retry.TakeRequest(context.Background()) {
		t.Fatal("a context without a limit must allow")
	}
	if zero := retry.WithRequestLimit(context.Background(), 0); retry.TakeRequest(zero) {
		t.Fatal("an allowance of 0 disables retries")
	}
}

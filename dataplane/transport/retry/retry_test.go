package retry

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
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

// fakeClock is a settable clock for Budget.now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// budgetAt is NewBudget on clock.
func budgetAt(clock *fakeClock, ratio, minPerSecond float64) *Budget {
	b := NewBudget(ratio, minPerSecond)
	b.now = clock.Now
	return b
}

// drain takes every token of b, reporting how many there were (at most limit).
func drain(t *testing.T, b *Budget, limit int) int {
	t.Helper()
	for n := 0; n < limit; n++ {
		if !b.Take() {
			return n
		}
	}
	t.Fatalf("the budget still allows retries after %d", limit)
	return limit
}

func TestBackoff(t *testing.T) {
	const draws = 500
	p := Policy{InitialBackoff: 10 * time.Millisecond, MaxBackoff: 80 * time.Millisecond}
	ceilings := map[int]time.Duration{1: 10 * time.Millisecond, 2: 20 * time.Millisecond, 3: 40 * time.Millisecond, 4: 80 * time.Millisecond}
	for n := 1; n <= 40; n++ {
		ceiling, ok := ceilings[n]
		if !ok {
			ceiling = 80 * time.Millisecond
		}
		lo, hi := time.Duration(1<<62), time.Duration(-1)
		for range draws {
			d := p.Backoff(n, 0)
			if d < 0 || d > ceiling {
				t.Fatalf("Backoff(%d, 0) = %v, want within [0, %v]", n, d, ceiling)
			}
			lo, hi = min(lo, d), max(hi, d)
			// A Retry-After longer than any draw is the wait.
			if d := p.Backoff(n, 200*time.Millisecond); d != 200*time.Millisecond {
				t.Fatalf("Backoff(%d, 200ms) = %v, want the Retry-After", n, d)
			}
		}
		// Full jitter: the draws spread over the range (each miss has odds 2^-500).
		if lo >= ceiling/2 || hi <= ceiling/2 {
			t.Fatalf("Backoff(%d, 0) drew only within [%v, %v] of [0, %v]", n, lo, hi, ceiling)
		}
	}
	// Far past the shift width nothing overflows: the ceiling stays MaxBackoff.
	for _, n := range []int{63, 64, 65, 1000, int(^uint(0) >> 1)} {
		for range 100 {
			if d := p.Backoff(n, 0); d < 0 || d > p.MaxBackoff {
				t.Fatalf("Backoff(%d, 0) = %v, want within [0, %v]", n, d, p.MaxBackoff)
			}
		}
	}
	// A Retry-After shorter than the jitter ceiling is only a floor.
	for range draws {
		if d := p.Backoff(4, 30*time.Millisecond); d < 30*time.Millisecond || d > 80*time.Millisecond {
			t.Fatalf("Backoff(4, 30ms) = %v, want within [30ms, 80ms]", d)
		}
	}
	// No backoff configured: no wait but the Retry-After.
	zero := Policy{}
	if d := zero.Backoff(3, 0); d != 0 {
		t.Fatalf("zero policy Backoff = %v, want 0", d)
	}
	if d := zero.Backoff(3, time.Second); d != time.Second {
		t.Fatalf("zero policy Backoff with Retry-After 1s = %v", d)
	}
}

// With a large InitialBackoff, InitialBackoff<<(n-1) overflows for n <= 30, the ceiling goes
// negative and the backoff collapses to 0 (no wait at all) instead of MaxBackoff.
func TestBackoffLargeInitialOverflow(t *testing.T) {
	p := Policy{InitialBackoff: time.Hour, MaxBackoff: 2 * time.Hour}
	for n := 1; n <= 40; n++ {
		var hi time.Duration
		for range 200 {
			d := p.Backoff(n, 0)
			if d < 0 || d > p.MaxBackoff {
				t.Fatalf("Backoff(%d, 0) = %v, want within [0, %v]", n, d, p.MaxBackoff)
			}
			hi = max(hi, d)
		}
		if hi == 0 {
			t.Fatalf("InitialBackoff 1h, n=%d: every draw is 0, want up to MaxBackoff 2h", n)
		}
	}
}

func TestBudgetRatio(t *testing.T) {
	clock := newFakeClock()
	b := budgetAt(clock, 0.2, 0)
	// burst is max(10·0.2, 10·0, 1) = 2 retries, which a new budget starts with.
	if got := drain(t, b, 100); got != 2 {
		t.Fatalf("a new budget of ratio 0.2 allowed %d retries, want the burst of 2", got)
	}
	for i := 1; i <= 4; i++ {
		b.Attempted()
		if b.Take() {
			t.Fatalf("a retry allowed after %d first attempts at ratio 0.2", i)
		}
	}
	b.Attempted() // the fifth: 5 × 0.2 = 1 retry
	if !b.Take() {
		t.Fatal("5 first attempts at ratio 0.2 did not earn a retry")
	}
	if b.Take() {
		t.Fatal("5 first attempts at ratio 0.2 earned more than one retry")
	}
	// Time earns nothing without a minimum rate.
	clock.Advance(time.Hour)
	if b.Take() {
		t.Fatal("an hour earned a retry with minPerSecond 0")
	}
	// Earned retries are capped at the burst.
	for range 1000 {
		b.Attempted()
	}
	if got := drain(t, b, 100); got != 2 {
		t.Fatalf("1000 first attempts banked %d retries, want the burst of 2", got)
	}
}

func TestBudgetMinPerSecond(t *testing.T) {
	clock := newFakeClock()
	b := budgetAt(clock, 0, 1)
	if got := drain(t, b, 100); got != 10 {
		t.Fatalf("a new budget of 1/s allowed %d retries, want the burst of 10", got)
	}
	steps := []struct {
		advance time.Duration
		want    int
	}{
		{0, 0},
		{999 * time.Millisecond, 0},
		{time.Millisecond, 1}, // a whole second since the drain
		{2500 * time.Millisecond, 2},
		{500 * time.Millisecond, 1}, // the half retry left over, and this half
		{100 * time.Second, 10},     // capped at the burst
		{time.Hour, 10},
	}
	for i, s := range steps {
		clock.Advance(s.advance)
		if got := drain(t, b, 100); got != s.want {
			t.Fatalf("step %d (+%v): %d retries allowed, want %d", i, s.advance, got, s.want)
		}
	}
	// Attempts at ratio 0 earn nothing.
	for range 100 {
		b.Attempted()
	}
	if b.Take() {
		t.Fatal("first attempts earned a retry at ratio 0")
	}
}

func TestBudgetBurst(t *testing.T) {
	tests := []struct {
		ratio, minPerSecond float64
		want                int
	}{
		{0, 0, 1},
		{0.05, 0, 1},
		{0.2, 0, 2},
		{1, 0, 10},
		{0, 0.5, 5},
		{0, 5, 50},
		{0.2, 5, 50},
		{1, 0.5, 10},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("ratio %v min %v", tt.ratio, tt.minPerSecond), func(t *testing.T) {
			b := budgetAt(newFakeClock(), tt.ratio, tt.minPerSecond)
			if got := drain(t, b, 1000); got != tt.want {
				t.Fatalf("a new budget allowed %d retries, want %d", got, tt.want)
			}
		})
	}
}

func TestBudgetConfigure(t *testing.T) {
	tests := []struct {
		name                     string
		ratio, minPerSecond      float64
		take                     int // retries spent before Configure
		newRatio, newMinPerSec   float64
		want                     int // retries allowed after it
		wantAfterOneFirstAttempt int
	}{
		{name: "lower burst caps the tokens", ratio: 1, take: 3, newRatio: 0.5, want: 5, wantAfterOneFirstAttempt: 0},
		{name: "higher burst keeps the tokens", ratio: 1, take: 3, newRatio: 1, newMinPerSec: 3, want: 7, wantAfterOneFirstAttempt: 1},
		{name: "raising the rates grants nothing", ratio: 0.2, take: 2, newRatio: 1, want: 0, wantAfterOneFirstAttempt: 1},
		{name: "down to the floor of one", ratio: 1, newRatio: 0, want: 1, wantAfterOneFirstAttempt: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := budgetAt(newFakeClock(), tt.ratio, tt.minPerSecond)
			for i := range tt.take {
				if !b.Take() {
					t.Fatalf("take %d refused", i)
				}
			}
			b.Configure(tt.newRatio, tt.newMinPerSec)
			if got := drain(t, b, 1000); got != tt.want {
				t.Fatalf("after Configure %d retries allowed, want %d", got, tt.want)
			}
			b.Attempted() // earns the new ratio
			if got := drain(t, b, 1000); got != tt.wantAfterOneFirstAttempt {
				t.Fatalf("after one first attempt %d retries allowed, want %d", got, tt.wantAfterOneFirstAttempt)
			}
		})
	}
}

func TestBudgetNil(t *testing.T) {
	var b *Budget
	for range 100 {
		b.Attempted()
		if !b.Take() {
			t.Fatal("a nil budget refused a retry")
		}
	}
}

func TestBudgetConcurrent(t *testing.T) {
	const goroutines, rounds = 8, 500
	clock := newFakeClock()
	b := budgetAt(clock, 1, 0)
	drain(t, b, 100)
	// Each goroutine records a first attempt before each of its retries: with ratio 1 every Take
	// finds the token of its own Attempted (or another's), and at most 8 < burst are ever banked.
	var wg sync.WaitGroup
	var mu sync.Mutex
	taken := 0
	for range goroutines {
		wg.Go(func() {
			n := 0
			for range rounds {
				b.Attempted()
				if b.Take() {
					n++
				}
			}
			mu.Lock()
			taken += n
			mu.Unlock()
		})
	}
	// Reconfigure and move the clock meanwhile: neither changes the count (burst stays 10, no
	// minimum rate).
	wg.Go(func() {
		for range rounds {
			b.Configure(1, 0)
			clock.Advance(time.Millisecond)
		}
	})
	wg.Wait()
	if taken != goroutines*rounds {
		t.Fatalf("%d retries taken, want %d", taken, goroutines*rounds)
	}
	if b.Take() {
		t.Fatal("a token left over")
	}

	// Many goroutines racing for a full budget get exactly its burst.
	b = budgetAt(clock, 1, 0)
	var won sync.WaitGroup
	results := make(chan bool, 100)
	for range 100 {
		won.Go(func() { results <- b.Take() })
	}
	won.Wait()
	close(results)
	n := 0
	for ok := range results {
		if ok {
			n++
		}
	}
	if n != 10 {
		t.Fatalf("%d of 100 concurrent takes succeeded, want the burst of 10", n)
	}
}

func TestClassifyStatus(t *testing.T) {
	tests := []struct {
		status     int
		retryAfter time.Duration
		want       Failure
		ok         bool
	}{
		{http.StatusTooManyRequests, 3 * time.Second, Failure{Reason: Reason429, RetryAfter: 3 * time.Second}, true},
		{http.StatusTooManyRequests, 0, Failure{Reason: Reason429}, true},
		{http.StatusBadGateway, 3 * time.Second, Failure{Reason: Reason502}, true}, // its Retry-After is not kept
		{http.StatusServiceUnavailable, 7 * time.Second, Failure{Reason: Reason503, RetryAfter: 7 * time.Second}, true},
		{http.StatusGatewayTimeout, time.Second, Failure{Reason: Reason504}, true},
		{http.StatusOK, 0, Failure{}, false},
		{http.StatusBadRequest, 0, Failure{}, false},
		{http.StatusNotFound, 0, Failure{}, false},
		{http.StatusPreconditionFailed, 0, Failure{}, false},
		{http.StatusInternalServerError, time.Second, Failure{}, false},
		{http.StatusNotImplemented, 0, Failure{}, false},
		{0, 0, Failure{}, false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.status), func(t *testing.T) {
			got, ok := ClassifyStatus(tt.status, tt.retryAfter)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("ClassifyStatus(%d, %v) = %+v, %v; want %+v, %v", tt.status, tt.retryAfter, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

func refusedDial(t *testing.T) error {
	t.Helper()
	c, err := net.Dial("tcp", closedAddr(t))
	if err == nil {
		c.Close()
		t.Fatal("dialled a closed port")
	}
	return err
}

// get is a GET of url on a fresh connection, which must fail.
func get(t *testing.T, tr *http.Transport, url string) error {
	t.Helper()
	tr.DisableKeepAlives = true
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, http.NoBody)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("GET %s answered %s", url, resp.Status)
	}
	return err
}

func refusedGet(t *testing.T) error {
	t.Helper()
	return get(t, &http.Transport{}, "http://"+closedAddr(t)+"/")
}

// hangUp is the error of a GET to a server that reads the request, then closes the connection
// without answering: with a FIN, or with a RST when reset.
func hangUp(t *testing.T, reset bool) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			done <- err
			return
		}
		if reset {
			if err := c.(*net.TCPConn).SetLinger(0); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	err = get(t, &http.Transport{}, "http://"+ln.Addr().String()+"/")
	if serr := <-done; serr != nil {
		t.Fatalf("server: %v", serr)
	}
	// The test reaches the branch it means to.
	want := io.EOF
	if reset {
		want = syscall.ECONNRESET
	}
	if !errors.Is(err, want) {
		t.Fatalf("GET = %v, want %v", err, want)
	}
	return err
}

// headerTimeout is the error of a GET to a server that never answers, under a
// ResponseHeaderTimeout.
func headerTimeout(t *testing.T) error {
	t.Helper()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	return get(t, &http.Transport{ResponseHeaderTimeout: 20 * time.Millisecond}, srv.URL)
}

func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

func TestClassifyError(t *testing.T) {
	idleCause := fmt.Errorf("%w (%w)", upstream.ErrIdle, context.Canceled) // as upstream.Client wraps it
	tests := []struct {
		name string
		ctx  context.Context
		err  func(t *testing.T) error
		want Failure
		ok   bool
	}{
		{name: "dial to a closed port", err: refusedDial, want: Failure{Reason: ReasonConnect}, ok: true},
		{name: "GET to a closed port", err: refusedGet, want: Failure{Reason: ReasonConnect}, ok: true},
		{name: "dial error of another kind", err: func(*testing.T) error {
			return &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "worker", IsNotFound: true}}
		}, want: Failure{Reason: ReasonConnect}, ok: true},
		{name: "unreachable", err: func(*testing.T) error {
			return &net.OpError{Op: "connect", Net: "tcp", Err: syscall.EHOSTUNREACH}
		}, want: Failure{Reason: ReasonConnect}, ok: true},
		{name: "closed before the answer", err: func(t *testing.T) error { return hangUp(t, false) }, want: Failure{Reason: ReasonReset}, ok: true},
		{name: "reset before the answer", err: func(t *testing.T) error { return hangUp(t, true) }, want: Failure{Reason: ReasonReset}, ok: true},
		{name: "body broke off", err: func(*testing.T) error { return fmt.Errorf("reading body: %w", io.ErrUnexpectedEOF) },
			want: Failure{Reason: ReasonReset}, ok: true},
		{name: "no headers in time", err: headerTimeout, want: Failure{Reason: ReasonTimeout}, ok: true},
		{name: "idle timeout", err: func(*testing.T) error { return idleCause }, want: Failure{Reason: ReasonIdle}, ok: true},
		{name: "idle timeout in an upstream error", err: func(*testing.T) error {
			return &apierror.UpstreamError{Phase: "prefill", Status: http.StatusOK, Err: fmt.Errorf("reading body: %w", idleCause)}
		}, want: Failure{Reason: ReasonIdle}, ok: true},
		{name: "past the overall deadline", err: func(*testing.T) error {
			return fmt.Errorf("%w (%w)", upstream.ErrDeadline, context.Canceled)
		}},
		{name: "past the overall deadline in a read timeout", err: func(*testing.T) error {
			return fmt.Errorf("%w (%w)", upstream.ErrDeadline, os.ErrDeadlineExceeded)
		}},
		{name: "answer too large", err: func(*testing.T) error {
			return fmt.Errorf("%w: over 16 bytes", upstream.ErrResponseTooLarge)
		}},
		{name: "client cancelled", ctx: cancelled(), err: func(*testing.T) error { return context.Canceled }},
		{name: "client cancelled during a refused dial", ctx: cancelled(), err: refusedDial},
		{name: "client cancelled during an idle timeout", ctx: cancelled(), err: func(*testing.T) error { return idleCause }},
		{name: "another error", err: func(*testing.T) error { return errors.New("json: cannot unmarshal") }},
		{name: "nil", err: func(*testing.T) error { return nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := tt.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			err := tt.err(t)
			got, ok := ClassifyError(ctx, err)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("ClassifyError(%v) = %+v, %v; want %+v, %v", err, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestClassifyCall(t *testing.T) {
	tests := []struct {
		name string
		ctx  context.Context
		err  func(t *testing.T) error
		want Failure
		ok   bool
	}{
		{name: "503 with Retry-After", err: func(*testing.T) error {
			return &apierror.UpstreamError{Phase: "encode[0]", Status: http.StatusServiceUnavailable, RetryAfter: 4 * time.Second}
		}, want: Failure{Reason: Reason503, RetryAfter: 4 * time.Second}, ok: true},
		{name: "429 with Retry-After", err: func(*testing.T) error {
			return &apierror.UpstreamError{Phase: "render", Status: http.StatusTooManyRequests, RetryAfter: time.Second}
		}, want: Failure{Reason: Reason429, RetryAfter: time.Second}, ok: true},
		{name: "wrapped 504", err: func(*testing.T) error {
			return fmt.Errorf("encode: %w", &apierror.UpstreamError{Phase: "encode[1]", Status: http.StatusGatewayTimeout})
		}, want: Failure{Reason: Reason504}, ok: true},
		{name: "400", err: func(*testing.T) error {
			return &apierror.UpstreamError{Phase: "render", Status: http.StatusBadRequest, Err: io.ErrUnexpectedEOF}
		}},
		{name: "500", err: func(*testing.T) error {
			return &apierror.UpstreamError{Phase: "render", Status: http.StatusInternalServerError}
		}},
		{name: "transport error: refused", err: func(t *testing.T) error {
			return &apierror.UpstreamError{Phase: "render", Err: refusedGet(t)}
		}, want: Failure{Reason: ReasonConnect}, ok: true},
		{name: "transport error: reset", err: func(t *testing.T) error {
			return &apierror.UpstreamError{Phase: "render", Err: hangUp(t, true)}
		}, want: Failure{Reason: ReasonReset}, ok: true},
		{name: "transport error: deadline", err: func(*testing.T) error {
			return &apierror.UpstreamError{Phase: "render", Err: fmt.Errorf("%w (%w)", upstream.ErrDeadline, context.Canceled)}
		}},
		{name: "200 whose body broke off", err: func(*testing.T) error {
			return &apierror.UpstreamError{Phase: "render", Status: http.StatusOK, Err: fmt.Errorf("reading body: %w", io.ErrUnexpectedEOF)}
		}, want: Failure{Reason: ReasonReset}, ok: true},
		{name: "200 too large", err: func(*testing.T) error {
			return &apierror.UpstreamError{Phase: "render", Status: http.StatusOK, Err: fmt.Errorf("%w: over 1 bytes", upstream.ErrResponseTooLarge)}
		}},
		{name: "transport error, client cancelled", ctx: cancelled(), err: func(t *testing.T) error {
			return &apierror.UpstreamError{Phase: "render", Err: refusedDial(t)}
		}},
		{name: "nil", err: func(*testing.T) error { return nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := tt.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			err := tt.err(t)
			got, ok := ClassifyCall(ctx, err)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("ClassifyCall(%v) = %+v, %v; want %+v, %v", err, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestUnserved(t *testing.T) {
	status := func(s int) func(*testing.T) error {
		return func(*testing.T) error {
			return &apierror.UpstreamError{Phase: "prefill", Status: s, RetryAfter: time.Second}
		}
	}
	tests := []struct {
		name string
		ctx  context.Context
		err  func(t *testing.T) error
		want bool
	}{
		{name: "503", err: status(http.StatusServiceUnavailable), want: true},
		{name: "429", err: status(http.StatusTooManyRequests), want: true},
		{name: "502", err: status(http.StatusBadGateway), want: true},
		{name: "504", err: status(http.StatusGatewayTimeout), want: true},
		{name: "refused", err: func(t *testing.T) error {
			return &apierror.UpstreamError{Phase: "prefill", Err: refusedGet(t)}
		}, want: true},
		{name: "idle", err: func(*testing.T) error {
			return &apierror.UpstreamError{Phase: "prefill", Status: http.StatusOK, Err: fmt.Errorf("%w (%w)", upstream.ErrIdle, context.Canceled)}
		}, want: true},
		{name: "past the deadline", err: func(*testing.T) error {
			return &apierror.UpstreamError{Phase: "prefill", Err: fmt.Errorf("%w (%w)", upstream.ErrDeadline, context.Canceled)}
		}, want: true},
		{name: "past the deadline reading the body", err: func(*testing.T) error {
			return &apierror.UpstreamError{Phase: "prefill", Status: http.StatusOK, Err: fmt.Errorf("reading body: %w", upstream.ErrDeadline)}
		}, want: true},
		{name: "400", err: status(http.StatusBadRequest)},
		{name: "500", err: status(http.StatusInternalServerError)},
		{name: "too large", err: func(*testing.T) error {
			return &apierror.UpstreamError{Phase: "prefill", Status: http.StatusOK, Err: upstream.ErrResponseTooLarge}
		}},
		{name: "another error", err: func(*testing.T) error { return errors.New("boom") }},
		{name: "nil", err: func(*testing.T) error { return nil }},
		{name: "503, client cancelled", ctx: cancelled(), err: status(http.StatusServiceUnavailable)},
		{name: "refused, client cancelled", ctx: cancelled(), err: func(t *testing.T) error {
			return &apierror.UpstreamError{Phase: "prefill", Err: refusedDial(t)}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := tt.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			err := tt.err(t)
			if got := Unserved(ctx, err); got != tt.want {
				t.Fatalf("Unserved(%v) = %v, want %v", err, got, tt.want)
			}
		})
	}
}

// outcome is what one attempt's try returns.
type outcome struct {
	f     Failure
	again bool
	err   error
}

var (
	fail503   = outcome{f: Failure{Reason: Reason503}, again: true}
	failReset = outcome{f: Failure{Reason: ReasonReset}, again: true}
	served    = outcome{}
	errBuild  = errors.New("cannot build the leg")
)

// script is a try and a drop that play outcomes (the last one repeats) and record the calls.
type script struct {
	outcomes []outcome
	events   []string
	tries    int
}

func (s *script) try() (string, Failure, bool, error) {
	o := s.outcomes[min(s.tries, len(s.outcomes)-1)]
	s.tries++
	s.events = append(s.events, fmt.Sprintf("try%d", s.tries))
	return "prefill", o.f, o.again, o.err
}

func (s *script) drop() { s.events = append(s.events, fmt.Sprintf("drop%d", s.tries)) }

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

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func exhaustedBudget(t *testing.T) *Budget {
	b := budgetAt(newFakeClock(), 0, 0)
	drain(t, b, 10)
	return b
}

func TestRetrierRun(t *testing.T) {
	fast := Policy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, MaxRetryAfter: 100 * time.Millisecond}
	with := func(p Policy, f func(*Policy)) Policy { f(&p); return p }
	tests := []struct {
		name      string
		policy    Policy
		budget    func(t *testing.T) *Budget
		outcomes  []outcome
		wantErr   error
		attempts  int
		retries   map[string]float64 // by reason
		exhausted float64
		minTime   time.Duration
	}{
		{name: "retryable until MaxAttempts", policy: fast, outcomes: []outcome{fail503},
			attempts: 3, retries: map[string]float64{Reason503: 2}},
		{name: "served after two failures", policy: with(fast, func(p *Policy) { p.MaxAttempts = 5 }),
			outcomes: []outcome{failReset, fail503, served}, attempts: 3, retries: map[string]float64{ReasonReset: 1, Reason503: 1}},
		{name: "served at once", policy: fast, outcomes: []outcome{served}, attempts: 1},
		{name: "not retryable", policy: fast, outcomes: []outcome{{f: Failure{Reason: Reason503}}, fail503}, attempts: 1},
		{name: "MaxAttempts 1 never retries", policy: with(fast, func(p *Policy) { p.MaxAttempts = 1 }), outcomes: []outcome{fail503}, attempts: 1},
		{name: "MaxAttempts 0 makes one attempt", policy: with(fast, func(p *Policy) { p.MaxAttempts = 0 }), outcomes: []outcome{fail503}, attempts: 1},
		{name: "Retry-After over MaxRetryAfter is final", policy: fast,
			outcomes: []outcome{{f: Failure{Reason: Reason429, RetryAfter: time.Second}, again: true}}, attempts: 1},
		{name: "Retry-After at MaxRetryAfter is waited", policy: with(fast, func(p *Policy) { p.MaxAttempts = 2; p.MaxRetryAfter = 5 * time.Millisecond }),
			outcomes: []outcome{{f: Failure{Reason: Reason429, RetryAfter: 5 * time.Millisecond}, again: true}},
			attempts: 2, retries: map[string]float64{Reason429: 1}, minTime: 5 * time.Millisecond},
		{name: "a longer Retry-After later is final", policy: with(fast, func(p *Policy) { p.MaxAttempts = 5 }),
			outcomes: []outcome{fail503, {f: Failure{Reason: Reason503, RetryAfter: time.Hour}, again: true}, fail503},
			attempts: 2, retries: map[string]float64{Reason503: 1}},
		{name: "budget exhausted", policy: fast, budget: exhaustedBudget, outcomes: []outcome{fail503}, attempts: 1, exhausted: 1},
		{name: "budget of one retry", policy: with(fast, func(p *Policy) { p.MaxAttempts = 5 }),
			budget:   func(*testing.T) *Budget { return budgetAt(newFakeClock(), 0, 0) },
			outcomes: []outcome{fail503}, attempts: 2, retries: map[string]float64{Reason503: 1}, exhausted: 1},
		{name: "nil budget", policy: with(fast, func(p *Policy) { p.MaxAttempts = 4 }),
			budget:   func(*testing.T) *Budget { return nil },
			outcomes: []outcome{failReset}, attempts: 4, retries: map[string]float64{ReasonReset: 3}},
		{name: "error at once", policy: fast, outcomes: []outcome{{err: errBuild, f: Failure{Reason: Reason503}, again: true}},
			wantErr: errBuild, attempts: 1},
		{name: "error after a retry", policy: with(fast, func(p *Policy) { p.MaxAttempts = 5 }),
			outcomes: []outcome{fail503, {err: errBuild}}, wantErr: errBuild, attempts: 2, retries: map[string]float64{Reason503: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			r := Retrier{Policy: tt.policy, Budget: NewBudget(1, 0), Metrics: observe.NewMetrics(reg)}
			if tt.budget != nil {
				r.Budget = tt.budget(t)
			}
			s := &script{outcomes: tt.outcomes}
			start := time.Now()
			err := r.Run(context.Background(), logr.Discard(), s.try, s.drop)
			elapsed := time.Since(start)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("Run = %v, want %v", err, tt.wantErr)
			}
			if s.tries != tt.attempts {
				t.Fatalf("%d attempts, want %d", s.tries, tt.attempts)
			}
			if want := wantEvents(tt.attempts); !equal(s.events, want) {
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
				t.Errorf("Run took %v, want at least the Retry-After %v", elapsed, tt.minTime)
			}
		})
	}
}

// Each Run records one first attempt in the budget, and only one.
func TestRetrierRunEarnsBudget(t *testing.T) {
	b := budgetAt(newFakeClock(), 0.5, 0)
	drain(t, b, 100)
	reg := prometheus.NewRegistry()
	r := Retrier{Policy: Policy{MaxAttempts: 3}, Budget: b, Metrics: observe.NewMetrics(reg)}
	for i, want := range []int{1, 2, 1, 2} { // 0.5, then 1 (one retry), then 0.5, then 1
		s := &script{outcomes: []outcome{fail503}}
		if err := r.Run(context.Background(), logr.Discard(), s.try, s.drop); err != nil {
			t.Fatal(err)
		}
		if s.tries != want {
			t.Fatalf("run %d: %d attempts, want %d", i, s.tries, want)
		}
	}
	if got := counter(t, reg, metricExhausted, map[string]string{"phase": "prefill"}); got != 4 {
		t.Fatalf("%s = %v, want 4", metricExhausted, got)
	}
	if got := counter(t, reg, metricRetries, map[string]string{"phase": "prefill", "reason": Reason503}); got != 2 {
		t.Fatalf("%s = %v, want 2", metricRetries, got)
	}
}

func TestRetrierRunContextEnds(t *testing.T) {
	// The Retry-After (under MaxRetryAfter) makes every wait an hour.
	p := Policy{MaxAttempts: 3, MaxRetryAfter: 2 * time.Hour}
	hour := outcome{f: Failure{Reason: Reason503, RetryAfter: time.Hour}, again: true}

	t.Run("cancelled before the wait", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		reg := prometheus.NewRegistry()
		s := &script{outcomes: []outcome{hour}}
		drop := func() { s.drop(); cancel() }
		err := Retrier{Policy: p, Metrics: observe.NewMetrics(reg)}.Run(ctx, logr.Discard(), s.try, drop)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v, want context.Canceled", err)
		}
		if !equal(s.events, []string{"try1", "drop1"}) {
			t.Fatalf("calls %v", s.events)
		}
		if got := counter(t, reg, metricRetries, map[string]string{"phase": "prefill", "reason": Reason503}); got != 1 {
			t.Fatalf("%s = %v, want 1", metricRetries, got)
		}
	})

	t.Run("deadline during the wait", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		s := &script{outcomes: []outcome{hour}}
		start := time.Now()
		err := Retrier{Policy: p}.Run(ctx, logr.Discard(), s.try, s.drop)
		if elapsed := time.Since(start); elapsed > 5*time.Second {
			t.Fatalf("Run took %v, it waited out the backoff", elapsed)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Run = %v, want context.DeadlineExceeded", err)
		}
		if !equal(s.events, []string{"try1", "drop1"}) {
			t.Fatalf("calls %v", s.events)
		}
	})

	t.Run("cancelled by another goroutine during the wait", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		dropped := make(chan struct{})
		s := &script{outcomes: []outcome{hour}}
		drop := func() { s.drop(); close(dropped) }
		go func() {
			<-dropped
			cancel()
		}()
		err := Retrier{Policy: p}.Run(ctx, logr.Discard(), s.try, drop)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v, want context.Canceled", err)
		}
		if s.tries != 1 {
			t.Fatalf("%d attempts, want 1", s.tries)
		}
	})
}

// Each retry is an event of the caller's span and a warning in the log.
func TestRetrierRunRecordsRetries(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, span := tp.Tracer("test").Start(context.Background(), "leg")

	var logs []string
	log := funcr.New(func(_, args string) { logs = append(logs, args) }, funcr.Options{Verbosity: 1})

	s := &script{outcomes: []outcome{fail503, failReset}}
	r := Retrier{Policy: Policy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}}
	if err := r.Run(ctx, log, s.try, s.drop); err != nil {
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
	}{{2, Reason503}, {3, ReasonReset}} {
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
func TestRetrierRunRequestLimit(t *testing.T) {
	r := Retrier{Policy: Policy{MaxAttempts: 5, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}, Budget: NewBudget(1, 0)}
	ctx := WithRequestLimit(context.Background(), 3)
	var tries []int
	for range 3 { // three legs of one request, each failing retryably every time
		s := &script{outcomes: []outcome{fail503}}
		if err := r.Run(ctx, logr.Discard(), s.try, s.drop); err != nil {
			t.Fatal(err)
		}
		tries = append(tries, s.tries)
	}
	if !slices.Equal(tries, []int{4, 1, 1}) {
		t.Fatalf("attempts per leg %v, want [4 1 1]: three retries for the whole request", tries)
	}
	if TakeRequest(ctx) {
		t.Fatal("the allowance is spent, TakeRequest must refuse")
	}
	if !TakeRequest(context.Background()) {
		t.Fatal("a context without a limit must allow")
	}
	if zero := WithRequestLimit(context.Background(), 0); TakeRequest(zero) {
		t.Fatal("an allowance of 0 disables retries")
	}
}

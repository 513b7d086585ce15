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
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
	"github.com/epd-dev/coordinator/test/harness/refused"
)

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

func refusedDial(t *testing.T) error {
	t.Helper()
	c, err := net.Dial("tcp", refused.Addr(t))
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
	return get(t, &http.Transport{}, "http://"+refused.Addr(t)+"/")
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

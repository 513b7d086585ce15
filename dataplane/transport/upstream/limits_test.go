package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
)

// limitsServer is a loopback server of h whose handlers are released (release closed) before
// it closes at the end of the test, and a client of it recording metrics on reg.
func limitsServer(t *testing.T, h func(w http.ResponseWriter, r *http.Request, release <-chan struct{})) (*Client, *prometheus.Registry) {
	t.Helper()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h(w, r, release) }))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // first: srv.Close waits for the handlers
	reg := prometheus.NewRegistry()
	c, err := NewClient(srv.URL, TransportOptions{}, 0, observe.Telemetry{Metrics: observe.NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, reg
}

// limitsUpstreamError is err as an *apierror.UpstreamError.
func limitsUpstreamError(t *testing.T, err error) *apierror.UpstreamError {
	t.Helper()
	var up *apierror.UpstreamError
	if !errors.As(err, &up) {
		t.Fatalf("err = %v, want an *apierror.UpstreamError", err)
	}
	return up
}

// upstreamCalls is coordinator_upstream_requests_total{phase, status} on reg.
func upstreamCalls(t *testing.T, reg *prometheus.Registry, phase, status string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "coordinator_upstream_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["phase"] == phase && labels["status"] == status {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// waitSignal fails the test unless ch yields within a (generous) bound.
func waitSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: not within 5s", what)
	}
}

// A body that stalls past the idle timeout fails with ErrIdle, the worker's request is cancelled,
// and the call is recorded once, with its status.
func TestIdleTimeout(t *testing.T) {
	const idle = 50 * time.Millisecond
	tests := []struct {
		name string
		read func(c *Client, r Request) ([]byte, error)
	}{
		{name: "Do", read: func(c *Client, r Request) ([]byte, error) {
			resp, err := c.Do(context.Background(), r)
			if err != nil {
				return nil, fmt.Errorf("Do: %w", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return nil, fmt.Errorf("status %d", resp.StatusCode)
			}
			return io.ReadAll(resp.Body)
		}},
		{name: "Call", read: func(c *Client, r Request) ([]byte, error) { return c.Call(context.Background(), r) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cancelled := make(chan struct{}, 4) // one signal per cancelled request
			c, reg := limitsServer(t, func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				_, _ = io.WriteString(w, "data: part\n\n")
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					cancelled <- struct{}{}
				case <-release:
				}
			})
			start := time.Now()
			b, err := tt.read(c, Request{Method: http.MethodGet, Phase: "decode", IdleTimeout: idle})
			elapsed := time.Since(start)
			if !errors.Is(err, ErrIdle) || errors.Is(err, ErrDeadline) {
				t.Fatalf("read %q, %v; want ErrIdle", b, err)
			}
			if tt.name == "Do" && string(b) != "data: part\n\n" {
				t.Fatalf("read %q before the stall", b)
			}
			if tt.name == "Call" {
				if up := limitsUpstreamError(t, err); up.Phase != "decode" || up.Status != http.StatusOK || b != nil {
					t.Fatalf("Call = %q, %+v", b, up)
				}
			}
			if elapsed < idle/2 || elapsed > idle+2*time.Second {
				t.Fatalf("failed after %v, want about the idle timeout %v", elapsed, idle)
			}
			waitSignal(t, cancelled, "the worker's request context was not cancelled")
			if got := upstreamCalls(t, reg, "decode", "200"); got != 1 {
				t.Fatalf("upstream_requests_total{decode,200} = %v, want 1", got)
			}
		})
	}
}

// The idle timer runs only while a Read waits for the worker: a caller that takes longer than the
// idle timeout between reads of a body already received is not cut off.
func TestIdleTimeoutCountsOnlyReads(t *testing.T) {
	const idle = 40 * time.Millisecond
	const body = "0123456789abcdef"
	c, _ := limitsServer(t, func(w http.ResponseWriter, _ *http.Request, _ <-chan struct{}) {
		// Whole, with its length: it arrives with the headers, so no Read below waits.
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = io.WriteString(w, body)
	})
	resp, err := c.Do(context.Background(), Request{Method: http.MethodGet, Phase: "render", IdleTimeout: idle})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got []byte
	buf := make([]byte, 4)
	gaps := 0
	for {
		n, err := resp.Body.Read(buf)
		got = append(got, buf[:n]...)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read %q, then %v after %d slow gaps", got, err, gaps)
		}
		time.Sleep(idle * 3 / 2) // the caller busy elsewhere, past the idle timeout: what is tested
		gaps++
	}
	if string(got) != body || gaps < 3 {
		t.Fatalf("read %q with %d gaps, want %q with at least 3", got, gaps, body)
	}
}

// The idle timeout does not cover the wait for the answer's headers (Timeout and the transport's
// ResponseHeaderTimeout do).
func TestIdleTimeoutNotBeforeHeaders(t *testing.T) {
	const idle = 20 * time.Millisecond
	c, _ := limitsServer(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		slow := time.NewTimer(3 * idle) // a worker slow to answer: what is tested
		defer slow.Stop()
		select {
		case <-slow.C:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "late")
	})
	b, err := c.Call(context.Background(), Request{Method: http.MethodGet, Phase: "render", IdleTimeout: idle})
	if err != nil || string(b) != "late" {
		t.Fatalf("Call = %q, %v; want late", b, err)
	}
}

// A call past Request.Timeout fails with ErrDeadline, whether the worker is silent or streams.
func TestTimeout(t *testing.T) {
	const timeout = 100 * time.Millisecond
	tests := []struct {
		name string
		// stream has the worker send its headers, then a byte every 5ms.
		stream bool
	}{
		{name: "streaming body", stream: true},
		{name: "no headers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cancelled := make(chan struct{}, 4) // one signal per cancelled request
			c, reg := limitsServer(t, func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
				var tick <-chan time.Time
				if tt.stream {
					w.WriteHeader(http.StatusOK)
					w.(http.Flusher).Flush()
					ticker := time.NewTicker(5 * time.Millisecond)
					defer ticker.Stop()
					tick = ticker.C
				}
				for {
					select {
					case <-r.Context().Done():
						cancelled <- struct{}{}
						return
					case <-release:
						return
					case <-tick:
						_, _ = io.WriteString(w, "x")
						w.(http.Flusher).Flush()
					}
				}
			})
			r := Request{Method: http.MethodGet, Phase: "decode", Timeout: timeout, IdleTimeout: time.Minute}
			start := time.Now()
			resp, err := c.Do(context.Background(), r)
			var n int64
			if err == nil {
				if !tt.stream {
					resp.Body.Close()
					t.Fatalf("Do answered %d", resp.StatusCode)
				}
				n, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			elapsed := time.Since(start)
			if !errors.Is(err, ErrDeadline) || errors.Is(err, ErrIdle) {
				t.Fatalf("err = %v, want ErrDeadline", err)
			}
			if tt.stream && n == 0 {
				t.Fatal("nothing was streamed before the deadline")
			}
			if elapsed < timeout || elapsed > timeout+2*time.Second {
				t.Fatalf("failed after %v, want about the timeout %v", elapsed, timeout)
			}
			waitSignal(t, cancelled, "the worker's request context was not cancelled")
			status := "error"
			if tt.stream {
				status = "200"
			}
			if got := upstreamCalls(t, reg, "decode", status); got != 1 {
				t.Fatalf("upstream_requests_total{decode,%s} = %v, want 1", status, got)
			}
			// Through Call, the same deadline is an *apierror.UpstreamError.
			b, err := c.Call(context.Background(), r)
			up := limitsUpstreamError(t, err)
			wantStatus := 0
			if tt.stream {
				wantStatus = http.StatusOK
			}
			if !errors.Is(err, ErrDeadline) || up.Status != wantStatus || up.Phase != "decode" || b != nil {
				t.Fatalf("Call = %q, %+v; want ErrDeadline with status %d", b, up, wantStatus)
			}
		})
	}
}

func TestMaxResponse(t *testing.T) {
	const limit = 16
	big := strings.Repeat("b", 1<<20)
	tests := []struct {
		name    string
		body    string
		chunked bool
		limit   int64
		tooBig  bool
	}{
		{name: "over by one, Content-Length", body: strings.Repeat("x", limit+1), limit: limit, tooBig: true},
		{name: "over by one, chunked", body: strings.Repeat("x", limit+1), chunked: true, limit: limit, tooBig: true},
		{name: "far over, Content-Length", body: big, limit: limit, tooBig: true},
		{name: "far over, chunked", body: big, chunked: true, limit: limit, tooBig: true},
		{name: "exactly the limit, Content-Length", body: "0123456789abcdef", limit: limit},
		{name: "exactly the limit, chunked", body: "0123456789abcdef", chunked: true, limit: limit},
		{name: "under the limit, chunked", body: "0123456789abcde", chunked: true, limit: limit},
		{name: "empty", body: "", limit: limit},
		{name: "no limit", body: big, chunked: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := limitsServer(t, func(w http.ResponseWriter, _ *http.Request, _ <-chan struct{}) {
				if !tt.chunked {
					w.Header().Set("Content-Length", strconv.Itoa(len(tt.body)))
					_, _ = io.WriteString(w, tt.body)
					return
				}
				_, _ = io.WriteString(w, tt.body[:1]) // flushed before the end: no Content-Length
				w.(http.Flusher).Flush()
				_, _ = io.WriteString(w, tt.body[1:])
			})
			r := Request{Method: http.MethodGet, Phase: "render", MaxResponse: tt.limit}

			// The case is what it says: the answer has a length or is chunked.
			resp, err := c.Do(context.Background(), r)
			if err != nil {
				t.Fatal(err)
			}
			wantLength := int64(len(tt.body))
			if tt.chunked {
				wantLength = -1
			}
			if resp.ContentLength != wantLength {
				t.Fatalf("Content-Length %d, want %d", resp.ContentLength, wantLength)
			}
			Discard(resp)

			b, err := c.Call(context.Background(), r)
			if !tt.tooBig {
				if err != nil || string(b) != tt.body {
					t.Fatalf("Call = %d bytes, %v; want the %d bytes sent", len(b), err, len(tt.body))
				}
				return
			}
			up := limitsUpstreamError(t, err)
			if !errors.Is(err, ErrResponseTooLarge) || up.Status != http.StatusOK || up.Phase != "render" || b != nil {
				t.Fatalf("Call = %d bytes, %+v; want ErrResponseTooLarge", len(b), up)
			}
		})
	}
}

// A failed answer is an *apierror.UpstreamError with its status, Retry-After, content type and
// the start of its body, which Request.MaxResponse does not cut.
func TestErrorOf(t *testing.T) {
	const body = "the pool is overloaded, try later"
	c, _ := limitsServer(t, func(w http.ResponseWriter, _ *http.Request, _ <-chan struct{}) {
		w.Header().Set("Retry-After", "7")
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, body)
	})
	r := Request{Method: http.MethodGet, Phase: "encode[0]", MaxResponse: 16}
	do := func(t *testing.T) *http.Response {
		t.Helper()
		resp, err := c.Do(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	tests := []struct {
		name string
		err  func(t *testing.T) error
	}{
		{name: "Call", err: func(*testing.T) error { _, err := c.Call(context.Background(), r); return err }},
		{name: "ReadOK", err: func(t *testing.T) error { _, err := ReadOK(r.Phase, do(t), r.MaxResponse); return err }},
		{name: "ErrorOf", err: func(t *testing.T) error { return ErrorOf(r.Phase, do(t)) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := limitsUpstreamError(t, tt.err(t))
			if up.Phase != "encode[0]" || up.Status != http.StatusServiceUnavailable || up.RetryAfter != 7*time.Second ||
				up.ContentType != "text/plain" || string(up.Body) != body || up.Err != nil {
				t.Fatalf("error %+v (body %q)", up, up.Body)
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name  string
		value *string
		want  time.Duration
		slack time.Duration
	}{
		{name: "absent", want: 0},
		{name: "empty", value: new(""), want: 0},
		{name: "zero", value: new("0"), want: 0},
		{name: "seconds", value: new("7"), want: 7 * time.Second},
		{name: "negative", value: new("-1"), want: 0},
		{name: "not a number", value: new("abc"), want: 0},
		{name: "fraction", value: new("1.5"), want: 0},
		{name: "a day", value: new("86400"), want: 24 * time.Hour},
		{name: "over a day", value: new("86401"), want: 24 * time.Hour},
		{name: "largest uint32", value: new("4294967295"), want: 24 * time.Hour},
		{name: "huge", value: new("99999999999"), want: 24 * time.Hour},
		{name: "beyond uint64", value: new("999999999999999999999999"), want: 24 * time.Hour},
		// Formatted to the second: +3.5s is between 2.5s and 3.5s away.
		{name: "date in the future", value: new(now.Add(3500 * time.Millisecond).UTC().Format(http.TimeFormat)), want: 3 * time.Second, slack: time.Second},
		{name: "RFC 850 date in the future", value: new(now.Add(3500 * time.Millisecond).UTC().Format(time.RFC850)), want: 3 * time.Second, slack: time.Second},
		{name: "date in the past", value: new(now.Add(-3 * time.Second).UTC().Format(http.TimeFormat)), want: 0},
		{name: "date two days out", value: new(now.Add(48 * time.Hour).UTC().Format(http.TimeFormat)), want: 24 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			if tt.value != nil {
				h.Set("Retry-After", *tt.value)
			}
			got := RetryAfter(h)
			if got < tt.want-tt.slack || got > tt.want+tt.slack {
				t.Fatalf("RetryAfter(%q) = %v, want %v ± %v", h.Get("Retry-After"), got, tt.want, tt.slack)
			}
		})
	}
}

package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/epd-dev/coordinator/dataplane/transport/retry"
)

// ScaleResult is one concurrency-scaling cell: Streams streams held open at once through one
// target, each of Tokens events at the worker's inter-token interval.
type ScaleResult struct {
	Target  string `json:"target"`
	Streams int    `json:"streams"`
	// Open is the most streams that had their first event and not yet their last at once.
	Open int `json:"open"`
	// Completed and Errors count the streams read to their end and those that failed (refused,
	// cut, timed out); ErrorSample is the first failure.
	Completed   int    `json:"completed"`
	Errors      int    `json:"errors"`
	ErrorSample string `json:"error_sample,omitempty"`
	// Events counts the stamped events the client got.
	Events int `json:"events"`
	// IdleRSS and OpenRSS are the proxy's resident set (all its processes) before the streams
	// and at the sample with the most open streams; IdleGoroutines and OpenGoroutines the same
	// for goroutines (-1 when the proxy does not report them: nginx).
	IdleRSS        int64 `json:"idle_rss_bytes"`
	OpenRSS        int64 `json:"open_rss_bytes"`
	IdleGoroutines int   `json:"idle_goroutines"`
	OpenGoroutines int   `json:"open_goroutines"`
	// ProxyCPU is the proxy's CPU time over the cell; CPUPerEvent is it over Events.
	ProxyCPU    time.Duration `json:"proxy_cpu_ns"`
	CPUPerEvent time.Duration `json:"cpu_per_event_ns"`
	// P50 and P99 of each event's arrival at the client minus its send by the worker.
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	// Elapsed is the cell's wall time; Lag is how much longer than Tokens × ITL the slowest
	// complete stream took (the machine falling behind the offered event rate).
	Elapsed time.Duration `json:"elapsed_ns"`
	Lag     time.Duration `json:"lag_ns"`
}

// RSSPerStream is the resident set per open stream above idle, in bytes (0 without open streams).
func (r ScaleResult) RSSPerStream() float64 {
	if r.Open == 0 {
		return 0
	}
	return float64(r.OpenRSS-r.IdleRSS) / float64(r.Open)
}

// GoroutinesPerStream is the goroutines per open stream above idle (-1 when not reported).
func (r ScaleResult) GoroutinesPerStream() float64 {
	if r.Open == 0 || r.OpenGoroutines < 0 {
		return -1
	}
	return float64(r.OpenGoroutines-r.IdleGoroutines) / float64(r.Open)
}

// ScaleOptions configure a scaling cell.
type ScaleOptions struct {
	Streams int
	// Payload is the streaming chat request (max_tokens = Tokens).
	Payload []byte
	Tokens  int
	ITL     time.Duration
	// Ramp spreads the streams' starts (a burst of thousands of connects overflows the accept
	// backlog).
	Ramp time.Duration
	// Timeout bounds the whole cell; streams still open then count as errors.
	Timeout time.Duration
	// Sample reads the proxy's resident set and goroutines; it is called before the streams and
	// every SampleEvery while they run.
	Sample      func() (rss int64, goroutines int)
	SampleEvery time.Duration
	// CPU reads the proxy's CPU time so far.
	CPU func() time.Duration
}

// RaiseFileLimit raises the process's open-file limit to want (or to the hard limit when it may
// not go higher) and returns the limit in effect; children inherit it.
func RaiseFileLimit(want uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur >= want {
		return lim.Cur, nil
	}
	if want > lim.Max {
		// Only a privileged process may raise the hard limit; try, then settle for the hard one.
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: want}); err == nil {
			return want, nil
		}
		want = lim.Max
	}
	lim.Cur = want
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	return want, nil
}

// RunScale opens o.Streams streams against url at once (spread over o.Ramp), reads every one to
// its end recording each event's latency, and samples the proxy while they are open.
func RunScale(ctx context.Context, target, url string, o ScaleOptions) ScaleResult {
	res := ScaleResult{Target: target, Streams: o.Streams, IdleGoroutines: -1, OpenGoroutines: -1}
	res.IdleRSS, res.IdleGoroutines = o.Sample()
	res.OpenRSS, res.OpenGoroutines = res.IdleRSS, res.IdleGoroutines
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: -1, DisableKeepAlives: true, DisableCompression: true,
		DialContext: (&net.Dialer{Timeout: 30 * time.Second}).DialContext}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	var (
		open, maxOpen atomic.Int64
		mu            sync.Mutex
		lat           []time.Duration
		slowest       time.Duration
	)
	sampled := make(chan struct{})
	go func() { // sample at the most open streams
		defer close(sampled)
		t := time.NewTicker(o.SampleEvery)
		defer t.Stop()
		best := int64(0)
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			n := open.Load()
			if n > best {
				rss, g := o.Sample()
				mu.Lock()
				best, res.Open, res.OpenRSS, res.OpenGoroutines = n, int(n), rss, g
				mu.Unlock()
			}
			if n == 0 && best > 0 && open.Load() == 0 && maxOpen.Load() > 0 && ctx.Err() == nil {
				return // every stream is done
			}
		}
	}()
	cpu0, start := o.CPU(), time.Now()
	var wg sync.WaitGroup
	for i := range o.Streams {
		delay := time.Duration(0)
		if o.Streams > 1 {
			delay = o.Ramp * time.Duration(i) / time.Duration(o.Streams-1)
		}
		wg.Go(func() {
			if !retry.Sleep(ctx, delay) {
				return
			}
			t0 := time.Now()
			got, err := scaleStream(ctx, client, url, o.Payload, &open, &maxOpen)
			mu.Lock()
			defer mu.Unlock()
			lat = append(lat, got...)
			if err == nil && len(got) < o.Tokens {
				err = fmt.Errorf("%d events, want %d", len(got), o.Tokens)
			}
			if err != nil {
				res.Errors++
				if res.ErrorSample == "" {
					res.ErrorSample = err.Error()
				}
				return
			}
			res.Completed++
			slowest = max(slowest, time.Since(t0))
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	res.ProxyCPU = o.CPU() - cpu0
	cancel()
	<-sampled
	res.Events = len(lat)
	if res.Events > 0 {
		res.CPUPerEvent = res.ProxyCPU / time.Duration(res.Events)
	}
	res.P50, res.P99 = Summarize(lat)
	res.Lag = max(0, slowest-time.Duration(o.Tokens)*o.ITL)
	return res
}

// scaleStream sends one streaming request and reads its stamped events (ReadStampedStream),
// counting the stream open from its first event to its end.
func scaleStream(ctx context.Context, client *http.Client, url string, payload []byte, open, maxOpen *atomic.Int64) ([]time.Duration, error) {
	resp, err := postStream(ctx, client, url, payload)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	opened := false
	defer func() {
		if opened {
			open.Add(-1)
		}
	}()
	now := func() int64 { // called at each stamp: the first one opens the stream
		if !opened {
			opened = true
			if n := open.Add(1); n > maxOpen.Load() {
				maxOpen.Store(n)
			}
		}
		return time.Now().UnixNano()
	}
	return ReadStampedStream(resp.Body, now)
}

// ParseGoroutines reads a goroutine count: a bare number (the raw proxy) or the go_goroutines
// sample of a Prometheus text exposition (a coordinator's /metrics); -1 when there is none.
func ParseGoroutines(b []byte) int {
	text := strings.TrimSpace(string(b))
	if n, err := strconv.Atoi(text); err == nil {
		return n
	}
	for line := range strings.Lines(text) {
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				return int(f)
			}
		}
	}
	return -1
}

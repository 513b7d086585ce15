package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/epd-dev/coordinator/test/doubles/simworker"
)

// SSEResult is the per-event latency of one path: for every streamed event, the client's arrival
// time minus the worker's send time (both wall clock on the same machine).
type SSEResult struct {
	Target string `json:"target"`
	// Streams and Events count the complete streams and their stamped events (measured window).
	Streams int `json:"streams"`
	Events  int `json:"events"`
	// Errors counts failed or truncated streams, warm-up included; ErrorSample is the first one.
	Errors      int    `json:"errors"`
	ErrorSample string `json:"error_sample,omitempty"`
	// P50 and P99 of arrival − send.
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
}

// SSEOptions configure an SSE latency run.
type SSEOptions struct {
	// Concurrency is the number of streams open at once (closed loop).
	Concurrency int
	// Payload is the streaming chat request.
	Payload []byte
	// Timeout bounds one stream.
	Timeout time.Duration
}

// ParseStamp returns the send time carried by a stamp comment line (simworker's
// EventStampPrefix + decimal Unix nanoseconds, optionally followed by "\n" or "\r\n").
func ParseStamp(line []byte) (int64, bool) {
	rest, ok := bytes.CutPrefix(line, []byte(simworker.EventStampPrefix))
	if !ok {
		return 0, false
	}
	rest = bytes.TrimRight(rest, "\r\n")
	v, err := strconv.ParseInt(string(rest), 10, 64)
	if err != nil || v <= 0 {
		return 0, false
	}
	return v, true
}

// ReadStampedStream reads one SSE body to its end and returns, for each stamped event, its
// latency: now() when the stamp line was read minus the stamp. It fails when the stream does not
// end with "data: [DONE]" or when an event has no stamp.
func ReadStampedStream(r io.Reader, now func() int64) ([]time.Duration, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var lat []time.Duration
	stamped, done := false, false
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			switch {
			case bytes.HasPrefix(line, []byte(simworker.EventStampPrefix)):
				sent, ok := ParseStamp(line)
				if !ok {
					return lat, fmt.Errorf("malformed stamp %q", line)
				}
				lat = append(lat, time.Duration(now()-sent))
				stamped = true
			case bytes.HasPrefix(line, []byte("data:")):
				if !stamped {
					return lat, errors.New("event without a send stamp (is the worker started with --stamp-events?)")
				}
				stamped = false
				done = bytes.Equal(bytes.TrimRight(line, "\r\n"), []byte("data: [DONE]"))
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			return lat, errors.New("SSE line longer than 64 KiB")
		}
		if err == io.EOF {
			if !done {
				return lat, errors.New("truncated stream: no data: [DONE]")
			}
			return lat, nil
		}
		if err != nil {
			return lat, err
		}
	}
}

// SSELoad opens streams against one path in closed loop and measures the latency of every
// event, possibly in several measured slices whose samples add up.
type SSELoad struct {
	target string
	url    string
	opts   SSEOptions
	tr     *http.Transport
	client *http.Client

	mu      sync.Mutex
	lat     []time.Duration
	streams int
	errors  int
	sample  string
}

// NewSSELoad prepares an SSE latency load of target at the base URL url.
func NewSSELoad(target, url string, opts SSEOptions) *SSELoad {
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: opts.Concurrency * 2, DisableCompression: true, IdleConnTimeout: 5 * time.Minute}
	return &SSELoad{target: target, url: url, opts: opts, tr: tr, client: &http.Client{Transport: tr, Timeout: opts.Timeout}}
}

// Close releases the client's connections.
func (l *SSELoad) Close() { l.tr.CloseIdleConnections() }

// Run streams for d with opts.Concurrency streams open at once; a stream started before d ends
// is read to its end. Unless measured, only errors are kept.
func (l *SSELoad) Run(ctx context.Context, d time.Duration, measured bool) {
	now := func() int64 { return time.Now().UnixNano() }
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for range l.opts.Concurrency {
		wg.Go(func() {
			for time.Now().Before(deadline) && ctx.Err() == nil {
				lat, err := stream(ctx, l.client, l.url, l.opts.Payload, now)
				l.mu.Lock()
				if err != nil {
					l.errors++
					if l.sample == "" {
						l.sample = err.Error()
					}
				} else if measured {
					l.streams++
					l.lat = append(l.lat, lat...)
				}
				l.mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// Result summarizes the measured slices so far.
func (l *SSELoad) Result() SSEResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	res := SSEResult{Target: l.target, Streams: l.streams, Events: len(l.lat), Errors: l.errors, ErrorSample: l.sample}
	lat := append([]time.Duration(nil), l.lat...)
	res.P50, res.P99 = Summarize(lat)
	return res
}

// stream sends one streaming request and reads its stamped events.
func stream(ctx context.Context, client *http.Client, url string, payload []byte, now func() int64) ([]time.Duration, error) {
	resp, err := postStream(ctx, client, url, payload)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return ReadStampedStream(resp.Body, now)
}

// postStream sends a streaming chat request and returns its 200 answer (any other status is an
// error carrying the start of the body).
func postStream(ctx context.Context, client *http.Client, url string, payload []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return resp, nil
}

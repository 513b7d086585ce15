package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// LoadOptions configure a closed-loop load.
type LoadOptions struct {
	// Concurrency is the number of workers; each sends its next request when the previous one
	// has completed (its response read to the end).
	Concurrency int
	// Timeout bounds one request.
	Timeout time.Duration
}

// Load drives one cell with vegeta in closed loop, possibly in several measured slices whose
// results add up (so that the cells compared with each other can be interleaved in time). Its
// HTTP client keeps its connections between slices.
type Load struct {
	cell    Cell
	opts    LoadOptions
	tr      *http.Transport
	client  *http.Client
	target  vegeta.Target
	lat     []time.Duration
	all     int // successful requests of the measured slices, ramp and drain included
	elapsed time.Duration
	slices  []float64 // each measured slice's rate
	ramp    time.Duration
	errors  int
	sample  string
}

// NewLoad prepares a load of cell against the base URL url with payload.
func NewLoad(cell Cell, url string, payload []byte, opts LoadOptions) *Load {
	tr := &http.Transport{
		Proxy:               nil,
		MaxIdleConnsPerHost: opts.Concurrency * 2,
		MaxIdleConns:        opts.Concurrency * 2,
		DisableCompression:  true,
		IdleConnTimeout:     5 * time.Minute,
	}
	return &Load{
		cell: cell, opts: opts, tr: tr,
		client: &http.Client{Transport: tr, Timeout: opts.Timeout},
		target: vegeta.Target{Method: http.MethodPost, URL: url + "/v1/chat/completions", Body: payload,
			Header: http.Header{"Content-Type": []string{"application/json"}}},
	}
}

// Close releases the client's connections.
func (l *Load) Close() { l.tr.CloseIdleConnections() }

// Warmup attacks for d without measuring (errors still count) and learns the latency that sizes
// the ramp of each measured slice.
func (l *Load) Warmup(ctx context.Context, d time.Duration) {
	var lat []time.Duration
	l.attack(ctx, d, func(r *vegeta.Result) { lat = append(lat, r.Latency) })
	p50, _ := Summarize(lat)
	l.ramp = RampFor(p50)
}

// RampFor is the unmeasured lead-in of a measured slice for a target answering in p50: two
// latencies (clamped to [200ms, 2s]), so that the workers, which all start at once, have spread
// out and the window sees steady state.
func RampFor(p50 time.Duration) time.Duration {
	return min(max(2*p50, 200*time.Millisecond), 2*time.Second)
}

// Measure runs one measured slice: one continuous attack of ramp + d, of which only the requests
// completed within the last d count (Requests, latencies; the rate is their number over d). The
// ramp and the requests still in flight after d are discarded because a closed loop starting or
// draining is not in steady state: counting them would under-rate slow targets most.
func (l *Load) Measure(ctx context.Context, d time.Duration) {
	if l.ramp == 0 {
		l.ramp = RampFor(0)
	}
	from := time.Now().Add(l.ramp)
	to := from.Add(d)
	n := 0
	l.attack(ctx, l.ramp+d, func(r *vegeta.Result) {
		l.all++
		if end := r.End(); end.After(from) && !end.After(to) {
			l.lat = append(l.lat, r.Latency)
			n++
		}
	})
	l.elapsed += d
	l.slices = append(l.slices, float64(n)/d.Seconds())
}

// attack runs vegeta in closed loop for d (no request starts after d; the ones in flight then
// complete) and passes every successful result to ok.
func (l *Load) attack(ctx context.Context, d time.Duration, ok func(*vegeta.Result)) {
	n := uint64(l.opts.Concurrency)
	atk := vegeta.NewAttacker(vegeta.Client(l.client), vegeta.Workers(n), vegeta.MaxWorkers(n), vegeta.Redirects(vegeta.NoFollow))
	stop := context.AfterFunc(ctx, func() { atk.Stop() })
	defer stop()
	for r := range atk.Attack(vegeta.NewStaticTargeter(l.target), vegeta.Rate{Freq: 0}, d, l.cell.String()) {
		if err := CheckResponse(l.cell.Stream, r); err != nil {
			l.errors++
			if l.sample == "" {
				l.sample = err.Error()
			}
			continue
		}
		ok(r)
	}
}

// Served counts the successful requests of the measured slices, ramps and drains included: the
// work the processes did during them.
func (l *Load) Served() int { return l.all }

// Result summarizes the measured slices so far.
func (l *Load) Result() CellResult {
	res := CellResult{Cell: l.cell, Requests: len(l.lat), Errors: l.errors, ErrorSample: l.sample, Elapsed: l.elapsed,
		SliceRPS: slices.Clone(l.slices)}
	if res.Requests > 0 && res.Elapsed > 0 {
		res.RPS = float64(res.Requests) / res.Elapsed.Seconds()
		lat := append([]time.Duration(nil), l.lat...)
		res.P50, res.P99 = Summarize(lat)
	}
	return res
}

// CheckResponse reports why a load-generator result is not a complete, successful answer: a
// transport error (a stream cut short fails the body read), a non-2xx status, a stream that does
// not end with "data: [DONE]", or a non-streaming body that is not a JSON completion with choices.
func CheckResponse(stream bool, r *vegeta.Result) error {
	if r.Code != 0 && (r.Code < 200 || r.Code > 299) {
		return fmt.Errorf("status %d: %s", r.Code, snippet(r.Body))
	}
	if r.Error != "" {
		return errors.New(r.Error)
	}
	if r.Code == 0 {
		return errors.New("no response")
	}
	body := bytes.TrimRight(r.Body, "\r\n ")
	if stream {
		if !bytes.HasSuffix(body, []byte("data: [DONE]")) {
			return fmt.Errorf("truncated stream (%d bytes, no [DONE]): ...%s", len(r.Body), tail(r.Body))
		}
		return nil
	}
	var v struct {
		Choices []json.RawMessage `json:"choices"`
	}
	if err := json.Unmarshal(body, &v); err != nil || len(v.Choices) == 0 {
		return fmt.Errorf("malformed completion (%d bytes): %s", len(r.Body), snippet(r.Body))
	}
	return nil
}

func snippet(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}

func tail(b []byte) string {
	if len(b) > 80 {
		return string(b[len(b)-80:])
	}
	return string(b)
}

package bench

import (
	"fmt"
	"slices"
	"time"
)

// Target names: the worker itself, the raw proxy in front of it, and the coordinator with each
// pipeline.
const (
	TargetDirect        = "direct"
	TargetRaw           = "raw-proxy"
	TargetDecodeOnly    = "decode-only"
	TargetPrefillDecode = "prefill-decode"
)

// TargetNames lists every target in report order.
var TargetNames = []string{TargetDirect, TargetRaw, TargetNginx, TargetDecodeOnly, TargetPrefillDecode}

// IsCoordinator reports whether target is a coordinator pipeline.
func IsCoordinator(target string) bool {
	return target == TargetDecodeOnly || target == TargetPrefillDecode
}

// Cell identifies one measurement: a target, a body and the stream flag.
type Cell struct {
	Target string `json:"target"`
	Body   string `json:"body"`
	Stream bool   `json:"stream"`
}

// String is "target/body/stream" or "target/body/json".
func (c Cell) String() string { return c.Target + "/" + c.Body + "/" + streamName(c.Stream) }

func streamName(stream bool) string {
	if stream {
		return "stream"
	}
	return "json"
}

// CellResult is the outcome of one cell.
type CellResult struct {
	Cell
	// Requests counts the successful requests completed within the measured window.
	Requests int `json:"requests"`
	// Errors counts failed requests (non-2xx, transport errors, truncated or malformed bodies),
	// warm-up included; ErrorSample is the first one.
	Errors      int    `json:"errors"`
	ErrorSample string `json:"error_sample,omitempty"`
	// Elapsed is the measured window; Requests counts the answers completed within it.
	Elapsed time.Duration `json:"elapsed_ns"`
	// RPS is Requests / Elapsed.
	RPS float64 `json:"rps"`
	// P50 and P99 are the latencies of those requests (sent to last byte read).
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	// ProxyCPU is the CPU time (user + system) the proxy process (raw proxy or coordinator) spent
	// per successful request during the window; WorkerCPU the same for the worker. Zero when not
	// measured.
	ProxyCPU  time.Duration `json:"proxy_cpu_per_req_ns"`
	WorkerCPU time.Duration `json:"worker_cpu_per_req_ns"`
	// OtherLoad is the average number of CPUs busy with anything but the benchmark's processes
	// (the harness included) during the window: other users of a shared box, and steal time. A
	// cell with a high value was disturbed.
	OtherLoad float64 `json:"other_load_cpus"`
	// RatioToRaw is RPS divided by the raw proxy's RPS for the same body and stream (0 when the
	// raw proxy was not measured).
	RatioToRaw float64 `json:"ratio_to_raw"`
	// CPURatioToRaw is the raw proxy's ProxyCPU divided by this target's: the throughput ratio
	// to expect when the proxy process, not the worker, is the bottleneck (0 when unknown).
	CPURatioToRaw float64 `json:"cpu_ratio_to_raw"`
	// RatioToNginx is RPS divided by nginx's RPS for the same body and stream (0 when nginx was
	// not measured).
	RatioToNginx float64 `json:"ratio_to_nginx"`
	// SliceRPS is the rate of each measured slice, in order; SliceRatios each slice's rate over
	// the raw proxy's slice of the same round (interleaved, so they saw the same machine): their
	// spread is the run's own noise on RatioToRaw, which the regression guard uses.
	SliceRPS    []float64 `json:"slice_rps,omitempty"`
	SliceRatios []float64 `json:"slice_ratios_to_raw,omitempty"`
}

// Percentile returns the q-quantile (0 ≤ q ≤ 1) of sorted by the nearest-rank method, or 0 for
// an empty slice.
func Percentile[T ~int64](sorted []T, q float64) T {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(q*float64(len(sorted))+0.999999999) - 1 // ceil(q·n) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}

// Summarize sorts latencies in place and returns their p50 and p99.
func Summarize[T ~int64](latencies []T) (p50, p99 T) {
	slices.Sort(latencies)
	return Percentile(latencies, 0.50), Percentile(latencies, 0.99)
}

// FillRatios sets RatioToRaw and CPURatioToRaw on every result whose body and stream flag have a
// raw-proxy result with a non-zero rate (and CPU time).
func FillRatios(results []CellResult) {
	raw, nginx := map[Cell]CellResult{}, map[Cell]CellResult{}
	for _, r := range results {
		switch r.Target {
		case TargetRaw:
			raw[Cell{Body: r.Body, Stream: r.Stream}] = r
		case TargetNginx:
			nginx[Cell{Body: r.Body, Stream: r.Stream}] = r
		}
	}
	for i := range results {
		r := &results[i]
		r.RatioToRaw, r.CPURatioToRaw, r.RatioToNginx, r.SliceRatios = 0, 0, 0, nil
		if n, ok := nginx[Cell{Body: r.Body, Stream: r.Stream}]; ok && n.RPS > 0 {
			r.RatioToNginx = r.RPS / n.RPS
		}
		base, ok := raw[Cell{Body: r.Body, Stream: r.Stream}]
		if !ok {
			continue
		}
		if base.RPS > 0 {
			r.RatioToRaw = r.RPS / base.RPS
		}
		r.SliceRatios = nil
		if len(base.SliceRPS) == len(r.SliceRPS) {
			for k, b := range base.SliceRPS {
				if b > 0 {
					r.SliceRatios = append(r.SliceRatios, r.SliceRPS[k]/b)
				}
			}
		}
		if base.ProxyCPU > 0 && r.ProxyCPU > 0 {
			r.CPURatioToRaw = float64(base.ProxyCPU) / float64(r.ProxyCPU)
		}
	}
}

// Goal is one of the team's performance targets.
type Goal struct {
	// Name describes the goal, e.g. "decode-only ≥ 0.95× raw proxy at 200B".
	Name string `json:"name"`
	// Observed is the measured value ("0.97×", "42µs"); Met tells whether it meets the goal;
	// Measured is false when the run did not include what the goal needs.
	Observed string `json:"observed"`
	Met      bool   `json:"met"`
	Measured bool   `json:"measured"`
	// Projected is, for a throughput goal, the CPU ratio (CPURatioToRaw) checked against the
	// same bound: the goal's verdict when the proxy rather than the worker is the bottleneck.
	Projected    string `json:"projected,omitempty"`
	ProjectedMet bool   `json:"projected_met,omitempty"`
}

// throughputGoals are the minimum coordinator/raw-proxy throughput ratios per pipeline and body.
var throughputGoals = []struct {
	target, body string
	min          float64
}{
	{TargetDecodeOnly, Body200B, 0.95},
	{TargetDecodeOnly, Body256K, 0.90},
	{TargetDecodeOnly, Body1MiB, 0.90},
	{TargetPrefillDecode, Body1MiB, 0.75},
}

// SSEGoal is the largest acceptable p50 per-event latency the coordinator adds to a stream.
const SSEGoal = 100 * time.Microsecond

// Scale goals (issue 17): memory per open stream above idle at the most streams measured, CPU
// per relayed event against the raw proxy's and the per-event latency added over it at
// ScaleGoalStreams, decode-only's small-request rate against nginx's, and prefill+decode's CPU
// per 256 KiB text request against the raw proxy's.
const (
	ScaleMemoryGoal    = 24 << 10
	ScaleCPUGoal       = 1.2
	ScaleLatencyGoal   = time.Millisecond
	ScaleGoalStreams   = 5000
	NginxRatioGoal     = 0.5
	PrefillTextCPUGoal = 2.0
)

// EvaluateGoals checks the throughput goals (each in both the streaming and non-streaming cells)
// against results (ratios filled) and the SSE goal against sse.
func EvaluateGoals(results []CellResult, sse []SSEResult) []Goal {
	var goals []Goal
	for _, g := range throughputGoals {
		for _, stream := range []bool{false, true} {
			goal := Goal{Name: fmt.Sprintf("%s ≥ %.2f× raw proxy req/s at %s %s", g.target, g.min, g.body, streamName(stream))}
			for _, r := range results {
				if r.Target == g.target && r.Body == g.body && r.Stream == stream && r.RatioToRaw > 0 {
					goal.Measured = true
					goal.Observed = fmt.Sprintf("%.3f×", r.RatioToRaw)
					goal.Met = r.RatioToRaw >= g.min && r.Errors == 0
					if r.Errors > 0 {
						goal.Observed += fmt.Sprintf(" (%d errors)", r.Errors)
					}
					if r.CPURatioToRaw > 0 {
						goal.Projected = fmt.Sprintf("%.3f×", r.CPURatioToRaw)
						goal.ProjectedMet = r.CPURatioToRaw >= g.min
					}
				}
			}
			goals = append(goals, goal)
		}
	}
	for _, stream := range []bool{false, true} {
		goal := Goal{Name: fmt.Sprintf("decode-only ≥ %.1f× nginx req/s at %s %s", NginxRatioGoal, Body200B, streamName(stream))}
		if r, ok := find(results, TargetDecodeOnly, Body200B, stream); ok && r.RatioToNginx > 0 {
			goal.Measured, goal.Observed, goal.Met = true, fmt.Sprintf("%.3f×", r.RatioToNginx), r.RatioToNginx >= NginxRatioGoal && r.Errors == 0
		}
		goals = append(goals, goal)
		goal = Goal{Name: fmt.Sprintf("prefill-decode proxy CPU/req ≤ %.0f× the raw proxy's at %s %s", PrefillTextCPUGoal, Body256K, streamName(stream))}
		if r, ok := find(results, TargetPrefillDecode, Body256K, stream); ok && r.CPURatioToRaw > 0 {
			times := 1 / r.CPURatioToRaw
			goal.Measured, goal.Observed, goal.Met = true, fmt.Sprintf("%.2f×", times), times <= PrefillTextCPUGoal
		}
		goals = append(goals, goal)
	}
	goal := Goal{Name: fmt.Sprintf("SSE per-event latency added by the coordinator (decode-only) < %s at p50", SSEGoal)}
	if added, ok := AddedSSELatency(sse, TargetDecodeOnly); ok {
		goal.Measured = true
		goal.Observed = fmtDur(added)
		goal.Met = added < SSEGoal
	}
	return append(goals, goal)
}

func find(results []CellResult, target, body string, stream bool) (CellResult, bool) {
	for _, r := range results {
		if r.Target == target && r.Body == body && r.Stream == stream {
			return r, true
		}
	}
	return CellResult{}, false
}

// EvaluateScaleGoals checks the concurrency-scaling goals of each coordinator target.
func EvaluateScaleGoals(cells []ScaleResult) []Goal {
	byKey := map[string]ScaleResult{}
	most := map[string]int{}
	for _, c := range cells {
		byKey[fmt.Sprint(c.Target, "/", c.Streams)] = c
		most[c.Target] = max(most[c.Target], c.Streams)
	}
	var goals []Goal
	for _, t := range []string{TargetDecodeOnly, TargetPrefillDecode} {
		n, ok := most[t]
		goal := Goal{Name: fmt.Sprintf("%s memory per open stream ≤ %d KiB above idle at the most streams (10000 asked), no errors", t, ScaleMemoryGoal>>10)}
		if c := byKey[fmt.Sprint(t, "/", n)]; ok && c.Open > 0 {
			goal.Measured = true
			goal.Observed = fmt.Sprintf("%.1f KiB at %d open of %d", c.RSSPerStream()/1024, c.Open, c.Streams)
			goal.Met = c.RSSPerStream() <= ScaleMemoryGoal && c.Errors == 0
			if c.Errors > 0 {
				goal.Observed += fmt.Sprintf(" (%d errors)", c.Errors)
			}
		}
		goals = append(goals, goal)
		c, okT := byKey[fmt.Sprint(t, "/", ScaleGoalStreams)]
		raw, okR := byKey[fmt.Sprint(TargetRaw, "/", ScaleGoalStreams)]
		goal = Goal{Name: fmt.Sprintf("%s CPU per relayed event ≤ %.1f× the raw proxy's at %d streams", t, ScaleCPUGoal, ScaleGoalStreams)}
		if okT && okR && raw.CPUPerEvent > 0 && c.CPUPerEvent > 0 {
			x := float64(c.CPUPerEvent) / float64(raw.CPUPerEvent)
			goal.Measured, goal.Observed, goal.Met = true, fmt.Sprintf("%.2f× (%s against %s)", x, fmtDur(c.CPUPerEvent), fmtDur(raw.CPUPerEvent)), x <= ScaleCPUGoal
		}
		goals = append(goals, goal)
		goal = Goal{Name: fmt.Sprintf("%s per-event latency p99 ≤ %s over the raw proxy's at %d streams", t, ScaleLatencyGoal, ScaleGoalStreams)}
		if okT && okR && c.Events > 0 && raw.Events > 0 {
			added := c.P99 - raw.P99
			goal.Measured, goal.Observed, goal.Met = true, fmt.Sprintf("%s (%s against %s)", fmtDur(added), fmtDur(c.P99), fmtDur(raw.P99)), added <= ScaleLatencyGoal
		}
		goals = append(goals, goal)
	}
	return goals
}

// AddedSSELatency is target's p50 per-event latency minus the direct (no proxy) p50.
func AddedSSELatency(sse []SSEResult, target string) (time.Duration, bool) {
	return sseP50Diff(sse, target, TargetDirect)
}

// sseP50Diff is target's p50 per-event latency minus base's.
func sseP50Diff(sse []SSEResult, target, base string) (time.Duration, bool) {
	var b, t *SSEResult
	for i := range sse {
		switch sse[i].Target {
		case base:
			b = &sse[i]
		case target:
			t = &sse[i]
		}
	}
	if b == nil || t == nil || b.Events == 0 || t.Events == 0 {
		return 0, false
	}
	return t.P50 - b.P50, true
}

// fmtDur formats a latency with three significant digits in µs or ms.
func fmtDur(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < 0:
		return "-" + fmtDur(-d)
	case d < 10*time.Microsecond:
		return fmt.Sprintf("%.1fµs", float64(d)/1e3)
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
}

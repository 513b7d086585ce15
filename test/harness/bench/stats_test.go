package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	tests := []struct {
		in      []time.Duration
		q       float64
		want    time.Duration
		comment string
	}{
		{nil, 0.5, 0, "empty"},
		{[]time.Duration{7}, 0.99, 7, "one sample"},
		{[]time.Duration{1, 2, 3, 4}, 0.5, 2, "nearest rank: ceil(0.5·4) = 2nd"},
		{[]time.Duration{1, 2, 3, 4, 5}, 0.5, 3, "odd count: the median"},
		{[]time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0.99, 10, "ceil(9.9) = 10th"},
		{[]time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0.9, 9, "exact rank"},
		{[]time.Duration{1, 2, 3}, 0, 1, "q=0 is the minimum"},
		{[]time.Duration{1, 2, 3}, 1, 3, "q=1 is the maximum"},
	}
	for _, tt := range tests {
		if got := Percentile(tt.in, tt.q); got != tt.want {
			t.Errorf("%s: Percentile(%v, %v) = %v, want %v", tt.comment, tt.in, tt.q, got, tt.want)
		}
	}
	lat := make([]time.Duration, 0, 1000)
	for i := 1000; i >= 1; i-- { // unsorted on purpose
		lat = append(lat, time.Duration(i))
	}
	if p50, p99 := Summarize(lat); p50 != 500 || p99 != 990 {
		t.Errorf("Summarize = %v, %v; want 500, 990", p50, p99)
	}
}

func cells() []CellResult {
	return []CellResult{
		{Cell: Cell{TargetRaw, Body200B, false}, RPS: 1000, ProxyCPU: 100 * time.Microsecond},
		{Cell: Cell{TargetDecodeOnly, Body200B, false}, RPS: 960, ProxyCPU: 125 * time.Microsecond},
		{Cell: Cell{TargetDecodeOnly, Body200B, true}, RPS: 500, ProxyCPU: 100 * time.Microsecond}, // no raw stream cell
		{Cell: Cell{TargetRaw, Body1MiB, false}, RPS: 40, ProxyCPU: time.Millisecond},
		{Cell: Cell{TargetDecodeOnly, Body1MiB, false}, RPS: 35, ProxyCPU: 2 * time.Millisecond, Errors: 1},
		{Cell: Cell{TargetPrefillDecode, Body1MiB, false}, RPS: 32, ProxyCPU: time.Millisecond},
		{Cell: Cell{TargetDirect, Body1MiB, false}, RPS: 50},
	}
}

func TestFillRatios(t *testing.T) {
	rs := cells()
	FillRatios(rs)
	want := []struct{ ratio, cpu float64 }{{1, 1}, {0.96, 0.8}, {0, 0}, {1, 1}, {0.875, 0.5}, {0.8, 1}, {1.25, 0}}
	for i, w := range want {
		if d := rs[i].RatioToRaw - w.ratio; d > 1e-9 || d < -1e-9 {
			t.Errorf("%s: RatioToRaw = %v, want %v", rs[i].Cell, rs[i].RatioToRaw, w.ratio)
		}
		if d := rs[i].CPURatioToRaw - w.cpu; d > 1e-9 || d < -1e-9 {
			t.Errorf("%s: CPURatioToRaw = %v, want %v", rs[i].Cell, rs[i].CPURatioToRaw, w.cpu)
		}
	}
}

func TestEvaluateGoals(t *testing.T) {
	rs := cells()
	FillRatios(rs)
	sse := []SSEResult{
		{Target: TargetDirect, Events: 10, P50: 50 * time.Microsecond},
		{Target: TargetRaw, Events: 10, P50: 120 * time.Microsecond},
		{Target: TargetDecodeOnly, Events: 10, P50: 130 * time.Microsecond},
	}
	goals := EvaluateGoals(rs, sse)
	byName := map[string]Goal{}
	for _, g := range goals {
		byName[g.Name] = g
	}
	if len(goals) != 13 {
		t.Fatalf("%d goals, want 4 throughput goals × 2 modes, nginx and prefill-text CPU × 2 modes, SSE", len(goals))
	}
	check := func(name string, measured, met bool, observed string) {
		t.Helper()
		g, ok := byName[name]
		if !ok {
			t.Fatalf("no goal %q in %+v", name, goals)
		}
		if g.Measured != measured || g.Met != met || g.Observed != observed {
			t.Errorf("%s = %+v, want measured %v met %v observed %q", name, g, measured, met, observed)
		}
	}
	check("decode-only ≥ 0.95× raw proxy req/s at 200B json", true, true, "0.960×")
	check("decode-only ≥ 0.95× raw proxy req/s at 200B stream", false, false, "")
	check("decode-only ≥ 0.90× raw proxy req/s at 1MiB-image json", true, false, "0.875× (1 errors)")
	check("prefill-decode ≥ 0.75× raw proxy req/s at 1MiB-image json", true, true, "0.800×")
	check("decode-only ≥ 0.90× raw proxy req/s at 256KiB-text json", false, false, "")
	check("SSE per-event latency added by the coordinator (decode-only) < 100µs at p50", true, true, "80µs")
	if g := byName["decode-only ≥ 0.95× raw proxy req/s at 200B json"]; g.Projected != "0.800×" || g.ProjectedMet {
		t.Errorf("projection %+v, want 0.800× not met", g)
	}

	// An errored cell never meets its goal, and the SSE goal fails past 100µs.
	sse[2].P50 = 200 * time.Microsecond
	for _, g := range EvaluateGoals(rs, sse) {
		if strings.HasPrefix(g.Name, "SSE") && (g.Met || g.Observed != "150µs") {
			t.Errorf("SSE goal %+v", g)
		}
	}
	if d, ok := sseP50Diff(sse, TargetDecodeOnly, TargetRaw); !ok || d != 80*time.Microsecond {
		t.Errorf("over raw = %v, %v", d, ok)
	}
	if _, ok := AddedSSELatency(sse[:1], TargetDecodeOnly); ok {
		t.Error("added latency without the target's result")
	}
}

func TestFmtDur(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0", 4500: "4.5µs", 42 * time.Microsecond: "42µs", -42 * time.Microsecond: "-42µs",
		1500 * time.Microsecond: "1.50ms", 2 * time.Second: "2.00s",
	} {
		if got := fmtDur(d); got != want {
			t.Errorf("fmtDur(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestWriteMarkdown(t *testing.T) {
	rs := cells()
	rs[4].ErrorSample = "status 502: a|b\nc"
	FillRatios(rs)
	sse := []SSEResult{{Target: TargetDirect, Events: 10, P50: 50 * time.Microsecond}, {Target: TargetRaw, Events: 10, P50: 90 * time.Microsecond},
		{Target: TargetDecodeOnly, Events: 10, P50: 100 * time.Microsecond}}
	r := &Report{Started: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC), Machine: "test box", Cells: rs, SSE: sse,
		PeakRSS: map[string]int64{"coordinator decode-only": 64 << 20}, Micro: []MicroResult{{Name: "BenchmarkX/y", NsPerOp: 10, BytesPerOp: 5, AllocsOp: 1}},
		Settings: Settings{Concurrency: 16, Slices: 4, Duration: 8 * time.Second, Warmup: 2 * time.Second}}
	r.Goals = EvaluateGoals(rs, sse)
	var b bytes.Buffer
	r.WriteMarkdown(&b)
	out := b.String()
	for _, want := range []string{
		"| decode-only | 200B | json | 960 | 0.960 | — | 0 | 0 | 125µs | 0.800 | — | 0.00 | 0 |",
		"| decode-only | 1MiB-image | json | 35 | 0.875 |",
		"**1** (status 502: a\\|b c)",
		"| coordinator decode-only | 64.0 MiB | — |",
		"| decode-only | 0 | 10 | 100µs | 0 | 50µs | 10µs | 0 |",
		"| X/y | 10 | 0.0 | 5 | 1 |",
		"| prefill-decode ≥ 0.75× raw proxy req/s at 1MiB-image json | 0.800× | yes | 1.000× | yes |",
		"| decode-only ≥ 0.90× raw proxy req/s at 256KiB-text json | — | not measured | — | — |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if r.Errors() != 1 {
		t.Errorf("Errors() = %d", r.Errors())
	}
}

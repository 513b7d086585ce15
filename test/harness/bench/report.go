package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Report is everything one harness run measured.
type Report struct {
	// Started is when the run began; Machine describes where (CPUs, load).
	Started time.Time `json:"started"`
	Machine string    `json:"machine"`
	// Revision is the source tree measured (git describe --always --dirty).
	Revision string `json:"revision"`
	// Settings echoes the flags that shape the numbers.
	Settings Settings `json:"settings"`
	// Cells are the throughput/latency cells, ratios filled.
	Cells []CellResult `json:"cells"`
	// PeakRSS is VmHWM in bytes per process name ("coordinator decode-only", "raw-proxy", ...).
	PeakRSS map[string]int64 `json:"peak_rss_bytes"`
	// RestRSS is VmRSS in bytes per process name 8 s after the load ended; RestAnonRSS the
	// anonymous part of it (RssAnon: what the process holds, not its binary's pages).
	RestRSS     map[string]int64 `json:"rest_rss_bytes"`
	RestAnonRSS map[string]int64 `json:"rest_anon_rss_bytes"`
	// SSE is the per-event latency per path.
	SSE []SSEResult `json:"sse"`
	// Scale are the concurrency-scaling cells; FileLimit the open-file limit they ran under.
	Scale     []ScaleResult `json:"scale"`
	FileLimit uint64        `json:"file_limit"`
	// Notes are things the run could not do (a target not installed, a limit lowered).
	Notes []string `json:"notes,omitempty"`
	// Micro are the Go micro-benchmarks; MicroErr is set when they failed.
	Micro    []MicroResult `json:"micro"`
	MicroErr string        `json:"micro_error,omitempty"`
	// Goals are the team's targets, checked.
	Goals []Goal `json:"goals"`
	// Baseline is the stored run the guard compared with (nil: none read); Guard its checks.
	Baseline *Baseline    `json:"baseline,omitempty"`
	Guard    []GuardCheck `json:"guard,omitempty"`
}

// Settings are the run parameters.
type Settings struct {
	Concurrency    int           `json:"concurrency"`
	Slices         int           `json:"slices"`
	Warmup         time.Duration `json:"warmup_ns"`
	Duration       time.Duration `json:"duration_ns"`
	SSEConcurrency int           `json:"sse_concurrency"`
	SSEDuration    time.Duration `json:"sse_duration_ns"`
	SSEITL         time.Duration `json:"sse_itl_ns"`
	SSETokens      int           `json:"sse_tokens"`
	ScaleTokens    int           `json:"scale_tokens"`
	ScaleITL       time.Duration `json:"scale_itl_ns"`
}

// Errors is the total number of failed requests and streams.
func (r *Report) Errors() int {
	n := 0
	for _, c := range r.Cells {
		n += c.Errors
	}
	for _, s := range r.SSE {
		n += s.Errors
	}
	for _, s := range r.Scale {
		n += s.Errors
	}
	return n
}

// WriteMarkdown renders the report as Markdown tables.
func (r *Report) WriteMarkdown(w io.Writer) {
	s := r.Settings
	fmt.Fprintf(w, "## Results %s\n\n", r.Started.Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(w, "Source: %s. Machine: %s.\n\nClosed loop, concurrency %d; per cell %s warm-up, then %s measured in %d slices interleaved round-robin with the other targets of the same body and mode.\n\n",
		orDash(r.Revision), r.Machine, s.Concurrency, s.Warmup, s.Duration, s.Slices)

	for _, n := range r.Notes {
		fmt.Fprintf(w, "- %s\n", n)
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "### Throughput and latency")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "`×raw` = req/s ÷ the raw proxy's req/s for the same body and mode. `proxy CPU/req` = CPU time (user+sys) of the proxy process (raw proxy or coordinator) per request; `CPU ×raw` = the raw proxy's CPU/req ÷ this one's (the throughput ratio when the proxy, not the worker, is the bottleneck); `worker CPU/req` = the simworker's CPU time per request; `other load` = CPUs busy with anything but the benchmark (other users of the box, steal) during the cell, out of the machine's CPUs.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target | body | mode | req/s | ×raw | ×nginx | p50 | p99 | proxy CPU/req | CPU ×raw | worker CPU/req | other load | errors |")
	fmt.Fprintln(w, "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, c := range r.Cells {
		ratio := "—"
		if c.RatioToRaw > 0 {
			ratio = fmt.Sprintf("%.3f", c.RatioToRaw)
		}
		cpuRatio := "—"
		if c.CPURatioToRaw > 0 {
			cpuRatio = fmt.Sprintf("%.3f", c.CPURatioToRaw)
		}
		proxyCPU := "—"
		if c.ProxyCPU > 0 {
			proxyCPU = fmtDur(c.ProxyCPU)
		}
		workerCPU := "—"
		if c.WorkerCPU > 0 {
			workerCPU = fmtDur(c.WorkerCPU)
		}
		nginx := "—"
		if c.RatioToNginx > 0 {
			nginx = fmt.Sprintf("%.3f", c.RatioToNginx)
		}
		errs := fmt.Sprint(c.Errors)
		if c.Errors > 0 {
			errs = fmt.Sprintf("**%d** (%s)", c.Errors, mdEscape(c.ErrorSample, 80))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %.2f | %s |\n", c.Target, c.Body, streamName(c.Stream),
			c.RPS, ratio, nginx, fmtDur(c.P50), fmtDur(c.P99), proxyCPU, cpuRatio, workerCPU, c.OtherLoad, errs)
	}
	fmt.Fprintln(w)

	if len(r.PeakRSS) > 0 {
		fmt.Fprintln(w, "### Peak RSS (VmHWM) after the load, and RSS at rest (8 s later)")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "`anonymous`: RssAnon, what the process holds (heap, stacks, buffers) without the pages of its binary, which the page cache shares and can drop.")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| process | peak RSS | at rest | at rest, anonymous |")
		fmt.Fprintln(w, "|---|--:|--:|--:|")
		names := make([]string, 0, len(r.PeakRSS))
		for n := range r.PeakRSS {
			names = append(names, n)
		}
		slices.Sort(names)
		mib := func(m map[string]int64, n string) string {
			if v, ok := m[n]; ok {
				return fmt.Sprintf("%.1f MiB", float64(v)/(1<<20))
			}
			return "—"
		}
		for _, n := range names {
			fmt.Fprintf(w, "| %s | %.1f MiB | %s | %s |\n", n, float64(r.PeakRSS[n])/(1<<20), mib(r.RestRSS, n), mib(r.RestAnonRSS, n))
		}
		fmt.Fprintln(w)
	}

	if len(r.SSE) > 0 {
		fmt.Fprintln(w, "### SSE per-event latency")
		fmt.Fprintln(w)
		fmt.Fprintf(w, "Arrival at the client − send time stamped by the worker, per event; %d concurrent streams of %d tokens, ITL %s, %s measured per path in %d interleaved slices.\n\n",
			s.SSEConcurrency, s.SSETokens, s.SSEITL, s.SSEDuration, s.Slices)
		fmt.Fprintln(w, "| path | streams | events | p50 | p99 | added p50 vs direct | added p50 vs raw proxy | errors |")
		fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|--:|")
		for _, e := range r.SSE {
			added, overRaw := "—", "—"
			if e.Target != TargetDirect {
				if d, ok := AddedSSELatency(r.SSE, e.Target); ok {
					added = fmtDur(d)
				}
			}
			if IsCoordinator(e.Target) {
				if d, ok := sseP50Diff(r.SSE, e.Target, TargetRaw); ok {
					overRaw = fmtDur(d)
				}
			}
			errs := fmt.Sprint(e.Errors)
			if e.Errors > 0 {
				errs = fmt.Sprintf("**%d** (%s)", e.Errors, mdEscape(e.ErrorSample, 80))
			}
			fmt.Fprintf(w, "| %s | %d | %d | %s | %s | %s | %s | %s |\n", e.Target, e.Streams, e.Events, fmtDur(e.P50), fmtDur(e.P99), added, overRaw, errs)
		}
		fmt.Fprintln(w)
	}

	if len(r.Scale) > 0 {
		r.writeScale(w)
	}

	if len(r.Micro) > 0 || r.MicroErr != "" {
		fmt.Fprintln(w, "### Go micro-benchmarks (`go test -bench . -benchmem ./dataplane/...`)")
		fmt.Fprintln(w)
		if r.MicroErr != "" {
			fmt.Fprintf(w, "**failed**: %s\n\n", mdEscape(r.MicroErr, 300))
		}
		if len(r.Micro) > 0 {
			fmt.Fprintln(w, "| benchmark | ns/op | MB/s | B/op | allocs/op |")
			fmt.Fprintln(w, "|---|--:|--:|--:|--:|")
			for _, m := range r.Micro {
				fmt.Fprintf(w, "| %s | %.0f | %.1f | %.0f | %.0f |\n", strings.TrimPrefix(m.Name, "Benchmark"), m.NsPerOp, m.MBPerS, m.BytesPerOp, m.AllocsOp)
			}
			fmt.Fprintln(w)
		}
	}

	if len(r.Goals) > 0 {
		fmt.Fprintln(w, "### Targets")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "As run: the measured ratio on this box. Proxy-bound: the CPU ratio (`CPU ×raw`) against the same bound.")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| target | as run | met | proxy-bound | met |")
		fmt.Fprintln(w, "|---|--:|:-:|--:|:-:|")
		verdict := func(measured, met bool) string {
			switch {
			case measured && met:
				return "yes"
			case measured:
				return "**NO**"
			}
			return "not measured"
		}
		for _, g := range r.Goals {
			obs, proj, projMet := orDash(g.Observed), orDash(g.Projected), "—"
			if g.Projected != "" {
				projMet = verdict(true, g.ProjectedMet)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", g.Name, obs, verdict(g.Measured, g.Met), proj, projMet)
		}
		fmt.Fprintln(w)
	}
	writeGuard(w, r.Baseline, r.Guard)
}

// mdEscape shortens s to n bytes and keeps it inside one table cell.
func mdEscape(s string, n int) string {
	s = strings.NewReplacer("|", "\\|", "\n", " ", "\r", " ").Replace(s)
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// writeScale renders the concurrency-scaling cells.
func (r *Report) writeScale(w io.Writer) {
	fmt.Fprintln(w, "### Concurrency scaling: open streams")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Each stream: %d tokens, one event every %s, all streams opened together (open-file limit %d). `RSS/stream` and `goroutines/stream`: the proxy's (all its processes') resident set and goroutines at the most open streams, above idle, per open stream. `CPU/event`: the proxy's CPU time over the cell per relayed event. Latency: each event's arrival at the client − its send by the worker. `lag`: how much longer than %d × %s the slowest stream took (the box falling behind the offered event rate).\n\n",
		r.Settings.ScaleTokens, r.Settings.ScaleITL, r.FileLimit, r.Settings.ScaleTokens, r.Settings.ScaleITL)
	fmt.Fprintln(w, "| target | streams | open | events | RSS/stream | goroutines/stream | CPU/event | CPU ×raw | p50 | p99 | p99 over raw | lag | errors |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	raw := map[int]ScaleResult{}
	for _, c := range r.Scale {
		if c.Target == TargetRaw {
			raw[c.Streams] = c
		}
	}
	for _, c := range r.Scale {
		g := "—"
		if v := c.GoroutinesPerStream(); v >= 0 {
			g = fmt.Sprintf("%.2f", v)
		}
		cpuX, overRaw := "—", "—"
		if b, ok := raw[c.Streams]; ok && c.Target != TargetRaw {
			if b.CPUPerEvent > 0 && c.CPUPerEvent > 0 {
				cpuX = fmt.Sprintf("%.2f", float64(c.CPUPerEvent)/float64(b.CPUPerEvent))
			}
			if b.Events > 0 && c.Events > 0 {
				overRaw = fmtDur(c.P99 - b.P99)
			}
		}
		errs := fmt.Sprint(c.Errors)
		if c.Errors > 0 {
			errs = fmt.Sprintf("**%d** (%s)", c.Errors, mdEscape(c.ErrorSample, 80))
		}
		fmt.Fprintf(w, "| %s | %d | %d | %d | %.1f KiB | %s | %s | %s | %s | %s | %s | %s | %s |\n", c.Target, c.Streams, c.Open, c.Events,
			c.RSSPerStream()/1024, g, fmtDur(c.CPUPerEvent), cpuX, fmtDur(c.P50), fmtDur(c.P99), overRaw, fmtDur(c.Lag), errs)
	}
	fmt.Fprintln(w)
}

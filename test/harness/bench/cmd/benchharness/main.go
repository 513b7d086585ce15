// Command benchharness runs the coordinator's end-to-end benchmark (docs/benchmarks.md): it builds
// the coordinator, the simworker and the raw proxy, starts them as separate processes on loopback,
// drives each target with a closed-loop load generator, measures SSE per-event latency, runs the
// Go micro-benchmarks, and prints one report (also written to --out as results.md and
// results.json). It exits 1 when any request failed, and with --strict also when a target is not
// met.
//
//	go run ./test/harness/bench/cmd/benchharness --duration 8s --warmup 2s --concurrency 16
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/epd-dev/coordinator/dataplane/transport/retry"
	"github.com/epd-dev/coordinator/test/harness/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type options struct {
	repo, out, binDir              string
	concurrency, slices            int
	warmup, duration, timeout      time.Duration
	targets, bodies, modes         []string
	sseTargets                     []string
	sseConcurrency, sseTokens      int
	sseWarmup, sseDuration, sseITL time.Duration
	micro                          bool
	microBenchtime                 string
	microPkgs                      []string
	profile                        []string
	profileDuration                time.Duration
	strict                         bool
	baseline                       string
	writeBaseline                  bool
	scaleStreams                   []int
	scaleTargets                   []string
	scaleTokens                    int
	scaleITL, scaleRamp            time.Duration
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	var targets, bodies, modes, sseTargets, microPkgs, profile, scaleStreams, scaleTargets string
	fs := flag.NewFlagSet("benchharness", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.repo, "repo", "", "module root (default: found from the working directory)")
	fs.StringVar(&o.out, "out", "", "results directory (default <repo>/bin/bench/<timestamp>)")
	fs.StringVar(&o.binDir, "bin-dir", "", "use the coordinator, simworker and rawproxy binaries in this directory instead of building them")
	fs.IntVar(&o.concurrency, "concurrency", 16, "closed-loop workers per cell")
	fs.DurationVar(&o.warmup, "warmup", 2*time.Second, "warm-up per cell (not measured)")
	fs.DurationVar(&o.duration, "duration", 8*time.Second, "measured window per cell (and per SSE path), split into --slices")
	fs.IntVar(&o.slices, "slices", 4, "measured slices per cell, interleaved round-robin with the other targets of the same body and mode")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Second, "bound on one request")
	fs.StringVar(&targets, "targets", "raw-proxy,nginx,decode-only,prefill-decode", "throughput targets: direct, raw-proxy, nginx (skipped when not installed), decode-only, prefill-decode")
	fs.StringVar(&bodies, "bodies", strings.Join(bench.BodyNames, ","), "bodies: 200B, 256KiB-text, 1MiB-image")
	fs.StringVar(&modes, "modes", "json,stream", "response modes: json (non-streaming), stream")
	fs.StringVar(&sseTargets, "sse-targets", "direct,raw-proxy,decode-only,prefill-decode", "SSE latency paths (empty: skip the SSE run)")
	fs.IntVar(&o.sseConcurrency, "sse-concurrency", 8, "concurrent streams in the SSE run")
	fs.IntVar(&o.sseTokens, "sse-tokens", 64, "tokens per stream in the SSE run")
	fs.DurationVar(&o.sseITL, "sse-itl", 5*time.Millisecond, "the SSE worker's inter-token latency")
	fs.DurationVar(&o.sseWarmup, "sse-warmup", time.Second, "warm-up per SSE path")
	fs.DurationVar(&o.sseDuration, "sse-duration", 4*time.Second, "measured window per SSE path, split into --slices")
	fs.BoolVar(&o.micro, "micro", true, "run the Go micro-benchmarks first")
	fs.StringVar(&o.microBenchtime, "micro-benchtime", "1s", "-benchtime of the micro-benchmarks")
	fs.StringVar(&microPkgs, "micro-pkgs", "./dataplane/...,./test/suites/renderref", "packages of the micro-benchmarks (./test/suites/renderref: render in process against the HTTP render service)")
	fs.StringVar(&profile, "profile", "", "cells to CPU-profile with perf after the table run, e.g. decode-only/1MiB-image/json (comma-separated)")
	fs.DurationVar(&o.profileDuration, "profile-duration", 10*time.Second, "measured window of a profiled cell")
	fs.BoolVar(&o.strict, "strict", false, "exit 1 when a target is not met or the regression guard flags a cell")
	fs.StringVar(&o.baseline, "baseline", "test/harness/bench/baseline.json", "the regression guard's stored run (relative to --repo; empty: no guard)")
	fs.BoolVar(&o.writeBaseline, "write-baseline", false, "write this run's coordinator cells to --baseline instead of comparing with it")
	fs.StringVar(&scaleStreams, "scale-streams", "100,1000,5000,10000", "concurrency-scaling cells: streams held open at once (empty: skip)")
	fs.StringVar(&scaleTargets, "scale-targets", "raw-proxy,nginx,decode-only,prefill-decode", "concurrency-scaling targets")
	fs.IntVar(&o.scaleTokens, "scale-tokens", 200, "tokens per stream in the scaling cells")
	fs.DurationVar(&o.scaleITL, "scale-itl", 20*time.Millisecond, "the scaling worker's inter-token interval")
	fs.DurationVar(&o.scaleRamp, "scale-ramp", 2*time.Second, "the scaling cells open their streams over this long")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	o.targets, o.bodies, o.modes = split(targets), split(bodies), split(modes)
	o.sseTargets, o.microPkgs, o.profile = split(sseTargets), split(microPkgs), split(profile)
	o.scaleTargets = split(scaleTargets)
	var errs []error
	for _, f := range split(scaleStreams) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("--scale-streams: %q is not a positive number", f))
			continue
		}
		o.scaleStreams = append(o.scaleStreams, n)
	}
	if slices.Contains(o.sseTargets, bench.TargetNginx) {
		errs = append(errs, errors.New("nginx is not an SSE latency path (it runs in the throughput and scaling cells)"))
	}
	for _, t := range o.scaleTargets {
		if t == bench.TargetDirect || !slices.Contains(bench.TargetNames, t) {
			errs = append(errs, fmt.Errorf("unknown scale target %q (want raw-proxy, nginx, decode-only or prefill-decode)", t))
		}
	}
	for _, t := range append(slices.Clone(o.targets), o.sseTargets...) {

		if !slices.Contains(bench.TargetNames, t) {
			errs = append(errs, fmt.Errorf("unknown target %q (want one of %v)", t, bench.TargetNames))
		}
	}
	for _, b := range o.bodies {
		if !slices.Contains(bench.BodyNames, b) {
			errs = append(errs, fmt.Errorf("unknown body %q (want one of %v)", b, bench.BodyNames))
		}
	}
	for _, m := range o.modes {
		if m != "json" && m != "stream" {
			errs = append(errs, fmt.Errorf("unknown mode %q (want json or stream)", m))
		}
	}
	for _, p := range o.profile {
		c, err := parseCell(p)
		if err == nil && !bench.IsCoordinator(c.Target) && c.Target != bench.TargetRaw && c.Target != bench.TargetNginx {
			err = fmt.Errorf("profile cell %q: only raw-proxy, nginx and coordinator targets can be profiled", p)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if o.concurrency < 1 || o.sseConcurrency < 1 || o.slices < 1 || o.duration <= 0 || o.sseDuration <= 0 || o.sseTokens < 1 || o.scaleTokens < 1 || o.scaleITL <= 0 {
		errs = append(errs, errors.New("concurrency, durations and tokens must be positive"))
	}
	return o, errors.Join(errs...)
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// parseCell parses "target/body/json|stream".
func parseCell(s string) (bench.Cell, error) {
	f := strings.Split(s, "/")
	if len(f) != 3 || !slices.Contains(bench.TargetNames, f[0]) || !slices.Contains(bench.BodyNames, f[1]) || (f[2] != "json" && f[2] != "stream") {
		return bench.Cell{}, fmt.Errorf("cell %q: want target/body/json|stream, e.g. decode-only/1MiB-image/json", s)
	}
	return bench.Cell{Target: f[0], Body: f[1], Stream: f[2] == "stream"}, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "benchharness:", err)
		return 2
	}
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "benchharness: "+format+"\n", a...) }
	if o.repo == "" {
		if o.repo, err = findRepo(); err != nil {
			logf("%v", err)
			return 2
		}
	}
	started := time.Now()
	if o.out == "" {
		o.out = filepath.Join(o.repo, "bin", "bench", started.Format("20060102-150405"))
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		logf("%v", err)
		return 1
	}
	rep := &bench.Report{Started: started, Machine: machine(), Revision: revision(o.repo), PeakRSS: map[string]int64{}, RestRSS: map[string]int64{}, RestAnonRSS: map[string]int64{}, Settings: bench.Settings{
		Concurrency: o.concurrency, Slices: o.slices, Warmup: o.warmup, Duration: o.duration, SSEConcurrency: o.sseConcurrency,
		SSEDuration: o.sseDuration, SSEITL: o.sseITL, SSETokens: o.sseTokens, ScaleTokens: o.scaleTokens, ScaleITL: o.scaleITL,
	}}
	if bench.NginxBinary() == "" && (slices.Contains(o.targets, bench.TargetNginx) || slices.Contains(o.scaleTargets, bench.TargetNginx)) {
		rep.Notes = append(rep.Notes, "nginx is not installed: its cells are skipped (Debian: apt-get install nginx-light)")
		logf("nginx is not installed: skipping its cells (apt-get install nginx-light)")
		drop := func(t string) bool { return t == bench.TargetNginx }
		o.targets, o.scaleTargets = slices.DeleteFunc(o.targets, drop), slices.DeleteFunc(o.scaleTargets, drop)
	}

	var bins bench.Binaries
	if o.binDir != "" {
		bins = bench.Binaries{Coordinator: filepath.Join(o.binDir, "coordinator"), Simworker: filepath.Join(o.binDir, "simworker"),
			RawProxy: filepath.Join(o.binDir, "rawproxy")}
	} else {
		logf("building the coordinator, simworker and rawproxy into %s", filepath.Join(o.out, "bin"))
		if bins, err = bench.Build(ctx, o.repo, filepath.Join(o.out, "bin")); err != nil {
			logf("%v", err)
			return 1
		}
	}

	if o.micro {
		logf("running the Go micro-benchmarks (%s)", strings.Join(o.microPkgs, " "))
		rep.Micro, err = bench.RunMicro(ctx, o.repo, o.microBenchtime, filepath.Join(o.out, "micro.txt"), o.microPkgs)
		if err != nil {
			rep.MicroErr = err.Error()
			logf("micro-benchmarks failed: %v", err)
		}
	}

	bodies := bench.Bodies()
	if len(o.targets) > 0 && len(o.bodies) > 0 && len(o.modes) > 0 && ctx.Err() == nil {
		if err := throughput(ctx, o, bins, bodies, rep, logf); err != nil {
			logf("%v", err)
			return 1
		}
	}
	if len(o.sseTargets) > 0 && ctx.Err() == nil {
		if err := sse(ctx, o, bins, rep, logf); err != nil {
			logf("%v", err)
			return 1
		}
	}
	if len(o.scaleStreams) > 0 && len(o.scaleTargets) > 0 && ctx.Err() == nil {
		if err := scale(ctx, o, bins, rep, logf); err != nil {
			logf("%v", err)
			return 1
		}
	}
	if ctx.Err() != nil {
		logf("interrupted")
		return 1
	}

	bench.FillRatios(rep.Cells)
	rep.Goals = append(bench.EvaluateGoals(rep.Cells, rep.SSE), bench.EvaluateScaleGoals(rep.Scale)...)
	baselinePath := o.baseline
	if baselinePath != "" && !filepath.IsAbs(baselinePath) {
		baselinePath = filepath.Join(o.repo, baselinePath)
	}
	switch {
	case baselinePath == "":
	case o.writeBaseline:
		b := bench.NewBaseline(rep.Cells, rep.Revision, rep.Machine, o.concurrency, rep.Started)
		if err := bench.WriteBaseline(baselinePath, b); err != nil {
			logf("%v", err)
			return 1
		}
		logf("baseline written: %s (%d cells)", baselinePath, len(b.Cells))
	default:
		if b, err := bench.ReadBaseline(baselinePath); err != nil {
			rep.Notes = append(rep.Notes, fmt.Sprintf("regression guard: no baseline (%v)", err))
		} else {
			rep.Baseline, rep.Guard = &b, bench.Guard(b, rep.Cells, o.concurrency)
		}
	}
	var md bytes.Buffer
	rep.WriteMarkdown(&md)
	_, _ = stdout.Write(md.Bytes())
	js, _ := json.MarshalIndent(rep, "", "  ")
	if err := errors.Join(os.WriteFile(filepath.Join(o.out, "results.md"), md.Bytes(), 0o644),
		os.WriteFile(filepath.Join(o.out, "results.json"), js, 0o644)); err != nil {
		logf("%v", err)
		return 1
	}
	fmt.Fprintf(stdout, "Results: %s (results.md, results.json, micro.txt, process logs); the run took %s.\n", o.out, time.Since(started).Round(time.Second))

	code := 0
	if n := rep.Errors(); n > 0 {
		logf("FAILED: %d requests or streams failed (see the errors column)", n)
		code = 1
	}
	if rep.MicroErr != "" {
		logf("FAILED: micro-benchmarks: %s", rep.MicroErr)
		code = 1
	}
	for _, r := range bench.Regressions(rep.Guard) {
		logf("REGRESSION against the baseline: %s", r)
		if o.strict {
			code = 1
		}
	}
	for _, g := range rep.Goals {
		if g.Measured && !g.Met {
			logf("target not met: %s (observed %s)", g.Name, g.Observed)
			if o.strict {
				code = 1
			}
		}
	}
	return code
}

// rig is one set of processes: a worker, the raw proxy in front of it, and coordinators.
type rig struct {
	procs   map[string]*bench.Proc // by target; "worker" is the simworker
	urls    map[string]string      // by target
	config  map[string]string      // coordinator config paths
	metrics map[string]string      // coordinator admin URLs
}

func (r *rig) stop() {
	for _, p := range r.procs {
		p.Stop()
	}
}

// startRig starts the worker with workerArgs and whatever targets need.
func startRig(ctx context.Context, o options, bins bench.Binaries, tag string, targets []string, workerArgs []string) (*rig, error) {
	r := &rig{procs: map[string]*bench.Proc{}, urls: map[string]string{}, config: map[string]string{}, metrics: map[string]string{}}
	w, err := bench.Start(ctx, bench.StartOptions{Name: tag + "-simworker", Bin: bins.Simworker, LogDir: o.out, ReadyPath: "/health",
		Args: append([]string{"--role", "both", "--kv-connector", "kv-nixl", "--no-record"}, workerArgs...)})
	if err != nil {
		return nil, err
	}
	r.procs["worker"], r.urls[bench.TargetDirect] = w, w.URL
	for _, t := range targets {
		var p *bench.Proc
		switch t {
		case bench.TargetDirect:
			continue
		case bench.TargetRaw:
			p, err = bench.Start(ctx, bench.StartOptions{Name: tag + "-rawproxy", Bin: bins.RawProxy, LogDir: o.out, ReadyPath: "/health",
				Args: []string{"--upstream", w.URL}})
		case bench.TargetNginx:
			p, err = bench.StartNginx(ctx, bench.NginxBinary(), o.out, tag+"-nginx", w.URL, "/health", 12000)
		default:
			var addr, metrics string
			if addr, err = bench.FreeAddr(); err != nil {
				break
			}
			if metrics, err = bench.FreeAddr(); err != nil {
				break
			}
			path := filepath.Join(o.out, tag+"-coordinator-"+t+".yaml")
			if err = os.WriteFile(path, []byte(bench.CoordinatorConfig(addr, w.URL, t)), 0o644); err != nil {
				break
			}
			r.config[t], r.metrics[t] = path, "http://"+metrics
			p, err = bench.Start(ctx, bench.StartOptions{Name: tag + "-coordinator-" + t, Bin: bins.Coordinator, LogDir: o.out,
				ReadyPath: "/readyz", URL: "http://" + addr, Args: []string{"--config", path},
				// Each coordinator gets its own metrics port (set through the environment, which
				// coordinators without a metrics listener ignore).
				Env: []string{"COORDINATOR_SERVER_METRICS_PORT=" + metrics[strings.LastIndexByte(metrics, ':')+1:]}})
		}
		if err != nil {
			r.stop()
			return nil, err
		}
		r.procs[t], r.urls[t] = p, p.URL
	}
	return r, nil
}

func throughput(ctx context.Context, o options, bins bench.Binaries, bodies map[string]bench.Body, rep *bench.Report, logf func(string, ...any)) error {
	started := time.Now()
	r, err := startRig(ctx, o, bins, "load", o.targets, []string{"--ttft", "0", "--itl", "0"})
	if err != nil {
		return err
	}
	defer r.stop()
	// Interleave the targets within each body and mode, slice by slice, so that load from
	// elsewhere on the box affects the cells that are compared with each other alike.
	order := slices.DeleteFunc(slices.Clone(bench.TargetNames), func(t string) bool { return !slices.Contains(o.targets, t) })
	for _, b := range bench.BodyNames {
		if !slices.Contains(o.bodies, b) {
			continue
		}
		for _, m := range o.modes {
			var cells []*cellRun
			for _, t := range order {
				cell := bench.Cell{Target: t, Body: b, Stream: m == "stream"}
				cells = append(cells, newCellRun(o, r, cell, bodies[b]))
			}
			for _, c := range cells {
				c.load.Warmup(ctx, o.warmup)
			}
			for s := range o.slices {
				for k := range cells {
					c := cells[(k+s)%len(cells)] // rotate who goes first
					c.measure(ctx, o.duration/time.Duration(o.slices), nil)
				}
			}
			for _, c := range cells {
				c.load.Close()
				res := c.result()
				logf("%-36s %7.0f req/s  p50 %-9v p99 %-9v proxy CPU/req %-8v other load %.2f  errors %d  (%s)", c.cell, res.RPS,
					res.P50.Round(time.Microsecond), res.P99.Round(time.Microsecond), res.ProxyCPU.Round(time.Microsecond), res.OtherLoad,
					res.Errors, time.Since(started).Round(time.Second))
				rep.Cells = append(rep.Cells, res)
			}
			if ctx.Err() != nil {
				return nil
			}
			for name, p := range r.procs {
				if !p.Alive() {
					return fmt.Errorf("%s exited during %s/%s (log %s)", name, b, m, p.LogPath)
				}
			}
		}
	}
	for t, p := range r.procs {
		rss, err := bench.TreePeakRSS(p.Pid())
		if err != nil {
			return err
		}
		rep.PeakRSS[rssName(t)] = rss
	}
	// At rest: the resident set once the load is over and the processes had time to give back
	// what it left behind (the coordinator trims after 5 s idle).
	if retry.Sleep(ctx, 8*time.Second) {
		for t, p := range r.procs {
			if rss, err := bench.TreeRSS(p.Pid()); err == nil {
				rep.RestRSS[rssName(t)] = rss
			}
			if anon, err := bench.TreeAnonRSS(p.Pid()); err == nil {
				rep.RestAnonRSS[rssName(t)] = anon
			}
		}
	}
	for _, spec := range o.profile {
		c, _ := parseCell(spec)
		if _, ok := r.procs[c.Target]; !ok {
			logf("profile %s: target %s is not running (add it to --targets)", spec, c.Target)
			continue
		}
		if err := profileCell(ctx, o, r, c, bodies[c.Body], logf); err != nil {
			logf("profile %s: %v", spec, err)
		}
	}
	return nil
}

// cellRun is one cell's load with the CPU time of the proxy and the worker accounted over its
// measured slices.
type cellRun struct {
	cell              bench.Cell
	load              *bench.Load
	proxy, worker     *bench.Proc
	all               []*bench.Proc // every process of the rig
	proxyCPU, workCPU time.Duration
	otherCPU, wall    time.Duration
}

func newCellRun(o options, r *rig, cell bench.Cell, body bench.Body) *cellRun {
	c := &cellRun{cell: cell, worker: r.procs["worker"], all: slices.Collect(maps.Values(r.procs)),
		load: bench.NewLoad(cell, r.urls[cell.Target], body.Payload(cell.Stream), bench.LoadOptions{Concurrency: o.concurrency, Timeout: o.timeout})}
	if cell.Target != bench.TargetDirect {
		c.proxy = r.procs[cell.Target]
	}
	return c
}

// cpuOf is the CPU time of p and its children (nginx's workers).
func cpuOf(p *bench.Proc) time.Duration {
	if p == nil {
		return 0
	}
	t, _ := bench.TreeCPUTime(p.Pid())
	return t
}

// measure runs one measured slice of d; extra, when set, is started before it and its returned
// function called after it.
func (c *cellRun) measure(ctx context.Context, d time.Duration, extra func() func()) {
	// Everything the benchmark runs: the rig's processes and the harness (load generator).
	ours := func() time.Duration {
		t, _ := bench.CPUTime(os.Getpid())
		for _, p := range c.all {
			t += cpuOf(p)
		}
		return t
	}
	p0, w0, o0 := cpuOf(c.proxy), cpuOf(c.worker), ours()
	s0, _ := bench.SystemBusy()
	t0 := time.Now()
	var stop func()
	if extra != nil {
		stop = extra()
	}
	c.load.Measure(ctx, d)
	if stop != nil {
		stop()
	}
	c.wall += time.Since(t0)
	s1, _ := bench.SystemBusy()
	c.otherCPU += max(0, (s1-s0)-(ours()-o0))
	c.proxyCPU += cpuOf(c.proxy) - p0
	c.workCPU += cpuOf(c.worker) - w0
}

func (c *cellRun) result() bench.CellResult {
	res := c.load.Result()
	if c.wall > 0 {
		res.OtherLoad = c.otherCPU.Seconds() / c.wall.Seconds()
	}
	if n := time.Duration(c.load.Served()); n > 0 {
		if c.proxy != nil {
			res.ProxyCPU = c.proxyCPU / n
		}
		res.WorkerCPU = c.workCPU / n
	}
	return res
}

// profileCell runs cell once more under `perf record` on the proxy process and writes the flat
// and cumulative reports next to the results.
func profileCell(ctx context.Context, o options, r *rig, c bench.Cell, body bench.Body, logf func(string, ...any)) error {
	if _, err := exec.LookPath("perf"); err != nil {
		return errors.New("perf is not installed (apt-get install linux-perf)")
	}
	base := filepath.Join(o.out, "perf-"+strings.ReplaceAll(c.String(), "/", "_"))
	var perfErr error
	extra := func() func() {
		cmd := exec.Command("perf", "record", "-F", "2999", "-g", "-p", fmt.Sprint(r.procs[c.Target].Pid()), "-o", base+".data")
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if perfErr = cmd.Start(); perfErr != nil {
			return func() {}
		}
		return func() {
			_ = cmd.Process.Signal(os.Interrupt)
			err := cmd.Wait()
			// perf exits through the interrupt; what counts is that it wrote its data.
			if st, serr := os.Stat(base + ".data"); serr != nil || st.Size() == 0 {
				perfErr = fmt.Errorf("perf record: %w: %s", err, errb.String())
			}
		}
	}
	run := newCellRun(o, r, c, body)
	defer run.load.Close()
	run.load.Warmup(ctx, o.warmup)
	run.measure(ctx, o.profileDuration, extra)
	res := run.result()
	if perfErr != nil {
		return perfErr
	}
	logf("profiled %s: %.0f req/s (under perf), proxy CPU/req %v", c, res.RPS, res.ProxyCPU)
	for _, rep := range []struct {
		suffix string
		args   []string
	}{
		{"-flat.txt", []string{"--no-children", "--sort", "symbol", "-g", "none", "--percent-limit", "0.3"}},
		{"-cumulative.txt", []string{"--children", "--sort", "symbol", "-g", "none", "--percent-limit", "1"}},
	} {
		out, err := exec.Command("perf", append([]string{"report", "-i", base + ".data", "--stdio"}, rep.args...)...).Output()
		if err != nil {
			return fmt.Errorf("perf report: %w", err)
		}
		if err := os.WriteFile(base+rep.suffix, out, 0o644); err != nil {
			return err
		}
	}
	logf("profile of %s in %s-{flat,cumulative}.txt (raw: %s.data)", c, base, base)
	return nil
}

func sse(ctx context.Context, o options, bins bench.Binaries, rep *bench.Report, logf func(string, ...any)) error {
	r, err := startRig(ctx, o, bins, "sse", o.sseTargets, []string{"--ttft", "0", "--itl", o.sseITL.String(), "--stamp-events"})
	if err != nil {
		return err
	}
	defer r.stop()
	payload := []byte(fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":"tell me a story about streams"}],"max_tokens":%d,"stream":true}`, o.sseTokens))
	var loads []*bench.SSELoad
	for _, t := range bench.TargetNames {
		if slices.Contains(o.sseTargets, t) {
			l := bench.NewSSELoad(t, r.urls[t], bench.SSEOptions{Concurrency: o.sseConcurrency, Payload: payload, Timeout: o.timeout})
			defer l.Close()
			l.Run(ctx, o.sseWarmup, false)
			loads = append(loads, l)
		}
	}
	for s := range o.slices {
		for k := range loads {
			loads[(k+s)%len(loads)].Run(ctx, o.sseDuration/time.Duration(o.slices), true)
		}
	}
	for _, l := range loads {
		res := l.Result()
		logf("SSE %-16s %6d events  p50 %-9v p99 %-9v errors %d", res.Target, res.Events, res.P50.Round(time.Microsecond), res.P99.Round(time.Microsecond), res.Errors)
		rep.SSE = append(rep.SSE, res)
	}
	return nil
}

// rssName is a process's name in the RSS tables.
func rssName(target string) string {
	switch {
	case bench.IsCoordinator(target):
		return "coordinator " + target
	case target == "worker":
		return "simworker"
	}
	return target
}

// scale runs the concurrency-scaling cells: for each stream count, each target in turn holds
// that many streams open through a worker with the scaling inter-token interval.
func scale(ctx context.Context, o options, bins bench.Binaries, rep *bench.Report, logf func(string, ...any)) error {
	most := slices.Max(o.scaleStreams)
	// The client, the worker and each proxy hold a descriptor per stream (a proxy two).
	limit, err := bench.RaiseFileLimit(uint64(2*most + 1024))
	if err != nil {
		return err
	}
	rep.FileLimit = limit
	if limit < uint64(2*most+64) {
		rep.Notes = append(rep.Notes, fmt.Sprintf("the open-file limit is %d (the hard limit, not raisable here): a proxy holding N streams needs 2N descriptors, so the %d-stream cells are bounded by it", limit, most))
	}
	// The box falls seconds behind the offered event rate at thousands of streams: the worker's
	// own KV checks (prefill-decode's NIXL look-ups) must not time out before the coordinator does.
	r, err := startRig(ctx, o, bins, "scale", o.scaleTargets, []string{"--ttft", "0", "--itl", o.scaleITL.String(), "--stamp-events",
		"--side-channel-timeout", "5m"})
	if err != nil {
		return err
	}
	defer r.stop()
	payload := []byte(fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":"stream for a while"}],"max_tokens":%d,"stream":true}`, o.scaleTokens))
	order := slices.DeleteFunc(slices.Clone(bench.TargetNames), func(t string) bool { return !slices.Contains(o.scaleTargets, t) })
	for _, n := range o.scaleStreams {
		for _, t := range order {
			p := r.procs[t]
			sample := func() (int64, int) {
				rss, _ := bench.TreeRSS(p.Pid())
				return rss, goroutines(r, t)
			}
			res := bench.RunScale(ctx, t, r.urls[t], bench.ScaleOptions{Streams: n, Payload: payload, Tokens: o.scaleTokens, ITL: o.scaleITL,
				Ramp: min(o.scaleRamp, time.Duration(n)*time.Millisecond), Timeout: 10*time.Duration(o.scaleTokens)*o.scaleITL + o.scaleRamp + 30*time.Second,
				Sample: sample, SampleEvery: 100 * time.Millisecond, CPU: func() time.Duration { return cpuOf(p) }})
			logf("scale %-16s %6d streams: open %6d, %.1f KiB/stream, CPU/event %v, p50 %v p99 %v, lag %v, errors %d %s", t, n, res.Open,
				res.RSSPerStream()/1024, res.CPUPerEvent, res.P50.Round(time.Microsecond), res.P99.Round(time.Microsecond), res.Lag.Round(time.Millisecond),
				res.Errors, res.ErrorSample)
			rep.Scale = append(rep.Scale, res)
			if ctx.Err() != nil {
				return nil
			}
			for name, p := range r.procs {
				if !p.Alive() {
					return fmt.Errorf("%s exited during the %d-stream cells (log %s)", name, n, p.LogPath)
				}
			}
		}
	}
	return nil
}

// goroutines is target's goroutine count: the coordinators' go_goroutines, the raw proxy's own
// endpoint; -1 for nginx (no goroutines) or when it cannot be read.
func goroutines(r *rig, target string) int {
	var url string
	switch {
	case bench.IsCoordinator(target):
		url = r.metrics[target] + "/metrics"
	case target == bench.TargetRaw:
		url = r.urls[target] + "/_rawproxy/goroutines"
	default:
		return -1
	}
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return -1
	}
	return bench.ParseGoroutines(b)
}

// revision describes the source tree: git describe --always --dirty, or "" outside git.
func revision(repo string) string {
	cmd := exec.Command("git", "describe", "--always", "--dirty")
	cmd.Dir = repo
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// findRepo walks up from the working directory to the go.mod of this module.
func findRepo() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.Contains(b, []byte("module github.com/epd-dev/coordinator\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the github.com/epd-dev/coordinator module (use --repo)")
		}
		dir = parent
	}
}

// machine describes the box: CPU model and count, and the load average at the start.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	load := "?"
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			load = strings.Join(f[:3], " ")
		}
	}
	return fmt.Sprintf("%d × %s, %s/%s, %s, load average at start %s; every process on this one box", runtime.NumCPU(), model,
		runtime.GOOS, runtime.GOARCH, runtime.Version(), load)
}

package bench

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseGoroutines(t *testing.T) {
	for in, want := range map[string]int{
		"42\n": 42,
		"# HELP go_goroutines Number of goroutines that currently exist.\n# TYPE go_goroutines gauge\ngo_goroutines 1234\ngo_threads 9\n": 1234,
		"go_threads 9\n": -1,
		"":               -1,
	} {
		if got := ParseGoroutines([]byte(in)); got != want {
			t.Errorf("ParseGoroutines(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestParseStatusKB(t *testing.T) {
	status := []byte("Name:\tnginx\nVmHWM:\t   2048 kB\nVmRSS:\t    1024 kB\n")
	if v, err := ParseStatusKB(status, "VmRSS:"); err != nil || v != 1024<<10 {
		t.Fatalf("VmRSS = %d, %v", v, err)
	}
	if _, err := ParseStatusKB(status, "VmSwap:"); err == nil {
		t.Fatal("a missing field must be an error")
	}
	if _, err := ParseStatusKB([]byte("VmRSS: 12 MB\n"), "VmRSS:"); err == nil {
		t.Fatal("a unit other than kB must be an error")
	}
}

// TestTree: the harness's own process is found with its children (none here), and its RSS and
// CPU time are read.
func TestTree(t *testing.T) {
	pids := Tree(os.Getpid())
	if len(pids) < 1 || pids[0] != os.Getpid() {
		t.Fatalf("Tree = %v", pids)
	}
	if rss, err := TreeRSS(os.Getpid()); err != nil || rss <= 0 {
		t.Fatalf("TreeRSS = %d, %v", rss, err)
	}
	if _, err := TreeCPUTime(os.Getpid()); err != nil {
		t.Fatal(err)
	}
}

func TestNginxConfig(t *testing.T) {
	conf := NginxConfig("/tmp/x", "127.0.0.1:9000", "http://127.0.0.1:8000", 12000)
	for _, want := range []string{"listen 127.0.0.1:9000", "server 127.0.0.1:8000;", "keepalive 100;", "proxy_buffering off;",
		"proxy_request_buffering off;", "proxy_http_version 1.1;", `proxy_set_header Connection "";`, "worker_connections 12064;",
		"worker_rlimit_nofile 24064;", "access_log off;", "pid /tmp/x/nginx.pid;"} {
		if !strings.Contains(conf, want) {
			t.Errorf("the nginx config has no %q:\n%s", want, conf)
		}
	}
}

func TestScaleResultPerStream(t *testing.T) {
	r := ScaleResult{Open: 1000, IdleRSS: 10 << 20, OpenRSS: 10<<20 + 1000*30<<10, IdleGoroutines: 10, OpenGoroutines: 4010}
	if got := r.RSSPerStream(); got != 30<<10 {
		t.Errorf("RSSPerStream = %v, want 30 KiB", got)
	}
	if got := r.GoroutinesPerStream(); got != 4 {
		t.Errorf("GoroutinesPerStream = %v, want 4", got)
	}
	r.OpenGoroutines = -1
	if got := r.GoroutinesPerStream(); got != -1 {
		t.Errorf("GoroutinesPerStream without a count = %v, want -1", got)
	}
	if got := (ScaleResult{}).RSSPerStream(); got != 0 {
		t.Errorf("RSSPerStream without open streams = %v", got)
	}
}

func TestEvaluateScaleGoals(t *testing.T) {
	cells := []ScaleResult{
		{Target: TargetRaw, Streams: 5000, Open: 5000, Events: 100, CPUPerEvent: 20 * time.Microsecond, P99: 2 * time.Millisecond},
		{Target: TargetDecodeOnly, Streams: 5000, Open: 5000, Events: 100, CPUPerEvent: 23 * time.Microsecond, P99: 2500 * time.Microsecond},
		{Target: TargetDecodeOnly, Streams: 10000, Open: 10000, IdleRSS: 0, OpenRSS: 10000 * 20 << 10},
		{Target: TargetPrefillDecode, Streams: 5000, Open: 5000, Events: 100, CPUPerEvent: 30 * time.Microsecond, P99: 4 * time.Millisecond,
			OpenRSS: 5000 * 40 << 10, Errors: 1},
	}
	got := map[string]Goal{}
	for _, g := range EvaluateScaleGoals(cells) {
		got[g.Name] = g
	}
	check := func(prefix string, measured, met bool) {
		t.Helper()
		for name, g := range got {
			if strings.HasPrefix(name, prefix) {
				if g.Measured != measured || g.Met != met {
					t.Errorf("%s: measured %v met %v (%s), want %v %v", name, g.Measured, g.Met, g.Observed, measured, met)
				}
				return
			}
		}
		t.Errorf("no goal %q", prefix)
	}
	check("decode-only memory per open stream", true, true)     // 20 KiB at 10000
	check("decode-only CPU per relayed event", true, true)      // 1.15×
	check("decode-only per-event latency p99", true, true)      // +0.5 ms
	check("prefill-decode memory per open stream", true, false) // 40 KiB at 5000, an error
	check("prefill-decode CPU per relayed event", true, false)  // 1.5×
	check("prefill-decode per-event latency p99", true, false)  // +2 ms
}

func TestNginxRatio(t *testing.T) {
	results := []CellResult{
		{Cell: Cell{Target: TargetNginx, Body: Body200B}, RPS: 10000},
		{Cell: Cell{Target: TargetDecodeOnly, Body: Body200B}, RPS: 5500},
	}
	FillRatios(results)
	if results[1].RatioToNginx != 0.55 {
		t.Fatalf("RatioToNginx = %v", results[1].RatioToNginx)
	}
	for _, g := range EvaluateGoals(results, nil) {
		if strings.HasPrefix(g.Name, "decode-only ≥ 0.5× nginx req/s at 200B json") && (!g.Measured || !g.Met) {
			t.Fatalf("%s: %+v", g.Name, g)
		}
	}
}

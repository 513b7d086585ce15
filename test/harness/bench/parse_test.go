package bench

import (
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	_ "github.com/epd-dev/coordinator/dataplane/steps" // registers the steps CoordinatorConfig names
)

func TestParseStamp(t *testing.T) {
	tests := []struct {
		line string
		want int64
		ok   bool
	}{
		{": sent_ns=1700000000123456789\n", 1700000000123456789, true},
		{": sent_ns=42\r\n", 42, true},
		{": sent_ns=42", 42, true},
		{": sent_ns=\n", 0, false},
		{": sent_ns=-5\n", 0, false},
		{": sent_ns=12x\n", 0, false},
		{": ping\n", 0, false},
		{"data: {}\n", 0, false},
	}
	for _, tt := range tests {
		got, ok := ParseStamp([]byte(tt.line))
		if got != tt.want || ok != tt.ok {
			t.Errorf("ParseStamp(%q) = %d, %v; want %d, %v", tt.line, got, ok, tt.want, tt.ok)
		}
	}
}

func TestReadStampedStream(t *testing.T) {
	clock := int64(1000)
	now := func() int64 { clock += 10; return clock }
	body := ": sent_ns=1005\ndata: {\"a\":1}\n\n: keep-alive\n\n: sent_ns=1011\ndata: [DONE]\n\n"
	lat, err := ReadStampedStream(strings.NewReader(body), now)
	if err != nil {
		t.Fatal(err)
	}
	if len(lat) != 2 || lat[0] != 5 || lat[1] != 9 {
		t.Errorf("latencies %v, want [5 9]", lat)
	}

	for name, body := range map[string]string{
		"truncated":       ": sent_ns=1\ndata: {}\n\n",
		"cut mid-event":   ": sent_ns=1\ndata: {}\n\n: sent_ns=2\nda",
		"unstamped event": "data: {}\n\n: sent_ns=1\ndata: [DONE]\n\n",
		"bad stamp":       ": sent_ns=oops\ndata: [DONE]\n\n",
	} {
		if _, err := ReadStampedStream(strings.NewReader(body), now); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := ReadStampedStream(io.MultiReader(strings.NewReader(": sent_ns=1\n"), errReader{}), now); err == nil {
		t.Error("read error not reported")
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("boom") }

func TestCheckResponse(t *testing.T) {
	completion := []byte(`{"id":"x","choices":[{"index":0}]}`)
	tests := []struct {
		name   string
		stream bool
		r      vegeta.Result
		want   string
	}{
		{"ok json", false, vegeta.Result{Code: 200, Body: completion}, ""},
		{"ok stream", true, vegeta.Result{Code: 200, Body: []byte("data: {}\n\ndata: [DONE]\n\n")}, ""},
		{"status", false, vegeta.Result{Code: 502, Error: "502 Bad Gateway", Body: []byte(`{"error":{}}`)}, "status 502"},
		{"3xx is not success", false, vegeta.Result{Code: 302, Body: completion}, "status 302"},
		{"transport", false, vegeta.Result{Error: "connection refused"}, "connection refused"},
		{"truncated body read", true, vegeta.Result{Error: "unexpected EOF"}, "unexpected EOF"},
		{"no [DONE]", true, vegeta.Result{Code: 200, Body: []byte("data: {}\n\n")}, "truncated stream"},
		{"not json", false, vegeta.Result{Code: 200, Body: []byte(`{"id":`)}, "malformed completion"},
		{"no choices", false, vegeta.Result{Code: 200, Body: []byte(`{"id":"x","choices":[]}`)}, "malformed completion"},
	}
	for _, tt := range tests {
		err := CheckResponse(tt.stream, &tt.r)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: err %v, want %q", tt.name, err, tt.want)
		}
	}
}

func TestParseVmHWM(t *testing.T) {
	status := "Name:\tcoordinator\nVmPeak:\t 1270000 kB\nVmHWM:\t   65536 kB\nVmRSS:\t   60000 kB\n"
	if got, err := ParseVmHWM([]byte(status)); err != nil || got != 64<<20 {
		t.Errorf("ParseVmHWM = %d, %v; want %d", got, err, 64<<20)
	}
	for _, bad := range []string{"Name:\tx\n", "VmHWM:\t12 MB\n", "VmHWM:\tlots kB\n"} {
		if _, err := ParseVmHWM([]byte(bad)); err == nil {
			t.Errorf("ParseVmHWM(%q) accepted", bad)
		}
	}
}

func TestParseStatCPU(t *testing.T) {
	// Fields 14 and 15 are utime and stime; the command may hold spaces and parentheses.
	stat := "1234 (coord (x) y) S 1 1234 1234 0 -1 4194560 500 0 0 0 150 25 0 0 20 0 9 0 100 0 0\n"
	if got, err := ParseStatCPU([]byte(stat)); err != nil || got != 1750*time.Millisecond {
		t.Errorf("ParseStatCPU = %v, %v; want 1.75s", got, err)
	}
	for _, bad := range []string{"1234 coord S", "1 (c) S 1 2 3", "1 (c) S 1 1 1 0 -1 0 0 0 0 0 x 1 0"} {
		if _, err := ParseStatCPU([]byte(bad)); err == nil {
			t.Errorf("ParseStatCPU(%q) accepted", bad)
		}
	}
}

func TestParseSystemBusy(t *testing.T) {
	stat := "cpu  1000 50 300 90000 200 10 20 30 0 0\ncpu0 500 25 150 45000 100 5 10 15 0 0\n"
	// user + nice + system + irq + softirq + steal = 1410 ticks
	if got, err := ParseSystemBusy([]byte(stat)); err != nil || got != 14100*time.Millisecond {
		t.Errorf("ParseSystemBusy = %v, %v; want 14.1s", got, err)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7 8\n", "cpu 1 2 3\n", "cpu 1 2 3 4 5 6 x 8\n"} {
		if _, err := ParseSystemBusy([]byte(bad)); err == nil {
			t.Errorf("ParseSystemBusy(%q) accepted", bad)
		}
	}
}

func TestParseMicro(t *testing.T) {
	out := `goos: linux
goarch: amd64
pkg: github.com/epd-dev/coordinator/dataplane/server
cpu: AMD EPYC
BenchmarkRequestPath/decode-only/200B-2         	   10000	    101234 ns/op	   1.23 MB/s	       123.0 body-bytes	   12345 B/op	     156 allocs/op
BenchmarkRequestPath/prefill-decode/256KiB-text-2         	     500	   2345678 ns/op	 111.80 MB/s	   262144 body-bytes	  300000 B/op	     400 allocs/op
BenchmarkValid-2   	   1000	   250000 ns/op	4000.00 MB/s
--- FAIL: BenchmarkBroken
PASS
ok  	github.com/epd-dev/coordinator/dataplane/server	3.2s
`
	got := ParseMicro([]byte(out))
	if len(got) != 3 {
		t.Fatalf("parsed %d lines: %+v", len(got), got)
	}
	want := MicroResult{Name: "BenchmarkRequestPath/decode-only/200B", Iterations: 10000, NsPerOp: 101234, MBPerS: 1.23,
		BytesPerOp: 12345, AllocsOp: 156, Extra: map[string]float64{"body-bytes": 123}}
	a, _ := json.Marshal(got[0])
	b, _ := json.Marshal(want)
	if string(a) != string(b) {
		t.Errorf("got %s\nwant %s", a, b)
	}
	if got[1].Name != "BenchmarkRequestPath/prefill-decode/256KiB-text" || got[2].Name != "BenchmarkValid" || got[2].BytesPerOp != 0 {
		t.Errorf("names %q %q", got[1].Name, got[2].Name)
	}
	if trimProcs("BenchmarkX/256KiB-text") != "BenchmarkX/256KiB-text" {
		t.Error("trimProcs cut a non-numeric suffix")
	}
}

func TestBodies(t *testing.T) {
	bodies := Bodies()
	sizes := map[string]int{Body200B: 200, Body256K: 256 << 10, Body1MiB: 1 << 20}
	for _, name := range BodyNames {
		b := bodies[name]
		if b.Name != name || len(b.JSON) != sizes[name] {
			t.Errorf("%s: name %q, %d bytes, want %d", name, b.Name, len(b.JSON), sizes[name])
		}
		for _, stream := range []bool{false, true} {
			var v struct {
				Model     string            `json:"model"`
				Messages  []json.RawMessage `json:"messages"`
				MaxTokens int               `json:"max_tokens"`
				Stream    bool              `json:"stream"`
			}
			if err := json.Unmarshal(b.Payload(stream), &v); err != nil {
				t.Fatalf("%s stream=%v: %v", name, stream, err)
			}
			if v.Stream != stream || v.MaxTokens != 16 || len(v.Messages) != 1 || v.Model != "sim-model" {
				t.Errorf("%s stream=%v: %+v", name, stream, v)
			}
		}
	}
	if !strings.Contains(string(bodies[Body1MiB].JSON), `"url":"data:image/jpeg;base64,/9j/4`) {
		t.Error("the image body does not carry a base64 JPEG data URL")
	}
}

// TestCoordinatorConfig checks that the harness's configs are valid for the coordinator.
func TestCoordinatorConfig(t *testing.T) {
	noEnv := func(string) (string, bool) { return "", false }
	for target, steps := range map[string][]string{TargetDecodeOnly: {"decode"}, TargetPrefillDecode: {"prefill", "decode"}} {
		cfg, err := config.Parse([]byte(CoordinatorConfig("127.0.0.1:18080", "http://127.0.0.1:18000", target)), noEnv)
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		if cfg.LogLevel != 1 || cfg.Server.ListenAddr != "127.0.0.1:18080" || cfg.Gateway.Address != "http://127.0.0.1:18000" ||
			cfg.Pipeline.KVConnector != "kv-nixl" || len(cfg.Pipeline.Steps) != len(steps) {
			t.Errorf("%s: %+v", target, cfg)
		}
		for i, s := range steps {
			if cfg.Pipeline.Steps[i].Type != s {
				t.Errorf("%s: step %d is %q, want %q", target, i, cfg.Pipeline.Steps[i].Type, s)
			}
		}
		if _, err := builder.Build(cfg, builder.Options{}); err != nil {
			t.Errorf("%s: %v", target, err)
		}
	}
}

package main

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/test/harness/bench"
)

func TestParseFlagsDefaults(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.concurrency != 16 || o.warmup != 2*time.Second || o.duration != 8*time.Second || o.slices != 4 || !o.micro ||
		!slices.Equal(o.targets, []string{"raw-proxy", "nginx", "decode-only", "prefill-decode"}) ||
		!slices.Equal(o.bodies, bench.BodyNames) || !slices.Equal(o.modes, []string{"json", "stream"}) ||
		!slices.Equal(o.sseTargets, []string{"direct", "raw-proxy", "decode-only", "prefill-decode"}) || len(o.profile) != 0 || o.strict ||
		!slices.Equal(o.scaleStreams, []int{100, 1000, 5000, 10000}) || !slices.Equal(o.scaleTargets, []string{"raw-proxy", "nginx", "decode-only", "prefill-decode"}) ||
		o.scaleTokens != 200 || o.scaleITL != 20*time.Millisecond {
		t.Errorf("defaults %+v", o)
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--targets", " direct, raw-proxy ", "--bodies", "1MiB-image", "--modes", "stream", "--sse-targets", "",
		"--profile", "decode-only/1MiB-image/json", "--concurrency", "4", "--strict"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.targets, []string{"direct", "raw-proxy"}) || !slices.Equal(o.bodies, []string{"1MiB-image"}) ||
		!slices.Equal(o.modes, []string{"stream"}) || len(o.sseTargets) != 0 || o.concurrency != 4 || !o.strict ||
		!slices.Equal(o.profile, []string{"decode-only/1MiB-image/json"}) {
		t.Errorf("%+v", o)
	}
	for _, args := range [][]string{
		{"--targets", "nginy"},
		{"--sse-targets", "nginx"},
		{"--scale-streams", "100,0"},
		{"--scale-streams", "many"},
		{"--scale-targets", "direct"},
		{"--scale-itl", "0s"},
		{"--bodies", "2MiB"},
		{"--modes", "sse"},
		{"--profile", "direct/200B/json"},
		{"--profile", "decode-only/200B"},
		{"--concurrency", "0"},
		{"--slices", "0"},
		{"extra"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

func TestParseCell(t *testing.T) {
	c, err := parseCell("prefill-decode/256KiB-text/stream")
	if err != nil || c != (bench.Cell{Target: "prefill-decode", Body: "256KiB-text", Stream: true}) || c.String() != "prefill-decode/256KiB-text/stream" {
		t.Errorf("parseCell = %+v, %v", c, err)
	}
	if _, err := parseCell("decode-only/200B/chunked"); err == nil || !strings.Contains(err.Error(), "want target/body") {
		t.Errorf("err %v", err)
	}
}

package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/internal/command"
	"github.com/epd-dev/coordinator/test/internal/loopback"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    simworker.Config
		wantErr string
	}{
		{
			name: "defaults",
			want: simworker.Config{Role: "both", KVConnector: "kv-nixl", ECConnector: "ec-nixl", DefaultMaxTokens: 16,
				CacheSize: 1024, ModelName: "sim-model", Addr: "127.0.0.1:0"},
		},
		{
			name: "everything",
			args: []string{"--name", "p1", "--role", "prefill", "--kv-connector", "kv-shared-storage", "--kv-dir", "/tmp/kv",
				"--ec-connector", "ec-shared-storage", "--ec-dir", "/tmp/ec", "--ttft", "20ms", "--itl", "5ms",
				"--default-max-tokens", "8", "--cache-size", "10", "--model", "llama", "--addr", ":0", "--advertise-host", "10.0.0.1"},
			want: simworker.Config{Name: "p1", Role: "prefill", KVConnector: "kv-shared-storage", KVDir: "/tmp/kv",
				ECConnector: "ec-shared-storage", ECDir: "/tmp/ec", TTFT: 20 * time.Millisecond, ITL: 5 * time.Millisecond,
				DefaultMaxTokens: 8, CacheSize: 10, ModelName: "llama", Addr: ":0", AdvertiseHost: "10.0.0.1"},
		},
		{
			name: "benchmark options",
			args: []string{"--stamp-events", "--no-record"},
			want: simworker.Config{Role: "both", KVConnector: "kv-nixl", ECConnector: "ec-nixl", DefaultMaxTokens: 16,
				CacheSize: 1024, ModelName: "sim-model", Addr: "127.0.0.1:0", StampEvents: true, DisableRecording: true},
		},
		{
			name: "fault control",
			args: []string{"--fault-control"},
			want: simworker.Config{Role: "both", KVConnector: "kv-nixl", ECConnector: "ec-nixl", DefaultMaxTokens: 16,
				CacheSize: 1024, ModelName: "sim-model", Addr: "127.0.0.1:0", FaultControl: true},
		},
		{
			name: "render without metadata",
			args: []string{"--render-without-metadata"},
			want: simworker.Config{Role: "both", KVConnector: "kv-nixl", ECConnector: "ec-nixl", DefaultMaxTokens: 16,
				CacheSize: 1024, ModelName: "sim-model", Addr: "127.0.0.1:0", RenderWithoutMetadata: true},
		},
		{
			name: "side channel timeout",
			args: []string{"--side-channel-timeout", "5m"},
			want: simworker.Config{Role: "both", KVConnector: "kv-nixl", ECConnector: "ec-nixl", DefaultMaxTokens: 16,
				CacheSize: 1024, ModelName: "sim-model", Addr: "127.0.0.1:0", SideChannelTimeout: 5 * time.Minute},
		},
		{
			name: "sglang bootstrap",
			args: []string{"--kv-connector", "kv-sglang", "--role", "prefill", "--bootstrap-timeout", "2s", "--bootstrap-addr", "127.0.0.2:8998"},
			want: simworker.Config{Role: "prefill", KVConnector: "kv-sglang", ECConnector: "ec-nixl", DefaultMaxTokens: 16,
				CacheSize: 1024, ModelName: "sim-model", Addr: "127.0.0.1:0", BootstrapTimeout: 2 * time.Second, BootstrapAddr: "127.0.0.2:8998"},
		},
		{name: "bad role", args: []string{"--role", "router"}, wantErr: "unknown role"},
		{name: "missing kv dir", args: []string{"--kv-connector", "kv-shared-storage"}, wantErr: "KVDir is required"},
		{name: "unknown flag", args: []string{"--nope"}, wantErr: "not defined"},
		{name: "positional", args: []string{"extra"}, wantErr: "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseFlags(tt.args, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("config = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestRunServesUntilCancelled(t *testing.T) {
	url, stop := command.Started(t, run, "--role", "decode")
	resp, _ := loopback.Get(t, url+"/health")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("health status %d", resp.StatusCode)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{"--role", "router"}, io.Discard, io.Discard); err == nil {
		t.Error("run served an invalid configuration")
	}
}

func TestRunFaultControl(t *testing.T) {
	url, stop := command.Started(t, run, "--fault-control")
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	post := func(path, body string) (*http.Response, []byte) {
		req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		return loopback.Fetch(t, client, req)
	}
	if resp, body := post(simworker.PathFaults, `{"kind":"status","status":503,"body":"worker down"}`); resp.StatusCode != http.StatusOK ||
		string(body) != `{"faults":[{"kind":"status","count":1,"status":503,"body":"worker down"}]}` {
		t.Fatalf("POST %s: %d %s", simworker.PathFaults, resp.StatusCode, body)
	}
	chat := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`
	if resp, body := post(simworker.PathChatCompletions, chat); resp.StatusCode != http.StatusServiceUnavailable || string(body) != "worker down" {
		t.Errorf("faulted answer %d %s", resp.StatusCode, body)
	}
	if resp, _ := post(simworker.PathChatCompletions, chat); resp.StatusCode != http.StatusOK {
		t.Errorf("status %d once the fault is used up", resp.StatusCode)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

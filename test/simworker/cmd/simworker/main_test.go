package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/test/simworker"
	"go.uber.org/goleak"
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
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--role", "decode"}, pw, io.Discard)
		pw.Close()
	}()
	url, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(strings.TrimSpace(url) + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("health status %d", resp.StatusCode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

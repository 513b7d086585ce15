package main

import (
	"context"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/epd-dev/coordinator/test/doubles/gateway"
	"github.com/epd-dev/coordinator/test/internal/command"
	"github.com/epd-dev/coordinator/test/internal/loopback"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseFlags(t *testing.T) {
	defaults := gateway.Config{Addr: "127.0.0.1:0", Pools: map[string][]string{}, EjectFor: 30 * time.Second, EjectAfter: 1, RetryAfter: time.Second}
	tests := []struct {
		name    string
		args    []string
		want    gateway.Config
		wantErr string
	}{
		{"defaults", nil, defaults, ""},
		{
			"pools",
			[]string{"--listen", ":9000", "--pool", "encode=http://a:1", "--pool", "prefill=http://b:1, http://c:1", "--pool", "encode=http://d:1"},
			gateway.Config{Addr: ":9000", Pools: map[string][]string{"encode": {"http://a:1", "http://d:1"}, "prefill": {"http://b:1", "http://c:1"}},
				EjectFor: 30 * time.Second, EjectAfter: 1, RetryAfter: time.Second},
			"",
		},
		{
			"failure modes",
			[]string{"--eject-for", "-1s", "--eject-after", "3", "--max-in-flight", "8", "--retry-after", "5s", "--route-timeout", "2s",
				"--max-request-body-bytes", "1024", "--epp-conditional-decode", "--epp-hints", "--legacy-reserve"},
			gateway.Config{Addr: "127.0.0.1:0", Pools: map[string][]string{}, EjectFor: -time.Second, EjectAfter: 3, MaxInFlight: 8,
				RetryAfter: 5 * time.Second, RouteTimeout: 2 * time.Second, MaxRequestBodyBytes: 1024, EPPConditionalDecode: true,
				Hints: true, LegacyReserve: true},
			"",
		},
		{"no equals", []string{"--pool", "encode"}, gateway.Config{}, "want profile=url1,url2"},
		{"no urls", []string{"--pool", "encode="}, gateway.Config{}, "want profile=url1,url2"},
		{"positional", []string{"x"}, gateway.Config{}, "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parseFlags(tt.args, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cfg, tt.want) {
				t.Errorf("config %+v, want %+v", cfg, tt.want)
			}
		})
	}
}

func TestRun(t *testing.T) {
	url, stop := command.Started(t, run)
	resp, _ := loopback.Get(t, url+"/v1/models")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("status %d without pools", resp.StatusCode)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a run that wrongly starts returns at once
	if err := run(ctx, []string{"--pool", "p=::bad"}, io.Discard, io.Discard); err == nil {
		t.Error("run accepted a bad pool URL")
	}
}

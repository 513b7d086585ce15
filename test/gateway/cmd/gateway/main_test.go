package main

import (
	"context"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/epd-dev/coordinator/test/internal/command"
	"github.com/epd-dev/coordinator/test/internal/loopback"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		wantAddr  string
		wantPools map[string][]string
		wantErr   string
	}{
		{"defaults", nil, "127.0.0.1:0", map[string][]string{}, ""},
		{
			"pools",
			[]string{"--listen", ":9000", "--pool", "encode=http://a:1", "--pool", "prefill=http://b:1, http://c:1", "--pool", "encode=http://d:1"},
			":9000",
			map[string][]string{"encode": {"http://a:1", "http://d:1"}, "prefill": {"http://b:1", "http://c:1"}},
			"",
		},
		{"no equals", []string{"--pool", "encode"}, "", nil, "want profile=url1,url2"},
		{"no urls", []string{"--pool", "encode="}, "", nil, "want profile=url1,url2"},
		{"positional", []string{"x"}, "", nil, "unexpected arguments"},
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
			if cfg.Addr != tt.wantAddr || !reflect.DeepEqual(cfg.Pools, tt.wantPools) {
				t.Errorf("config %+v", cfg)
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

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/epd-dev/coordinator/test/harness/refused"
)

// steadyload counts what it sent and fails when a request failed.
func TestRun(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x"}`)
	}))
	defer ok.Close()
	refusedURL := "http://" + refused.Addr(t) // every connection is refused

	tests := map[string]struct {
		args       []string
		wantErr    error
		wantServed bool
	}{
		"all served":  {args: []string{"--url", ok.URL, "--requests", "20"}, wantServed: true},
		"all refused": {args: []string{"--url", refusedURL, "--requests", "5", "--clients", "1"}, wantErr: errLoss},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tc.args, &stdout, &stderr)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("run: %v, want %v (stderr %s)", err, tc.wantErr, stderr.String())
			}
			var got struct {
				Served, Failed int
				Failures       []string
			}
			if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
				t.Fatalf("stdout %q: %v", stdout.String(), err)
			}
			if tc.wantServed && (got.Served < 20 || got.Failed != 0) || !tc.wantServed && (got.Served != 0 || got.Failed < 5 || len(got.Failures) == 0) {
				t.Fatalf("got %+v", got)
			}
		})
	}
}

func TestBadFlags(t *testing.T) {
	tests := map[string][]string{
		"no url":         {},
		"no clients":     {"--url", "http://x", "--clients", "0"},
		"negative limit": {"--url", "http://x", "--requests", "-1"},
		"stray argument": {"--url", "http://x", "extra"},
	}
	for name, args := range tests {
		t.Run(name, func(t *testing.T) {
			if err := run(context.Background(), args, io.Discard, io.Discard); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

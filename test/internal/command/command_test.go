package command

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    string
		wantErr string
		usage   bool // the flag set printed its usage to stderr
	}{
		{name: "defaults", want: "d"},
		{name: "set", args: []string{"--addr", "x:1"}, want: "x:1"},
		{name: "single dash", args: []string{"-addr=y"}, want: "y"},
		{name: "stray argument", args: []string{"--addr", "x", "extra"}, wantErr: "unexpected arguments: [extra]"},
		{name: "unknown flag", args: []string{"--nope"}, wantErr: "flag provided but not defined: -nope", usage: true},
		{name: "help", args: []string{"-h"}, wantErr: "flag: help requested", usage: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			fs := FlagSet("double", &stderr)
			addr := fs.String("addr", "d", "listen address")
			err := Parse(fs, tt.args)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
			} else if err != nil || *addr != tt.want {
				t.Fatalf("addr %q, err %v; want %q", *addr, err, tt.want)
			}
			if got := strings.Contains(stderr.String(), "Usage of double:"); got != tt.usage {
				t.Errorf("usage printed %v, want %v: %q", got, tt.usage, stderr.String())
			}
		})
	}
}

// fake is a Server that records Close.
type fake struct {
	url      string
	closed   atomic.Int32
	closeErr error
}

func (f *fake) URL() string { return f.url }

func (f *fake) Close() error {
	f.closed.Add(1)
	return f.closeErr
}

func TestServing(t *testing.T) {
	errParse, errStart, errClose := errors.New("bad flags"), errors.New("cannot listen"), errors.New("close failed")
	tests := []struct {
		name     string
		args     []string
		parseErr error
		startErr error
		closeErr error
		wantErr  error
		started  bool
	}{
		{name: "serves until cancelled", args: []string{"a"}, started: true},
		{name: "close error", args: []string{"a"}, closeErr: errClose, wantErr: errClose, started: true},
		{name: "parse error", parseErr: errParse, wantErr: errParse},
		{name: "start error", startErr: errStart, wantErr: errStart},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := &fake{url: "http://127.0.0.1:1234", closeErr: tt.closeErr}
			var gotArgs []string
			var gotCfg string
			parse := func(args []string, stderr io.Writer) (string, error) {
				gotArgs = args
				return "cfg", tt.parseErr
			}
			start := func(cfg string) (*fake, error) {
				gotCfg = cfg
				if tt.startErr != nil {
					return nil, tt.startErr
				}
				return srv, nil
			}
			run := Serving(parse, start)
			if !tt.started {
				var stdout bytes.Buffer
				err := run(context.Background(), tt.args, &stdout, io.Discard)
				if !errors.Is(err, tt.wantErr) || stdout.Len() != 0 || srv.closed.Load() != 0 {
					t.Fatalf("err %v, stdout %q, closed %d", err, stdout.String(), srv.closed.Load())
				}
				return
			}
			url, stop := Started(t, run, tt.args...)
			if url != srv.url || gotCfg != "cfg" || strings.Join(gotArgs, " ") != strings.Join(tt.args, " ") {
				t.Fatalf("url %q, cfg %q, args %q", url, gotCfg, gotArgs)
			}
			if n := srv.closed.Load(); n != 0 {
				t.Fatalf("closed %d times while serving", n)
			}
			if err := stop(); !errors.Is(err, tt.wantErr) {
				t.Fatalf("stop = %v, want %v", err, tt.wantErr)
			}
			if err := stop(); !errors.Is(err, tt.wantErr) {
				t.Fatalf("second stop = %v, want %v", err, tt.wantErr)
			}
			if n := srv.closed.Load(); n != 1 {
				t.Fatalf("closed %d times, want 1", n)
			}
		})
	}
}

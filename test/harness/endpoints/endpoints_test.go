package endpoints

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// standIn is a backend: /readyz answers 200 while ready, the chat route answers JSON.
type standIn struct {
	*httptest.Server
	ready  atomic.Bool
	served atomic.Int64
}

func newStandIn(t *testing.T) *standIn {
	t.Helper()
	b := &standIn{}
	b.ready.Store(true)
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			if !b.ready.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		case "/v1/chat/completions":
			_, _ = io.Copy(io.Discard, r.Body)
			b.served.Add(1)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"x"}`)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(b.Close)
	return b
}

func (b *standIn) hostPort() string { return strings.TrimPrefix(b.URL, "http://") }

// The Service balances over the ready backends, drops one only after its probe failed
// FailureThreshold times in a row and puts it back after one success; the load counts the
// requests that fail once no standIn serves them.
func TestServiceAndLoad(t *testing.T) {
	a, b := newStandIn(t), newStandIn(t)
	svc, err := NewService(Probe{Path: "/readyz", Period: 20 * time.Millisecond, FailureThreshold: 3}, a.hostPort(), b.hostPort())
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := svc.WaitEndpoints(ctx, a.hostPort(), b.hostPort()); err != nil {
		t.Fatal(err)
	}
	load := StartLoad(svc.URL(), 4, Chat("m", 1))
	defer load.Stop()
	if err := load.WaitServed(ctx, 50); err != nil {
		t.Fatal(err)
	}
	if a.served.Load() == 0 || b.served.Load() == 0 {
		t.Fatalf("served by a %d, b %d: want both", a.served.Load(), b.served.Load())
	}

	a.ready.Store(false)
	if err := svc.WaitEndpoints(ctx, b.hostPort()); err != nil {
		t.Fatal(err)
	}
	a.ready.Store(true)
	if err := svc.WaitEndpoints(ctx, a.hostPort(), b.hostPort()); err != nil {
		t.Fatal(err)
	}
	if r := load.Result(); r.Failed != 0 {
		t.Fatalf("failures while both backends served: %v", r.Failures)
	}

	// Both backends gone: kept-alive connections break, new ones find no endpoint.
	a.CloseClientConnections()
	b.CloseClientConnections()
	a.Close()
	b.Close()
	if err := load.WaitFor(ctx, func(r Result) bool { return r.Failed >= 10 }); err != nil {
		t.Fatal(err)
	}
	if err := svc.WaitEndpoints(ctx); err != nil {
		t.Fatal(err)
	}
	res := load.Stop()
	if len(res.Failures) == 0 || len(res.Failures) > maxFailures {
		t.Fatalf("%d failure reasons kept, want 1 to %d", len(res.Failures), maxFailures)
	}
}

func TestNewServiceRefusesABadProbe(t *testing.T) {
	tests := map[string]Probe{
		"no path":           {Period: time.Second, FailureThreshold: 1},
		"no period":         {Path: "/readyz", FailureThreshold: 1},
		"no failure needed": {Path: "/readyz", Period: time.Second},
	}
	for name, p := range tests {
		t.Run(name, func(t *testing.T) {
			if svc, err := NewService(p, "127.0.0.1:1"); err == nil {
				svc.Close()
				t.Fatalf("accepted %+v", p)
			}
		})
	}
}

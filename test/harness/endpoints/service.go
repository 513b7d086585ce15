// Package endpoints is what a rollout looks like from a client, on loopback and on a node: a
// Service model (Service) that sends each new TCP connection to one of its ready backends, drops
// a backend from its endpoints only after its readiness probe failed a few times in a row, and
// keeps every connection on the backend it was opened to (as kube-proxy does: a terminating pod
// keeps receiving new connections until the endpoints converge, and kept-alive connections stay
// on it until one side closes them); and a steady client load (Load) that counts the requests
// that failed.
//
// The process-level drain test of the coordinator (cmd/coordinator) runs both against coordinator
// processes; the real-node tier points Load at a Service URL of a cluster and counts failures
// across `kubectl rollout restart`.
package endpoints

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Probe configures the Service's readiness probe of each backend, as a pod's readinessProbe:
// GET Path every Period (a new connection each time, as the kubelet probes); FailureThreshold
// failures in a row take the backend out of the endpoints, one success puts it back.
type Probe struct {
	Path             string
	Period           time.Duration
	FailureThreshold int
}

// Service balances the TCP connections it accepts over its ready backends, round robin.
type Service struct {
	l     net.Listener
	probe Probe
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup

	mu       sync.Mutex
	backends []*backend
	next     int
	conns    map[net.Conn]struct{}
	changed  chan struct{} // closed and replaced when a backend's readiness changes
	refused  int           // connections no ready backend could take
}

type backend struct {
	addr     string
	ready    bool
	failures int
}

// NewService listens on a free loopback port and starts probing backends (host:port each); none
// is ready before its first successful probe.
func NewService(probe Probe, backends ...string) (*Service, error) {
	if probe.Period <= 0 || probe.FailureThreshold < 1 || probe.Path == "" {
		return nil, fmt.Errorf("probe %+v: a path, a positive period and a failure threshold of at least 1 are needed", probe)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &Service{l: l, probe: probe, ctx: ctx, stop: stop, conns: map[net.Conn]struct{}{}, changed: make(chan struct{})}
	for _, addr := range backends {
		b := &backend{addr: addr}
		s.backends = append(s.backends, b)
		s.wg.Go(func() { s.probeLoop(ctx, b) })
	}
	s.wg.Go(s.accept)
	return s, nil
}

// URL is the Service's base URL (http://127.0.0.1:port).
func (s *Service) URL() string { return "http://" + s.l.Addr().String() }

// Endpoints are the ready backends, in the order they were given.
func (s *Service) Endpoints() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, b := range s.backends {
		if b.ready {
			out = append(out, b.addr)
		}
	}
	return out
}

// Refused is the number of connections the Service closed because no backend was ready.
func (s *Service) Refused() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

// WaitEndpoints waits until the ready backends are exactly want (in the order given to
// NewService), or ctx ends.
func (s *Service) WaitEndpoints(ctx context.Context, want ...string) error {
	for {
		s.mu.Lock()
		changed := s.changed
		s.mu.Unlock()
		got := s.Endpoints()
		if slices.Equal(got, want) {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("endpoints %v, want %v: %w", got, want, ctx.Err())
		}
	}
}

// Close stops listening and probing and closes every connection.
func (s *Service) Close() {
	s.mu.Lock()
	s.stop()
	s.mu.Unlock()
	_ = s.l.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *Service) probeLoop(ctx context.Context, b *backend) {
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: s.probe.Period}
	t := time.NewTicker(s.probe.Period)
	defer t.Stop()
	for {
		ok := probeOnce(ctx, client, "http://"+b.addr+s.probe.Path)
		s.mu.Lock()
		was := b.ready
		if ok {
			b.failures, b.ready = 0, true
		} else if b.failures++; b.failures >= s.probe.FailureThreshold {
			b.ready = false
		}
		if was != b.ready {
			close(s.changed)
			s.changed = make(chan struct{})
		}
		s.mu.Unlock()
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// probeOnce reports whether GET url answers 2xx or 3xx, as the kubelet's HTTP probe counts.
func probeOnce(ctx context.Context, client *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 400
}

// pick is the next ready backend, round robin; "" when none is ready.
func (s *Service) pick() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range s.backends {
		b := s.backends[s.next%len(s.backends)]
		s.next++
		if b.ready {
			return b.addr
		}
	}
	s.refused++
	return ""
}

func (s *Service) accept() {
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		s.wg.Go(func() { s.forward(c) })
	}
}

// forward pipes client c to a backend until either side closes. A backend that refuses the
// connection makes c fail the way a refused DNAT-ed connection does: closed at once.
func (s *Service) forward(c net.Conn) {
	defer c.Close()
	addr := s.pick()
	if addr == "" {
		return
	}
	up, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	if !s.track(c, up) {
		return
	}
	defer s.untrack(c, up)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done // either side closed: so does the other (HTTP/1 clients do not half-close)
}

func (s *Service) track(conns ...net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil { // closing: Close may have walked the connections already
		return false
	}
	for _, c := range conns {
		s.conns[c] = struct{}{}
	}
	return true
}

func (s *Service) untrack(conns ...net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range conns {
		delete(s.conns, c)
	}
}

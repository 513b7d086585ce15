// Package loopback runs the HTTP servers of the test doubles (simworker, gateway, media server):
// listen, serve, report a dialable URL, and stop cancelling whatever is in flight.
package loopback

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Server is a running HTTP server.
type Server struct {
	url       string
	ln        net.Listener
	srv       *http.Server
	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error

	mu    sync.Mutex
	conns map[net.Conn]struct{} // the open connections, for Kill
}

// Serve listens on addr ("" means 127.0.0.1:0) and serves h until Close. Request contexts derive
// from a context Close cancels, so streams in flight end at once.
func Serve(addr string, h http.Handler) (*Server, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		url:    "http://" + dialable(ln.Addr()),
		ln:     ln,
		cancel: cancel,
		done:   make(chan struct{}),
		conns:  map[net.Conn]struct{}{},
	}
	s.srv = &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ConnState:         s.track,
	}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

// URL is the base URL ("http://127.0.0.1:port").
func (s *Server) URL() string { return s.url }

// Close cancels in-flight requests and shuts the server down; it is safe to call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.srv.Shutdown(ctx); err != nil {
			s.closeErr = errors.Join(err, s.srv.Close())
		}
		<-s.done
	})
	return s.closeErr
}

// track keeps the set of open connections for Kill.
func (s *Server) track(c net.Conn, state http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch state {
	case http.StateNew:
		s.conns[c] = struct{}{}
	case http.StateHijacked, http.StateClosed:
		delete(s.conns, c)
	}
}

// Kill stops the server the way a killed process stops: the listener closes (dials are refused)
// and every open connection is reset (SO_LINGER 0), with no response finished; in-flight request
// contexts are cancelled. It is safe to call more than once, and before or after Close.
func (s *Server) Kill() {
	s.closeOnce.Do(func() {
		_ = s.ln.Close()
		<-s.done // Serve has returned: every accepted connection is tracked
		s.mu.Lock()
		for c := range s.conns {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
		}
		s.mu.Unlock()
		_ = s.srv.Close() // closes the connections, which now reset
		s.cancel()
	})
}

// dialable turns a listen address into one a client can dial (an unspecified host becomes
// 127.0.0.1).
func dialable(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	if ta.IP == nil || ta.IP.IsUnspecified() {
		return net.JoinHostPort("127.0.0.1", strconv.Itoa(ta.Port))
	}
	return ta.String()
}

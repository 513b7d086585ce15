// Package mediaserver is a loopback HTTP media host for media-download tests
// of the coordinator. It serves deterministic content and records the headers
// of every request, so tests can assert, for example, that credentials were
// never forwarded to a media host.
//
// Endpoints (GET and HEAD):
//
//	/img/{name}.png          a real PNG (see PNG), size varying with name
//	/audio/{name}.wav, /audio/{name}.mp3
//	                         a real WAV or MP3 file (see WAV, MP3)
//	/video/{name}.mp4, /video/{name}.webm
//	                         a real MP4 or WebM file (see MP4, WebM)
//	                         (these four and /img take ?type=T: that Content-Type
//	                         instead of the file's, or none without one, so that
//	                         the client sniffs)
//	/held/{name}.png         the same PNG, answered once Release was called
//	                         (see WaitHeld: tests observe concurrent downloads)
//	/big?bytes=N[&chunked=1][&type=T][&declare=M]
//	                         N bytes (see BigBody) of type T, image/jpeg by
//	                         default; with chunked=1 there is no Content-Length,
//	                         with declare=M (at least N) it says M: a body cut short
//	/slow?delay=D[&mode=body] a PNG after delay D (Go duration or integer
//	                         milliseconds); mode=body sends headers at once
//	                         and delays only the body
//	/status/{code}           an empty-ish answer with that status (200-599)
//	/redirect?to=URL[&code=C] a redirect (default 302) to URL, which may be
//	                         anything, e.g. a blocked address
package mediaserver

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/epd-dev/coordinator/test/internal/loopback"
)

// Request is one request the server received.
type Request struct {
	Method     string
	Path       string
	Query      string
	Header     http.Header
	RemoteAddr string
	Time       time.Time
}

// Server is the media host. It is an http.Handler; Start also runs it on its
// own listener. All methods are safe for concurrent use.
type Server struct {
	mux *http.ServeMux

	mu       sync.Mutex
	requests []Request
	// The /held gate: open is closed by Release; waiting counts the requests held now (peak the
	// most at once), and changed is closed and replaced whenever waiting changes.
	open          chan struct{}
	releaseOnce   sync.Once
	waiting, peak int
	changed       chan struct{}

	srv *loopback.Server
}

// New returns a Server that is not listening; mount it on any http.Server.
func New() *Server {
	s := &Server{mux: http.NewServeMux(), open: make(chan struct{}), changed: make(chan struct{})}
	s.mux.HandleFunc("GET /img/{file}", handleImage)
	s.mux.HandleFunc("GET /audio/{file}", handleAV("audio"))
	s.mux.HandleFunc("GET /video/{file}", handleAV("video"))
	s.mux.HandleFunc("GET /held/{file}", s.handleHeld)
	s.mux.HandleFunc("GET /big", handleBig)
	s.mux.HandleFunc("GET /slow", handleSlow)
	s.mux.HandleFunc("GET /status/{code}", handleStatus)
	s.mux.HandleFunc("GET /redirect", handleRedirect)
	return s
}

// Start returns a Server listening on 127.0.0.1 on a free port until Close.
func Start() (*Server, error) {
	s := New()
	srv, err := loopback.Serve("", s)
	if err != nil {
		return nil, err
	}
	s.srv = srv
	return s, nil
}

// URL returns the base URL of a started Server, or "" for one made by New.
func (s *Server) URL() string {
	if s.srv == nil {
		return ""
	}
	return s.srv.URL()
}

// Close stops a started Server, cancelling in-flight requests. It is safe to
// call more than once.
func (s *Server) Close() error {
	if s.srv == nil {
		return nil
	}
	return s.srv.Close()
}

// Requests returns copies of the requests received so far, oldest first.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, len(s.requests))
	for i, r := range s.requests {
		out[i] = r
		out[i].Header = r.Header.Clone()
	}
	return out
}

// Reset forgets the recorded requests.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = nil
}

// ServeHTTP records the request and serves it.
func (s *Server) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests = append(s.requests, Request{
		Method:     r.Method,
		Path:       r.URL.Path,
		Query:      r.URL.RawQuery,
		Header:     r.Header.Clone(),
		RemoteAddr: r.RemoteAddr,
		Time:       time.Now(),
	})
	s.mu.Unlock()
	s.mux.ServeHTTP(rw, r)
}

// handleStatus answers /status/{code}.
func handleStatus(rw http.ResponseWriter, r *http.Request) {
	code, err := strconv.Atoi(r.PathValue("code"))
	if err != nil || code < 200 || code > 599 {
		http.Error(rw, "status must be an integer in [200, 599]", http.StatusBadRequest)
		return
	}
	rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
	rw.WriteHeader(code)
	if code != http.StatusNoContent && code != http.StatusNotModified {
		_, _ = rw.Write([]byte(http.StatusText(code) + "\n"))
	}
}

// handleRedirect answers /redirect?to=URL[&code=C].
func handleRedirect(rw http.ResponseWriter, r *http.Request) {
	to := r.URL.Query().Get("to")
	if to == "" {
		http.Error(rw, "missing to", http.StatusBadRequest)
		return
	}
	code := http.StatusFound
	if c := r.URL.Query().Get("code"); c != "" {
		n, err := strconv.Atoi(c)
		if err != nil || n < 300 || n > 399 {
			http.Error(rw, "code must be a 3xx status", http.StatusBadRequest)
			return
		}
		code = n
	}
	// Set Location verbatim: http.Redirect would rewrite relative targets.
	rw.Header().Set("Location", to)
	rw.WriteHeader(code)
}

// handleHeld answers /held/{name}.png once the gate is open.
func (s *Server) handleHeld(rw http.ResponseWriter, r *http.Request) {
	name, ok := strings.CutSuffix(r.PathValue("file"), ".png")
	if !ok || name == "" {
		http.NotFound(rw, r)
		return
	}
	s.hold(1)
	defer s.hold(-1)
	select {
	case <-s.open:
		writePNG(rw, PNG(name))
	case <-r.Context().Done():
	}
}

// hold counts a /held request in (+1) or out (-1).
func (s *Server) hold(d int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiting += d
	s.peak = max(s.peak, s.waiting)
	close(s.changed)
	s.changed = make(chan struct{})
}

// WaitHeld waits until n /held requests are held at once, or ctx ends.
func (s *Server) WaitHeld(ctx context.Context, n int) error {
	for {
		s.mu.Lock()
		waiting, changed := s.waiting, s.changed
		s.mu.Unlock()
		if waiting >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d /held requests, want %d: %w", waiting, n, ctx.Err())
		case <-changed:
		}
	}
}

// Release answers the held /held requests and every later one at once.
func (s *Server) Release() { s.releaseOnce.Do(func() { close(s.open) }) }

// HeldPeak is the most /held requests held at once so far.
func (s *Server) HeldPeak() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}

package loopback

import (
	"bytes"
	"net"
	"sync"
)

// FreeAddr returns a loopback host:port that was free a moment ago, for a process to listen on.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Log collects a process's output while tests read it (safe for concurrent use).
type Log struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Tail returns at most the last n bytes written, marked with "…" when cut.
func (l *Log) Tail(n int) string {
	out := l.String()
	if len(out) > n {
		out = "…" + out[len(out)-n:]
	}
	return out
}

package upstream

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// LoadCAFile reads a PEM bundle of CA certificates. A file without any certificate is an error.
func LoadCAFile(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// caBundle is a CA file read on first use and again whenever its size or modification time
// changes, so that a rotated bundle (a ConfigMap update) applies to the next connections. A
// bundle that no longer reads keeps the last good one.
type caBundle struct {
	path string

	mu   sync.Mutex
	size int64
	mod  time.Time
	pool *x509.CertPool
}

func (b *caBundle) roots() (*x509.CertPool, error) {
	fi, statErr := os.Stat(b.path)
	b.mu.Lock()
	defer b.mu.Unlock()
	if statErr == nil && b.pool != nil && fi.Size() == b.size && fi.ModTime().Equal(b.mod) {
		return b.pool, nil
	}
	pool, err := LoadCAFile(b.path)
	if err = errors.Join(statErr, err); err != nil {
		if b.pool != nil {
			return b.pool, nil
		}
		return nil, err
	}
	b.pool, b.size, b.mod = pool, fi.Size(), fi.ModTime()
	return pool, nil
}

// tlsDialer dials with dial and verifies the server against the bundle's current CAs and the
// dialled host name, negotiating HTTP/2 when the server offers it.
func tlsDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error), ca *caBundle,
	handshakeTimeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		roots, err := ca.roots()
		if err != nil {
			return nil, fmt.Errorf("CA bundle: %w", err)
		}
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		raw, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		conn := tls.Client(raw, &tls.Config{RootCAs: roots, ServerName: host, NextProtos: []string{"h2", "http/1.1"}, MinVersion: tls.VersionTLS12})
		hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
		defer cancel()
		if err := conn.HandshakeContext(hctx); err != nil {
			_ = raw.Close()
			return nil, err
		}
		return conn, nil
	}
}

package upstream

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/epd-dev/coordinator/dataplane/base/filevalue"
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

// caBundle is a CA file read on first use and again whenever it changes, so that a rotated
// bundle (a ConfigMap update) applies to the next connections. A bundle that no longer reads
// keeps the last good one.
type caBundle = filevalue.Value[*x509.CertPool]

func newCABundle(path string) *caBundle {
	return filevalue.New(func() (*x509.CertPool, error) { return LoadCAFile(path) }, path)
}

// tlsDialer dials with dial and verifies the server against the bundle's current CAs and the
// dialled host name, negotiating HTTP/2 when the server offers it.
func tlsDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error), ca *caBundle,
	handshakeTimeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		roots, err := ca.Get()
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

package conn

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/filevalue"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
)

// Files of a certificate directory (server.cert_path, server.metrics_cert_dir): the layout of a
// kubernetes.io/tls Secret.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// selfSignedValidity is how long the generated certificate is valid; a new one is generated at
// every start.
const selfSignedValidity = 365 * 24 * time.Hour

// TLSConfig is a listener's TLS configuration under cfg's policy (server.tls_min_version,
// server.tls_cipher_suites; HTTP/1.1 only). The certificate is dir's tls.crt and tls.key,
// re-read when they change (a renewal applies to the next handshakes; files that do not load keep
// the last good pair, and say so in the log), or, when dir is empty, a self-signed one generated
// now. An error names key, the setting of dir.
func TLSConfig(cfg config.Server, dir, key string, log logr.Logger) (*tls.Config, error) {
	tc := &tls.Config{
		MinVersion:   cfg.TLSMinVersionID(),
		CipherSuites: cfg.TLSCipherSuiteIDs(),
		NextProtos:   []string{"http/1.1"},
	}
	if dir == "" {
		cert, err := selfSigned(time.Now())
		if err != nil {
			return nil, fmt.Errorf("generating a self-signed certificate: %w", err)
		}
		sum := sha256.Sum256(cert.Leaf.Raw)
		log.V(logging.Info).Info("serving TLS with a self-signed certificate generated at startup ("+key+" is empty)",
			"sha256", hex.EncodeToString(sum[:]), "not_after", cert.Leaf.NotAfter, "dns_names", cert.Leaf.DNSNames)
		tc.Certificates = []tls.Certificate{cert}
		return tc, nil
	}
	certFile, keyFile := filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile)
	pair := filevalue.New(func() (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		return &c, err
	}, certFile, keyFile).WhenStale(func(err error) {
		log.Error(err, "the renewed TLS certificate does not load; serving the last good one", key, dir)
	})
	if _, err := pair.Get(); err != nil {
		return nil, &config.FieldError{Key: key, Reason: fmt.Sprintf("cannot load %s and %s from %s: %v", CertFile, KeyFile, dir, err)}
	}
	tc.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return pair.Get() }
	return tc, nil
}

// selfSigned generates an ECDSA P-256 certificate for localhost, the host name and the loopback
// addresses.
func selfSigned(now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, err
	}
	names := []string{"localhost"}
	if h, err := os.Hostname(); err == nil && h != "" && h != "localhost" {
		names = append(names, h)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"coordinator"}, CommonName: names[len(names)-1]},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(selfSignedValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     names,
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

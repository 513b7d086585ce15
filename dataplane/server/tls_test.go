package server_test

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/server/conn"
	"github.com/epd-dev/coordinator/test/harness/atomicdir"
)

// writeCertDir writes a self-signed certificate for 127.0.0.1 named cn into dir as tls.crt and
// tls.key, the way kubelet updates a Secret volume.
func writeCertDir(t *testing.T, dir, cn string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := atomicdir.Write(dir, map[string][]byte{
		conn.CertFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		conn.KeyFile:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}); err != nil {
		t.Fatal(err)
	}
}

// handshake connects to addr with client and returns the connection state (the error of a
// refused handshake).
func handshake(addr string, client *tls.Config) (tls.ConnectionState, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, client)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	defer conn.Close()
	return conn.ConnectionState(), nil
}

// tlsServer serves the decode pipeline over TLS configured by s (and certificate dir) and returns
// the harness.
func tlsServer(t *testing.T, s config.Server, dir string) *harness {
	t.Helper()
	tc, err := conn.TLSConfig(s, dir, "server.cert_path", logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	return startTLS(t, jsonAnswer, nil, tc)
}

// TestTLSCertificateRotation: the listener serves the certificate in its directory, and a renewed
// one (a Secret update) from the next handshake on, without a restart.
func TestTLSCertificateRotation(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	writeCertDir(t, dir, "first")
	h := tlsServer(t, config.Default().Server, dir)
	client := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the test checks which certificate is served
	leaf := func() string {
		st, err := handshake(h.addr, client)
		if err != nil {
			t.Fatal(err)
		}
		return st.PeerCertificates[0].Subject.CommonName
	}
	if got := leaf(); got != "first" {
		t.Fatalf("served %q", got)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: client}}
	resp, err := hc.Get(h.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Proto != "HTTP/1.1" {
		t.Fatalf("HTTPS request: %s %d", resp.Proto, resp.StatusCode)
	}
	writeCertDir(t, dir, "second")
	if got := leaf(); got != "second" {
		t.Fatalf("the next handshake after the renewal served %q", got)
	}
}

// TestTLSPolicy: the minimum version and the cipher suites are enforced; HTTP/1.1 is the only
// protocol offered.
func TestTLSPolicy(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	writeCertDir(t, dir, "policy")
	tests := map[string]struct {
		min    string
		suites []string
		client *tls.Config
		ok     bool
	}{
		"TLS 1.2 by default":                {client: &tls.Config{MaxVersion: tls.VersionTLS12}, ok: true},
		"TLS 1.1 client refused by default": {client: &tls.Config{MaxVersion: tls.VersionTLS11}},
		"TLS 1.3 minimum refuses TLS 1.2":   {min: "VersionTLS13", client: &tls.Config{MaxVersion: tls.VersionTLS12}},
		"TLS 1.3 minimum serves TLS 1.3":    {min: "VersionTLS13", client: &tls.Config{MinVersion: tls.VersionTLS13}, ok: true},
		"a configured suite": {suites: []string{"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"}, ok: true,
			client: &tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}}},
		"a suite not configured": {suites: []string{"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"},
			client: &tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := config.Default().Server
			if tc.min != "" {
				s.TLSMinVersion = tc.min
			}
			s.TLSCipherSuites = tc.suites
			h := tlsServer(t, s, dir)
			client := tc.client
			client.InsecureSkipVerify = true //nolint:gosec // the policy, not the certificate, is under test
			client.NextProtos = []string{"h2", "http/1.1"}
			st, err := handshake(h.addr, client)
			if (err == nil) != tc.ok {
				t.Fatalf("handshake error %v, want success %v", err, tc.ok)
			}
			if tc.ok && st.NegotiatedProtocol != "http/1.1" {
				t.Fatalf("negotiated %q", st.NegotiatedProtocol)
			}
			if tc.ok && len(tc.suites) > 0 && tls.CipherSuiteName(st.CipherSuite) != tc.suites[0] {
				t.Fatalf("suite %s", tls.CipherSuiteName(st.CipherSuite))
			}
		})
	}
}

// TestTLSSelfSigned: without a certificate directory the listener serves a certificate it
// generated, valid for localhost and the loopback addresses.
func TestTLSSelfSigned(t *testing.T) {
	h := tlsServer(t, config.Default().Server, "")
	st, err := handshake(h.addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // self-signed: verified below
	if err != nil {
		t.Fatal(err)
	}
	leaf := st.PeerCertificates[0]
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	for _, name := range []string{"localhost", "127.0.0.1"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: name}); err != nil {
			t.Errorf("not valid for %s: %v", name, err)
		}
	}
	if leaf.Subject.Organization[0] != "coordinator" || time.Until(leaf.NotAfter) < 300*24*time.Hour {
		t.Errorf("subject %v, not after %v", leaf.Subject, leaf.NotAfter)
	}
}

// TestTLSConnections: plain HTTP on the TLS port gets a JSON 400; the framing checks and JSON
// errors work over TLS as over TCP.
func TestTLSConnections(t *testing.T) {
	h := tlsServer(t, config.Default().Server, "")
	resps, closed := exchange(t, h.addr, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
	if len(resps) != 1 || resps[0].StatusCode != http.StatusBadRequest || !closed {
		t.Fatalf("plain HTTP to the TLS port: %d responses, closed %v", len(resps), closed)
	}
	if e := decodeError(t, resps[0].Response, resps[0].body); e.Error.Code != "tls_required" {
		t.Fatalf("code %q", e.Error.Code)
	}

	conn, err := tls.Dial("tcp", h.addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // framing, not the certificate, is under test
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"+
		"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	all, _ := io.ReadAll(conn)
	if n := strings.Count(string(all), "HTTP/1.1 "); n != 1 {
		t.Fatalf("%d responses over TLS, want 1:\n%s", n, all)
	}
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(string(all))), nil)
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("%v %v", resp, err)
	}
	if h.up.count() != 0 {
		t.Fatal("the smuggled request was forwarded")
	}
}

func TestTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	_, err := conn.TLSConfig(config.Default().Server, dir, "server.metrics_cert_dir", logr.Discard())
	if config.KeyOf(err) != "server.metrics_cert_dir" || !strings.Contains(err.Error(), "tls.crt") {
		t.Fatalf("err = %v, want one naming server.metrics_cert_dir and the files", err)
	}
}

package upstream

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"math/big"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func selfSignedPEM(t *testing.T, name string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestCABundleReload: the bundle is re-read when the file changes, and a file that stops being a
// bundle (a half-written update, a removal) keeps the last good CAs.
func TestCABundleReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ca.crt")
	b := newCABundle(path)
	if _, err := b.Get(); err == nil {
		t.Fatal("a missing bundle was accepted before any was read")
	}
	steps := []struct {
		name    string
		content []byte // nil: remove the file
		want    string // the subject the pool must hold
	}{
		{name: "first bundle", content: selfSignedPEM(t, "ca-1"), want: "ca-1"},
		{name: "rotated", content: append(selfSignedPEM(t, "ca-2"), selfSignedPEM(t, "ca-2b")...), want: "ca-2"},
		{name: "garbage keeps the last good", content: []byte("-----BEGIN CERT"), want: "ca-2"},
		{name: "removal keeps the last good", want: "ca-2"},
		{name: "back", content: selfSignedPEM(t, "ca-3"), want: "ca-3"},
	}
	for _, s := range steps {
		if s.content == nil {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(path, s.content, 0o600); err != nil {
			t.Fatal(err)
		}
		pool, err := b.Get()
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		found := false
		for _, subj := range pool.Subjects() { //nolint:staticcheck // a pool built from PEM, not the system roots
			var name pkix.RDNSequence
			if _, err := asn1.Unmarshal(subj, &name); err == nil {
				var n pkix.Name
				n.FillFromRDNSequence(&name)
				found = found || n.CommonName == s.want
			}
		}
		if !found {
			t.Fatalf("%s: the pool does not hold %s", s.name, s.want)
		}
	}
}

// writeServerCA writes the certificate of an httptest TLS server as a CA bundle and returns its
// path.
func writeServerCA(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

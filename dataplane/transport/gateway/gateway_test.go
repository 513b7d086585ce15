package gateway

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
)

// Every leg carries its profile under each of gateway.profile_headers (the client's own profile
// and Prefer headers never pass), and Prefer only when the leg sets it.
func TestLegHeaders(t *testing.T) {
	seen := make(chan http.Header, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		_, _ = io.WriteString(w, "{}")
	}))
	defer srv.Close()
	client := http.Header{"Epp-Profile": {"decode"}, "X-Llm-D-Epp-Profile": {"decode"}, "X-Custom-Profile": {"decode"},
		"Prefer": {"if-available"}, "Authorization": {"Bearer k"}}
	tests := map[string]struct {
		headers []string // gateway.profile_headers (nil: the default)
		leg     Leg
		want    map[string]string // profile headers and Prefer as the gateway sees them
	}{
		"default: both spellings": {leg: Leg{Profile: ProfilePrefill},
			want: map[string]string{"X-Llm-D-Epp-Profile": "prefill", "Epp-Profile": "prefill", "Prefer": ""}},
		"conditional decode": {leg: Leg{Profile: ProfileDecode, Prefer: PreferIfAvailable},
			want: map[string]string{"X-Llm-D-Epp-Profile": "decode", "Epp-Profile": "decode", "Prefer": "if-available"}},
		"current llm-d only": {headers: []string{"x-llm-d-epp-profile"}, leg: Leg{Profile: ProfileEncode},
			want: map[string]string{"X-Llm-D-Epp-Profile": "encode", "Epp-Profile": ""}},
		"a custom name overrides the client's value": {headers: []string{"X-Custom-Profile"}, leg: Leg{Profile: ProfileEncode},
			want: map[string]string{"X-Custom-Profile": "encode", "Epp-Profile": "", "X-Llm-D-Epp-Profile": ""}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c, err := New(config.Gateway{Address: srv.URL, Timeout: config.Duration(5 * time.Second), ProfileHeaders: tc.headers}, observe.Telemetry{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			tc.leg.Request = upstream.Request{Path: "/v1/chat/completions", Header: Forwarded(client), RequestID: "rid",
				Body: strings.NewReader("{}"), Size: 2}
			if _, err := c.Fetch(context.Background(), logr.Discard(), func() (Leg, error) { return tc.leg, nil }); err != nil {
				t.Fatal(err)
			}
			h := <-seen
			for k, v := range tc.want {
				if got := h.Values(k); v == "" && len(got) != 0 || v != "" && (len(got) != 1 || got[0] != v) {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			if h.Get("Authorization") != "Bearer k" || h.Get(upstream.RequestIDHeader) != "rid" {
				t.Fatalf("headers %v", h)
			}
		})
	}
}

func TestNewNeedsAnAddress(t *testing.T) {
	for _, addr := range []string{"", "gateway:80", "ftp://gateway"} {
		if _, err := New(config.Gateway{Address: addr}, observe.Telemetry{}, nil); err == nil {
			t.Errorf("New(%q) succeeded", addr)
		}
	}
}

func TestForwardedRoutingHeaders(t *testing.T) {
	client := http.Header{"Authorization": {"Bearer k"}, "Epp-Profile": {"prefill"}, "Prefer": {"if-available"}}
	for _, h := range RoutingHeaders {
		client.Set(h, "client-value")
	}
	tests := map[string]struct {
		forward     func(http.Header) http.Header
		wantRouting bool
	}{
		"untrusted: dropped": {forward: Forwarded},
		"trusted: forwarded": {forward: ForwardedTrusted, wantRouting: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := tc.forward(client)
			for _, h := range RoutingHeaders {
				if (got.Get(h) != "") != tc.wantRouting {
					t.Errorf("%s = %q", h, got.Get(h))
				}
			}
			if got.Get("Authorization") != "Bearer k" || got.Get(ProfileHeader) != "" || got.Get(PreferHeader) != "" {
				t.Errorf("headers %v: the end-to-end header must stay, the gateway client's own must go", got)
			}
		})
	}
	if client.Get(RoutingHeaders[0]) == "" {
		t.Fatal("the client's header set was modified")
	}
}

// caCert is a self-signed CA certificate, PEM-encoded.
func caCert(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestGatewayOverTLS calls an https gateway whose certificate chains to gateway.ca_file: a
// bundle without its CA fails the handshake, and a rotated bundle applies to the next
// connection without rebuilding the client.
func TestGatewayOverTLS(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"proto":"`+r.Proto+`"}`)
	}))
	srv.EnableHTTP2 = true
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake
	srv.StartTLS()
	defer srv.Close()
	gatewayCA := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, caCert(t), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := config.Gateway{Address: srv.URL, Timeout: config.Duration(5 * time.Second), CAFile: caFile}
	if err := CheckCA(cfg); err != nil {
		t.Fatal(err)
	}
	c, err := New(cfg, observe.Telemetry{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	call := func() ([]byte, error) {
		return c.Fetch(context.Background(), logr.Discard(), func() (Leg, error) {
			return Leg{Profile: ProfileDecode, Request: upstream.Request{Path: "/v1/models", Method: http.MethodGet}}, nil
		})
	}
	var unknown x509.UnknownAuthorityError
	if _, err := call(); !errors.As(err, &unknown) {
		t.Fatalf("a gateway outside the bundle: err = %v, want an unknown authority", err)
	}
	if err := os.WriteFile(caFile, append(caCert(t), gatewayCA...), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := call()
	if err != nil || string(out) != `{"proto":"HTTP/2.0"}` {
		t.Fatalf("after the rotation: %s, %v (want HTTP/2 over TLS)", out, err)
	}
}

func TestCheckCA(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{"missing file": filepath.Join(dir, "none.crt"), "no PEM certificate": notPEM} {
		t.Run(name, func(t *testing.T) {
			if err := CheckCA(config.Gateway{CAFile: path}); config.KeyOf(err) != "gateway.ca_file" {
				t.Fatalf("err = %v, want one naming gateway.ca_file", err)
			}
		})
	}
	if err := CheckCA(config.Gateway{}); err != nil {
		t.Fatalf("no bundle configured: %v", err)
	}
}

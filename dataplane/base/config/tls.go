package config

import (
	"crypto/tls"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
)

// TLSVersionNames maps the names server.tls_min_version accepts to crypto/tls versions.
var TLSVersionNames = map[string]uint16{
	"VersionTLS10": tls.VersionTLS10,
	"VersionTLS11": tls.VersionTLS11,
	"VersionTLS12": tls.VersionTLS12,
	"VersionTLS13": tls.VersionTLS13,
}

// legacyCipherNames are the names crypto/tls gave the ChaCha20 suites before Go 1.16 (and that
// Kubernetes components still accept).
var legacyCipherNames = map[string]uint16{
	"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305":   tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
	"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
}

// cipherSuite returns the id of a secure crypto/tls cipher suite name, and whether the name is
// one of crypto/tls's insecure suites.
func cipherSuite(name string) (id uint16, known, insecure bool) {
	if id, ok := legacyCipherNames[name]; ok {
		return id, true, false
	}
	for _, s := range tls.CipherSuites() {
		if s.Name == name {
			return s.ID, true, false
		}
	}
	for _, s := range tls.InsecureCipherSuites() {
		if s.Name == name {
			return s.ID, true, true
		}
	}
	return 0, false, false
}

// TLSMinVersionID is server.tls_min_version as a crypto/tls version (TLS 1.2 when empty).
func (s Server) TLSMinVersionID() uint16 {
	if v, ok := TLSVersionNames[s.TLSMinVersion]; ok {
		return v
	}
	return tls.VersionTLS12
}

// TLSCipherSuiteIDs is server.tls_cipher_suites as crypto/tls ids (nil: Go's defaults).
func (s Server) TLSCipherSuiteIDs() []uint16 {
	var ids []uint16
	for _, name := range s.TLSCipherSuites {
		if id, known, insecure := cipherSuite(name); known && !insecure {
			ids = append(ids, id)
		}
	}
	return ids
}

// MetricsAddr is the admin listener's host:port: server.metrics_host, or the host of
// server.listen_addr, with server.metrics_port.
func (s Server) MetricsAddr() string {
	host := s.MetricsHost
	if host == "" {
		host, _, _ = net.SplitHostPort(s.ListenAddr)
	}
	return net.JoinHostPort(host, fmt.Sprint(s.MetricsPort))
}

// validateTLS checks the listener's TLS and admin settings (no file is read: the operator
// validates configurations whose files exist only in the pod).
func (s Server) validateTLS() error {
	if h := s.MetricsHost; h != "" && (strings.ContainsAny(h, " /[]%") || strings.Contains(h, ":") && net.ParseIP(h) == nil) {
		return fieldErr("server.metrics_host", "must be a host name or an IP address without a port (0.0.0.0 or :: for every interface), got %q", h)
	}
	if _, ok := TLSVersionNames[s.TLSMinVersion]; !ok && s.TLSMinVersion != "" {
		return fieldErr("server.tls_min_version", "unknown TLS version %q (known: %s)", s.TLSMinVersion,
			strings.Join(slices.Sorted(maps.Keys(TLSVersionNames)), ", "))
	}
	for i, name := range s.TLSCipherSuites {
		key := fmt.Sprintf("server.tls_cipher_suites[%d]", i)
		switch _, known, insecure := cipherSuite(name); {
		case !known:
			return fieldErr(key, "cipher suite %q is not supported (the crypto/tls names, e.g. TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)", name)
		case insecure:
			return fieldErr(key, "cipher suite %q is insecure (crypto/tls InsecureCipherSuites) and is not accepted", name)
		}
	}
	return nil
}

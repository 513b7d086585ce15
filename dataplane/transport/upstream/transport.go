package upstream

import (
	"net"
	"net/http"
	"syscall"
	"time"
)

// TransportOptions tune NewTransport.
type TransportOptions struct {
	// MaxIdleConnsPerHost and IdleConnTimeout size the keep-alive pool.
	MaxIdleConnsPerHost int
	IdleConnTimeout     time.Duration
	// ResponseHeaderTimeout bounds the wait for a response's headers (0: none).
	ResponseHeaderTimeout time.Duration
	// DialTimeout bounds connecting (30s when zero); TLSHandshakeTimeout the TLS handshake (10s).
	DialTimeout         time.Duration
	TLSHandshakeTimeout time.Duration
	// Control, when set, vets every address dialled (the media SSRF guard).
	Control func(network, address string, c syscall.RawConn) error
	// CAFile, when set, is the PEM bundle https servers must chain to instead of the system
	// roots; it is re-read when it changes.
	CAFile string
}

// dialerOf is o's dialer.
func dialerOf(o TransportOptions) *net.Dialer {
	d := &net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second, Control: o.Control}
	if d.Timeout == 0 {
		d.Timeout = 30 * time.Second
	}
	return d
}

// NewTransport is net/http's pooled transport for outbound calls to any host (media downloads,
// https upstreams). It ignores HTTP(S)_PROXY (the gateway and
// side services are in-cluster, and a dial guard must see the address actually dialled), and its
// connections write WholeBody request bodies with one vectored write.
func NewTransport(o TransportOptions) *http.Transport {
	d := dialerOf(o)
	tls := o.TLSHandshakeTimeout
	if tls == 0 {
		tls = 10 * time.Second
	}
	t := &http.Transport{
		Proxy:                 nil,
		DialContext:           dialer(d),
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          0,
		MaxIdleConnsPerHost:   o.MaxIdleConnsPerHost,
		IdleConnTimeout:       o.IdleConnTimeout,
		ResponseHeaderTimeout: o.ResponseHeaderTimeout,
		TLSHandshakeTimeout:   tls,
		ExpectContinueTimeout: time.Second,
	}
	if o.CAFile != "" {
		t.DialTLSContext = tlsDialer(t.DialContext, newCABundle(o.CAFile), tls)
	}
	return t
}

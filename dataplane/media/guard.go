package media

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"code.dny.dev/ssrf"
)

// privateRanges are RFC 1918, opened by allow_private_networks.
var privateRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"), netip.MustParsePrefix("192.168.0.0/16"),
}

// netGuard decides where media downloads may go. Addresses are judged by code.dny.dev/ssrf, whose
// deny lists are generated from the IANA special-purpose registries (IPv4: every special-purpose
// prefix; IPv6: everything outside global unicast 2000::/3 and the special prefixes inside it,
// so NAT64, 6to4, Teredo, ULA and link-local are refused), after the operator's allowed networks.
// IPv4-mapped IPv6 addresses are judged as IPv4 and zoned addresses are always refused. The guard
// runs on every dial (the address actually used, after DNS, on every redirect hop) and on every
// URL and redirect target (scheme, port, domain allowlist) before any dial.
type netGuard struct {
	addrs   *ssrf.Guardian
	ports   []uint16
	domains []string
	// allowAddr, when set, exempts addresses, on any port, from the guard (tests only: a
	// loopback media server). It is never set from configuration.
	allowAddr func(netip.Addr) bool
}

// newNetGuard builds a guard; allowed are the operator's networks (allowed_networks, plus RFC 1918
// with allow_private_networks).
func newNetGuard(allowed []netip.Prefix, ports []uint16, domains []string, allowAddr func(netip.Addr) bool) *netGuard {
	var v4, v6 []netip.Prefix
	for _, p := range allowed {
		if p.Addr().Is4() {
			v4 = append(v4, p)
		} else {
			v6 = append(v6, p)
		}
	}
	return &netGuard{
		addrs:     ssrf.New(ssrf.WithAnyPort(), ssrf.WithAllowedV4Prefixes(v4...), ssrf.WithAllowedV6Prefixes(v6...)),
		ports:     ports,
		domains:   domains,
		allowAddr: allowAddr,
	}
}

// Reasons a media URL is refused, as the client is told (never the address, nor the DNS server).
const (
	reasonScheme    = "only http, https and data: URLs are accepted"
	reasonNoHost    = "the URL has no host"
	reasonNonPublic = "the host is a non-public address"
	reasonResolves  = "the host resolves to a non-public address"
	reasonDomain    = "the host is not an allowed media domain"
	reasonRedirects = "too many redirects"
)

// refusal is a media URL the guard refused. Reason is for the client; err, for the log, says
// what was refused and why (it may hold the resolved address).
type refusal struct {
	reason string
	err    error
}

func (r *refusal) Error() string { return r.reason + ": " + r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

func refuse(reason string, format string, args ...any) *refusal {
	return &refusal{reason: reason, err: fmt.Errorf(format, args...)}
}

// checkURL vets a media URL or redirect target before any dial: an http(s) scheme, a host, an
// allowed port, the domain allowlist and, for a literal IP, the address.
func (g *netGuard) checkURL(u *url.URL) *refusal {
	if u.Scheme != "http" && u.Scheme != "https" {
		return refuse(reasonScheme, "scheme %q", u.Scheme)
	}
	host := u.Hostname()
	if host == "" {
		return refuse(reasonNoHost, "no host in %q", u.Redacted())
	}
	exempt := false
	if ip, err := netip.ParseAddr(host); err == nil {
		if err := g.checkAddr(ip); err != nil {
			return &refusal{reason: reasonNonPublic, err: err}
		}
		exempt = g.allowAddr != nil && g.allowAddr(ip.Unmap())
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	if n, err := strconv.ParseUint(port, 10, 16); !exempt && (err != nil || !slices.Contains(g.ports, uint16(n))) {
		return refuse(fmt.Sprintf("port %.10s is not allowed", port), "port %s not in allowed_ports %v", port, g.ports)
	}
	return g.checkHost(host)
}

// checkHost applies the domain allowlist: a host matches a listed domain or any subdomain of it.
func (g *netGuard) checkHost(host string) *refusal {
	if len(g.domains) == 0 {
		return nil
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, d := range g.domains {
		if host == d || strings.HasSuffix(host, "."+d) {
			return nil
		}
	}
	return refuse(reasonDomain, "host %q is not in allowed_domains", host)
}

var errZoned = errors.New("zoned addresses are refused")

// checkAddr rejects an address the downloads may not reach.
func (g *netGuard) checkAddr(a netip.Addr) error {
	if a.Zone() != "" {
		return fmt.Errorf("%s: %w", a, errZoned)
	}
	a = a.Unmap()
	if g.allowAddr != nil && g.allowAddr(a) {
		return nil
	}
	return g.addrs.SafeAddr(a)
}

// control is the net.Dialer Control hook: it sees each resolved address about to be dialled.
func (g *netGuard) control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil || (network != "tcp4" && network != "tcp6") {
		return refuse(reasonResolves, "unexpected dial %s %q", network, address)
	}
	if err := g.checkAddr(ap.Addr()); err != nil {
		return &refusal{reason: reasonResolves, err: err}
	}
	if !slices.Contains(g.ports, ap.Port()) && (g.allowAddr == nil || !g.allowAddr(ap.Addr().Unmap())) {
		return refuse(fmt.Sprintf("port %d is not allowed", ap.Port()), "dial to port %d", ap.Port())
	}
	return nil
}

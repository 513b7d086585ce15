package steps

import (
	"fmt"
	"net/netip"
	"strings"
	"syscall"
)

// alwaysBlocked are address ranges a media download may never reach, whatever the config:
// loopback, link-local (cloud metadata at 169.254.169.254), unspecified, "this network",
// CGNAT, benchmarking, IPv6 unique-local, multicast and broadcast.
var alwaysBlocked = mustPrefixes(
	"0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "100.64.0.0/10", "192.0.0.0/24", "198.18.0.0/15",
	"224.0.0.0/4", "240.0.0.0/4",
	"::/128", "::1/128", "fe80::/10", "fc00::/7", "ff00::/8", "64:ff9b:1::/48",
)

// privateRanges are RFC 1918, blocked unless allow_private_networks is set.
var privateRanges = mustPrefixes("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// netGuard decides which addresses media downloads may connect to. It runs on every dial (so
// DNS answers and every redirect hop are checked on the address actually used) and on every
// redirect's host name (the domain allowlist).
type netGuard struct {
	allowPrivate bool
	domains      []string
	// allowAddr, when set, exempts addresses from the always-blocked list (tests only: a loopback
	// media server). It is never set from configuration.
	allowAddr func(netip.Addr) bool
}

// checkAddr rejects a blocked IP.
func (g *netGuard) checkAddr(a netip.Addr) error {
	a = a.Unmap()
	if g.allowAddr != nil && g.allowAddr(a) {
		return nil
	}
	for _, p := range alwaysBlocked {
		if p.Contains(a) {
			return fmt.Errorf("address %s is not allowed (%s)", a, p)
		}
	}
	if !g.allowPrivate {
		for _, p := range privateRanges {
			if p.Contains(a) {
				return fmt.Errorf("address %s is a private network address (set allow_private_networks to allow it)", a)
			}
		}
	}
	return nil
}

// checkHost applies the domain allowlist: a host matches a listed domain or any subdomain of it.
func (g *netGuard) checkHost(host string) error {
	if len(g.domains) == 0 {
		return nil
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, d := range g.domains {
		if host == d || strings.HasSuffix(host, "."+d) {
			return nil
		}
	}
	return fmt.Errorf("host %q is not in allowed_domains", host)
}

// control is a net.Dialer Control hook: it sees the resolved address about to be dialled.
func (g *netGuard) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("unexpected dial address %q", address)
	}
	if err := g.checkAddr(ap.Addr()); err != nil {
		return &blockedError{err}
	}
	return nil
}

// blockedError marks a dial refused by the guard (a client error, not a media host failure).
type blockedError struct{ err error }

func (e *blockedError) Error() string { return e.err.Error() }
func (e *blockedError) Unwrap() error { return e.err }

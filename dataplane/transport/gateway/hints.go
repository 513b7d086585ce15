package gateway

import (
	"errors"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// Scheduling hints on a conditional decode's 412 (experimental, conditional-decode's hints
// param). The shape is the llm-d RFC llm-d-router#2178's: the picker, having scheduled the other
// profiles in the same cycle, names their picks in x-<profile>-host-port, a comma-separated list
// of ip:port, best first. llm-d's disaggregation headers (x-llm-d-prefiller-host-port,
// x-llm-d-encoder-hosts-ports and their legacy spellings) are read too. The later legs of the
// request are pinned to them (x-llm-d-pin-host-port, which llm-d's endpoint-pin-screener
// honours), first attempt only: a pinned attempt that fails was a stale hint, and the retry
// lets the picker choose.
var hintHeaders = map[string][]string{
	ProfilePrefill: {"X-Prefill-Host-Port", "X-Llm-D-Prefiller-Host-Port", "X-Prefiller-Host-Port"},
	ProfileEncode:  {"X-Encode-Host-Port", "X-Llm-D-Encoder-Hosts-Ports", "X-Encoder-Hosts-Ports"},
}

// Bounds on what a 412 may hint.
const (
	maxHintsPerProfile = 16
	maxHintHeaderLen   = 1024
)

// ReadHints returns the endpoints h hints, by profile (nil when none), and how many values it
// dropped: not an endpoint a pod can have (EndpointOf, with allowed: loopback, link-local,
// multicast and unspecified addresses are refused), over the bounds, or a header over
// maxHintHeaderLen.
func ReadHints(h http.Header, allowed []netip.Prefix) (hints map[string][]string, dropped int) {
	for profile, names := range hintHeaders {
		var v string
		for _, name := range names {
			if v = h.Get(name); v != "" {
				break
			}
		}
		if v == "" {
			continue
		}
		if len(v) > maxHintHeaderLen {
			dropped++
			continue
		}
		var list []string
		for item := range strings.SplitSeq(v, ",") {
			ap, err := EndpointOf(strings.TrimSpace(item), allowed)
			if err != nil || len(list) == maxHintsPerProfile {
				dropped++
				continue
			}
			list = append(list, ap.String())
		}
		if len(list) > 0 {
			if hints == nil {
				hints = map[string][]string{}
			}
			hints[profile] = list
		}
	}
	return hints, dropped
}

// Hinted wraps the build of a leg of profile so that its first attempt is pinned to the
// endpoint rc's hints name for it at index i (modulo their number: encode's items spread over
// them); later attempts, and legs without hints, go wherever the picker chooses.
func Hinted(rc *request.Context, profile string, i int, build Build) Build {
	hints := rc.Hints[profile]
	if len(hints) == 0 {
		return build
	}
	first := true
	return func() (Leg, error) {
		leg, err := build()
		if err != nil || !first {
			return leg, err
		}
		first = false
		return leg.With(PinHeader, hints[i%len(hints)]), nil
	}
}

// ErrNotEndpoint is EndpointOf's error for a value that is not ip:port with a non-zero port and
// no IPv6 zone (a host name, a URL, a bare address).
var ErrNotEndpoint = errors.New("not an ip:port")

// RefusedAddressError is EndpointOf's error for an ip:port whose address no pod has.
type RefusedAddressError struct {
	// Endpoint is the value as named.
	Endpoint netip.AddrPort
	// Reason is what the address is, e.g. "a link-local address".
	Reason string
}

func (e *RefusedAddressError) Error() string { return e.Endpoint.String() + " is " + e.Reason }

// EndpointOf parses a pod endpoint named by the endpoint picker (a 412's hints, a reservation),
// which the coordinator pins legs to and hands workers as their peer (SGLang's bootstrap_host):
// ip:port with a non-zero port, no IPv6 zone, and a unicast address a pod can have. Loopback and
// link-local addresses (169.254.169.254 is the cloud metadata service) are refused unless in one
// of allowed (gateway.allowed_hint_networks); unspecified, broadcast, 0.0.0.0/8 and multicast
// ones (link-local multicast included) always are. Private addresses (10/8, fd00::/8...) are
// accepted: pods live there. An IPv4-mapped IPv6 address is judged, and returned, as its IPv4
// address (::ffff:127.0.0.1 is loopback). The error is ErrNotEndpoint or a *RefusedAddressError.
func EndpointOf(v string, allowed []netip.Prefix) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(v)
	if err != nil || ap.Port() == 0 || ap.Addr().Zone() != "" {
		return netip.AddrPort{}, ErrNotEndpoint
	}
	a := ap.Addr().Unmap()
	reason, liftable := refusal(a)
	if reason != "" && liftable && slices.ContainsFunc(allowed, func(p netip.Prefix) bool { return p.Contains(a) }) {
		reason = ""
	}
	if reason != "" {
		if a != ap.Addr() {
			reason += " (IPv4-mapped " + a.String() + ")"
		}
		return netip.AddrPort{}, &RefusedAddressError{Endpoint: ap, Reason: reason}
	}
	return netip.AddrPortFrom(a, ap.Port()), nil
}

// refusal says what a (unmapped) is when no pod can have it, "" when a pod can; liftable when
// gateway.allowed_hint_networks may admit it all the same.
func refusal(a netip.Addr) (reason string, liftable bool) {
	switch {
	case a.IsUnspecified():
		return "an unspecified address", false
	case a.IsLinkLocalMulticast():
		return "a link-local multicast address", false
	case a.IsMulticast():
		return "a multicast address", false
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "the broadcast address", false
	case a.Is4() && a.As4()[0] == 0:
		return "an address of 0.0.0.0/8 (this host)", false
	case a.IsLoopback():
		return "a loopback address", true
	case a.IsLinkLocalUnicast():
		return "a link-local address", true
	}
	return "", false
}

package gateway

import (
	"net/http"
	"net/netip"
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
// dropped: not a unicast ip:port (endpointOf), over the bounds, or a header over maxHintHeaderLen.
func ReadHints(h http.Header) (hints map[string][]string, dropped int) {
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
			ap, ok := EndpointOf(strings.TrimSpace(item))
			if !ok || len(list) == maxHintsPerProfile {
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

// EndpointOf parses a pod endpoint, ip:port: a unicast address without an IPv6 zone and a
// non-zero port.
func EndpointOf(v string) (netip.AddrPort, bool) {
	ap, err := netip.ParseAddrPort(v)
	a := ap.Addr()
	if err != nil || ap.Port() == 0 || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() {
		return netip.AddrPort{}, false
	}
	return ap, true
}

package steps

import (
	"net/http"
	"strings"

	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
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
	gateway.ProfilePrefill: {"X-Prefill-Host-Port", "X-Llm-D-Prefiller-Host-Port", "X-Prefiller-Host-Port"},
	gateway.ProfileEncode:  {"X-Encode-Host-Port", "X-Llm-D-Encoder-Hosts-Ports", "X-Encoder-Hosts-Ports"},
}

// Bounds on what a 412 may hint.
const (
	maxHintsPerProfile = 16
	maxHintHeaderLen   = 1024
)

// readHints returns the endpoints h hints, by profile (nil when none), and how many values it
// dropped: not a unicast ip:port (endpointOf), over the bounds, or a header over maxHintHeaderLen.
func readHints(h http.Header) (hints map[string][]string, dropped int) {
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
			ap, ok := endpointOf(strings.TrimSpace(item))
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

// hinted wraps the build of a leg of profile so that its first attempt is pinned to the
// endpoint rc's hints name for it at index i (modulo their number: encode's items spread over
// them); later attempts, and legs without hints, go wherever the picker chooses.
func hinted(rc *request.Context, profile string, i int, build gateway.Build) gateway.Build {
	hints := rc.Hints[profile]
	if len(hints) == 0 {
		return build
	}
	first := true
	return func() (gateway.Leg, error) {
		leg, err := build()
		if err != nil || !first {
			return leg, err
		}
		first = false
		return withHeader(leg, gateway.PinHeader, hints[i%len(hints)]), nil
	}
}

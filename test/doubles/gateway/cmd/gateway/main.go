// Command gateway runs a loopback Inference Gateway stand-in (see package
// gateway).
//
// It prints its base URL on stdout once it is listening and serves until
// SIGINT or SIGTERM, then shuts down gracefully.
//
//	gateway --listen 127.0.0.1:8080 \
//	  --pool encode=http://127.0.0.1:8001 \
//	  --pool prefill=http://127.0.0.1:8002,http://127.0.0.1:8003 \
//	  --pool decode=http://127.0.0.1:8004
//
// Its failure modes are flags too: --eject-for, --eject-after, --max-in-flight,
// --retry-after, --route-timeout, --max-request-body-bytes,
// --epp-conditional-decode, --epp-hints and --legacy-reserve (see
// gateway.Config).
package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/epd-dev/coordinator/test/doubles/gateway"
	"github.com/epd-dev/coordinator/test/internal/command"
)

// run serves the gateway its arguments configure until its context is done.
var run = command.Serving(parseFlags, gateway.Start)

func main() { command.Main(run) }

// poolFlag collects repeated --pool profile=url1,url2 flags.
type poolFlag map[string][]string

// String implements flag.Value.
func (p poolFlag) String() string {
	parts := make([]string, 0, len(p))
	for name, urls := range p {
		parts = append(parts, name+"="+strings.Join(urls, ","))
	}
	return strings.Join(parts, " ")
}

// Set implements flag.Value.
func (p poolFlag) Set(v string) error {
	name, urls, ok := strings.Cut(v, "=")
	name = strings.TrimSpace(name)
	if !ok || name == "" || strings.TrimSpace(urls) == "" {
		return fmt.Errorf("want profile=url1,url2, got %q", v)
	}
	for _, u := range strings.Split(urls, ",") {
		if u = strings.TrimSpace(u); u != "" {
			p[name] = append(p[name], u)
		}
	}
	return nil
}

// parseFlags turns command-line flags into a Config.
func parseFlags(args []string, stderr io.Writer) (gateway.Config, error) {
	cfg := gateway.Config{Pools: map[string][]string{}}
	fs := command.FlagSet("gateway", stderr)
	fs.StringVar(&cfg.Addr, "listen", "127.0.0.1:0", "listen address")
	fs.Var(poolFlag(cfg.Pools), "pool", "profile=url1,url2 (repeatable)")
	fs.DurationVar(&cfg.EjectFor, "eject-for", gateway.DefaultEjectFor, "how long a failing backend is ejected (negative: never)")
	fs.IntVar(&cfg.EjectAfter, "eject-after", gateway.DefaultEjectAfter, "consecutive failures that eject a backend")
	fs.IntVar(&cfg.MaxInFlight, "max-in-flight", 0, "requests in flight per pool before shedding with 429 (0: unlimited)")
	fs.DurationVar(&cfg.RetryAfter, "retry-after", gateway.DefaultRetryAfter, "Retry-After of a 429")
	fs.DurationVar(&cfg.RouteTimeout, "route-timeout", 0, "bound on the wait for a backend's response headers, 504 past it (0: none)")
	fs.Int64Var(&cfg.MaxRequestBodyBytes, "max-request-body-bytes", 0, "larger request bodies get 413 (0: no bound)")
	fs.BoolVar(&cfg.EPPConditionalDecode, "epp-conditional-decode", false, "the picker answers decode requests with Prefer: if-available (412 when no backend holds the prompt)")
	fs.BoolVar(&cfg.Hints, "epp-hints", false, "with --epp-conditional-decode, the picker's 412s list the other pools' backends, best first (X-<Profile>-Host-Port)")
	fs.BoolVar(&cfg.LegacyReserve, "legacy-reserve", false, "answer Prefer: reserve-endpoint as the first EPP did: 200 with X-Prefill-Host-Port")
	return cfg, command.Parse(fs, args)
}

// Command simworker runs a simulated vLLM worker (see package simworker).
//
// It prints its base URL on stdout once it is listening and serves until
// SIGINT or SIGTERM, then shuts down gracefully.
//
//	simworker --role prefill --kv-connector kv-nixl --addr 127.0.0.1:8001
//
// With --fault-control, faults are injected over HTTP (see simworker.Fault):
//
//	curl -X POST $URL/sim/faults -d '{"kind":"die-mid-stream","count":2,"after_tokens":3}'
//	curl -X DELETE $URL/sim/faults
package main

import (
	"io"

	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/internal/command"
)

// run serves the worker its arguments configure until its context is done.
var run = command.Serving(parseFlags, simworker.Start)

func main() { command.Main(run) }

// parseFlags turns command-line flags into a Config.
func parseFlags(args []string, stderr io.Writer) (simworker.Config, error) {
	var cfg simworker.Config
	var role, kv, ec string
	fs := command.FlagSet("simworker", stderr)
	fs.StringVar(&cfg.Name, "name", "", "worker name (default simworker-<role>)")
	fs.StringVar(&role, "role", string(simworker.RoleBoth), "role: prefill, decode, both or encode")
	fs.StringVar(&kv, "kv-connector", string(simworker.KVNixl), "KV connector: kv-nixl, kv-sglang, kv-shared-storage or kv-auto (infer per request, like vLLM's MultiConnector)")
	fs.StringVar(&ec, "ec-connector", string(simworker.ECNixl), "EC connector: ec-nixl or ec-shared-storage")
	fs.StringVar(&cfg.KVDir, "kv-dir", "", "shared KV directory (kv-shared-storage)")
	fs.StringVar(&cfg.ECDir, "ec-dir", "", "shared encoder-cache directory (ec-shared-storage)")
	fs.DurationVar(&cfg.TTFT, "ttft", 0, "time to first token")
	fs.DurationVar(&cfg.ITL, "itl", 0, "inter-token latency")
	fs.IntVar(&cfg.DefaultMaxTokens, "default-max-tokens", simworker.DefaultMaxTokens, "completion length when a request sets none")
	fs.IntVar(&cfg.CacheSize, "cache-size", simworker.DefaultCacheSize, "prefix cache capacity, in prompts")
	fs.StringVar(&cfg.ModelName, "model", simworker.DefaultModelName, "the model served: listed by /v1/models; inference requests naming another get 404")
	fs.StringVar(&cfg.Addr, "addr", "127.0.0.1:0", "listen address")
	fs.StringVar(&cfg.AdvertiseHost, "advertise-host", "", "host advertised in transfer parameters (default: the local address)")
	fs.BoolVar(&cfg.StampEvents, "stamp-events", false, "precede each SSE event with a ': sent_ns=<unix nanos>' comment (latency benchmarks)")
	fs.BoolVar(&cfg.DisableRecording, "no-record", false, "keep no copy of received requests (bounded memory under load)")
	fs.DurationVar(&cfg.BootstrapTimeout, "bootstrap-timeout", 0, "kv-sglang: how long a prefill waits for its decode, and a decode for its prefill (0: SGLang's 5m)")
	fs.DurationVar(&cfg.SideChannelTimeout, "side-channel-timeout", 0, "bound on one look-up of a KV or EC transfer on the worker holding it (NIXL handles; 0: 5s)")
	fs.StringVar(&cfg.BootstrapAddr, "bootstrap-addr", "", "kv-sglang: also serve the bootstrap server on this address (SGLang's --disaggregation-bootstrap-port)")
	fs.BoolVar(&cfg.RenderWithoutMetadata, "render-without-metadata", false, "render answers carry no features.mm_metadata (vLLM before vllm-project/vllm#54659)")
	fs.BoolVar(&cfg.FaultControl, "fault-control", false, "serve "+simworker.PathFaults+": POST a JSON fault to inject it, DELETE to clear (fault-tolerance tests)")
	if err := command.Parse(fs, args); err != nil {
		return cfg, err
	}
	cfg.Role = simworker.Role(role)
	cfg.KVConnector = simworker.KVConnector(kv)
	cfg.ECConnector = simworker.ECConnector(ec)
	return cfg, cfg.Validate()
}

package builder

import (
	"net/netip"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/budget"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/broker"
	"github.com/epd-dev/coordinator/dataplane/pipeline/registry"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
)

// Deps are what the builder hands every step factory besides its params.
type Deps struct {
	// Gateway is the pipeline's gateway client, nil without gateway.address: steps that call
	// workers call RequireGateway.
	Gateway *gateway.Client
	// Log is the process logger, with the step's type.
	Log logr.Logger
	// Getenv reads process environment (SGLANG_BOOTSTRAP_PORT); tests substitute it.
	Getenv func(string) string
	// Key is the step's key in the configuration: pipeline.steps[2], or canary.pipeline.steps[2]
	// for a step of the canary.
	Key string
	// Telemetry records metrics and spans.
	Telemetry observe.Telemetry
	// Shared is what the process shares with every step it builds, across reloads.
	Shared Shared
	// Overrides are the embedder's non-configuration settings.
	Overrides Overrides
}

// Shared is what a process hands every pipeline it builds, so that it outlives reloads: its
// byte budgets and the async broker's runtime. A zero field gives each step its own (a
// budget) or none (the runtime: the operator, which only validates pipelines).
type Shared struct {
	// Media counts the media bytes requests in flight hold (replace-media-urls'
	// max_inflight_media_size).
	Media *budget.Bytes
	// Folds counts the bytes force-streamed answers hold while they are folded (decode's
	// force_stream_buffer_size).
	Folds *budget.Bytes
	// Render counts the bytes in-process renders hold for requests in flight (render's
	// max_inflight_render_size).
	Render *budget.Bytes
	// Resume counts the bytes streams keep to be resumed from (gateway.retry.max_resume_memory).
	Resume *budget.Bytes
	// Broker builds the async-broker step's Redis side (redisbroker.Runtime).
	Broker broker.Runtime
}

// Overrides are settings an embedder (tests, the demo, the operator) gives steps outside the
// configuration.
type Overrides struct {
	// MediaAllowAddr exempts addresses from the media downloads' SSRF guard (a loopback media
	// server in tests).
	MediaAllowAddr func(netip.Addr) bool
	// LocalFiles maps a directory a step loads files from at build time (render's tokenizer) to
	// where this process reads it, or reports that it cannot: the operator validating a pipeline
	// whose files are on a volume only the coordinator pods mount. A step then checks its params
	// alone and leaves the files to the pods. Nil: directories are read where they are.
	LocalFiles func(dir string) (local string, ok bool)
}

// RequireGateway records an error on p when there is no gateway client.
func (d Deps) RequireGateway(p *params.Params, step string) {
	if d.Gateway == nil {
		p.FailAt("gateway.address", "is required by step %s (%s)", step, d.Key)
	}
}

// Type is a step type the builder builds.
type Type = registry.Type[Deps]

// Types is the registry step packages add their types to (Register).
var Types = registry.New[Deps]()

// Register adds a step type to Types (see registry.Registry.Register).
func Register(t Type) { Types.Register(t) }

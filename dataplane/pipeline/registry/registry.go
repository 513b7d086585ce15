// Package registry is where step types register themselves (Caddy-style: a step's package adds
// its type in init, and a binary links the steps it serves by importing their packages). A type
// is its factory plus the rules about its place in a pipeline, which the builder checks.
package registry

import (
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/params"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
)

// Factory builds a step from its params. It must not do network I/O: the operator calls it to
// validate pipelines.
type Factory func(deps Deps, p *params.Params) (pipeline.Step, error)

// Capability is something a step produces for later steps.
type Capability string

// Tokens means that the prompt's token ids and each media item's hash and placeholder are known.
const Tokens Capability = "tokens"

// Media means that every media part of a conversational request is guarded: downloaded through
// the SSRF guard and inlined, or refused. Without a step providing it, the server refuses remote
// URLs in those requests, since a worker would fetch them itself.
const Media Capability = "media"

// Need is a capability a step requires from an earlier step, and why.
type Need struct {
	Capability Capability
	Why        string
}

// Type is a registered step type.
type Type struct {
	// Name is the type name, as in pipeline.steps[].type.
	Name string
	// New is the factory.
	New Factory
	// First, when set, says why the step must be the first of its pipeline.
	First string
	// Provides lists the capabilities the step produces.
	Provides []Capability
	// Needs lists the capabilities earlier steps must provide.
	Needs []Need
}

// Deps are the dependencies every factory receives besides its params.
type Deps struct {
	// Gateway is nil when gateway.address is empty; gateway steps call RequireGateway.
	Gateway *gateway.Client
	// Log is the process logger.
	Log logr.Logger
	// Getenv reads process environment (SGLANG_BOOTSTRAP_PORT); tests substitute it.
	Getenv func(string) string
	// Key is the step's key in the configuration: pipeline.steps[2], or canary.pipeline.steps[2]
	// for a step of the canary.
	Key string
	// Telemetry records metrics and spans.
	Telemetry observe.Telemetry
	// Overrides are the embedder's non-configuration settings.
	Overrides Overrides
}

// Overrides are settings an embedder (tests, the demo) gives steps outside the configuration.
type Overrides struct {
	// MediaAllowAddr exempts addresses from the media downloads' SSRF guard (a loopback media
	// server in tests).
	MediaAllowAddr func(netip.Addr) bool
	// BrokerPollInterval and BrokerBackupPollInterval replace the async broker waiters' mailbox
	// polls (200ms without keyspace notifications, 2s behind them).
	BrokerPollInterval, BrokerBackupPollInterval time.Duration
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

// Registry is a set of step types.
type Registry struct {
	mu    sync.RWMutex
	types map[string]Type
}

// New returns an empty registry (tests register their own step types in one).
func New() *Registry { return &Registry{types: map[string]Type{}} }

// Default is the registry step packages add their types to.
var Default = New()

// Register adds a step type to the default registry (see Registry.Register).
func Register(t Type) { Default.Register(t) }

// Register adds a step type. It panics on a duplicate or empty name (a programming error).
func (r *Registry) Register(t Type) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.Name == "" || t.New == nil {
		panic("registry: a step type needs a name and a factory")
	}
	if _, dup := r.types[t.Name]; dup {
		panic("registry: step type registered twice: " + t.Name)
	}
	r.types[t.Name] = t
}

// Lookup returns a registered type.
func (r *Registry) Lookup(name string) (Type, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	t, ok := r.types[name]
	return t, ok
}

// Names lists the registered type names, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.types))
	for n := range r.types {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Providers lists the registered types that provide c, sorted.
func (r *Registry) Providers(c Capability) []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var names []string
	for n, t := range r.types {
		for _, p := range t.Provides {
			if p == c {
				names = append(names, n)
			}
		}
	}
	sort.Strings(names)
	return names
}

// Names lists the step types of the default registry.
func Names() []string { return Default.Names() }

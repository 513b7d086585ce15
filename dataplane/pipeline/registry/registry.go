// Package registry is where step types register (Caddy-style: a step's package adds its type in
// init, and a binary links the steps it serves by importing their packages). A type is its
// factory plus the rules about its place in a pipeline, which the builder checks. A registry is
// generic in what its factories receive besides their params (D: package steps' Deps), so that it
// knows nothing of what steps call.
package registry

import (
	"sort"
	"sync"

	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
)

// Factory builds a step from deps and its params. It must not do network I/O: the operator calls
// it to validate pipelines.
type Factory[D any] func(deps D, p *params.Params) (pipeline.Step, error)

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
type Type[D any] struct {
	// Name is the type name, as in pipeline.steps[].type.
	Name string
	// New is the factory.
	New Factory[D]
	// First, when set, says why the step must be the first of its pipeline.
	First string
	// Provides lists the capabilities the step produces.
	Provides []Capability
	// Needs lists the capabilities earlier steps must provide.
	Needs []Need
}

// Registry is a set of step types whose factories receive D.
type Registry[D any] struct {
	mu    sync.RWMutex
	types map[string]Type[D]
}

// New returns an empty registry (tests register their own step types in one).
func New[D any]() *Registry[D] { return &Registry[D]{types: map[string]Type[D]{}} }

// Register adds a step type. It panics on a duplicate or empty name (a programming error).
func (r *Registry[D]) Register(t Type[D]) {
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
func (r *Registry[D]) Lookup(name string) (Type[D], bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	t, ok := r.types[name]
	return t, ok
}

// Names lists the registered type names, sorted.
func (r *Registry[D]) Names() []string {
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
func (r *Registry[D]) Providers(c Capability) []string {
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

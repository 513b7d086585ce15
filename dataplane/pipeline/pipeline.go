// Package pipeline runs a request through an ordered list of built steps. It defines the Step
// interface and the optional interfaces a step may implement, Pipeline (an immutable list of
// steps with the configuration it came from, whose Execute is the executor) and Holder, which
// swaps pipelines atomically on reload. A pipeline may carry a canary (a second pipeline of the
// same configuration): Pick sends each request wholly through one of the two, by weight. It
// knows no step by name: step types live in the
// registry, and the builder turns a configuration into a Pipeline.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
)

// ErrDone stops the pipeline early with success: the step has written the whole response.
var ErrDone = errors.New("pipeline done")

// Step is one unit of request processing.
type Step interface {
	// Name is the registered type name.
	Name() string
	// Execute reads and enriches rc. It returns nil to continue, ErrDone when it served the
	// response, or an error to abort the request.
	Execute(ctx context.Context, rc *request.Context) error
}

// Terminal is implemented by steps that always write the response (decode). The last step of a
// pipeline must be terminal, and only the last.
type Terminal interface {
	Terminal() bool
}

// IsTerminal reports whether s writes the response.
func IsTerminal(s Step) bool {
	t, ok := s.(Terminal)
	return ok && t.Terminal()
}

// Forwarder sends a request that no step serves (GET /v1/models and other /v1 paths) to the
// workers, as a leg of the decode profile: the pipeline's gateway client.
type Forwarder interface {
	Forward(ctx context.Context, r upstream.Request) (*http.Response, error)
	Closer
}

// Closer is implemented by steps that hold resources (connection pools) to release when a
// reloaded pipeline replaces them.
type Closer interface {
	Close()
}

// Route is an extra HTTP endpoint a step serves on the coordinator's listener (e.g. the async
// broker's GET /v1/requests/{id}). Pattern uses net/http.ServeMux syntax ("GET /v1/requests/{id}").
type Route struct {
	Pattern string
	Handler http.Handler
}

// RouteProvider is implemented by steps that serve extra endpoints. The routes belong to the
// pipeline: they appear and disappear with it on reload.
type RouteProvider interface {
	Routes() []Route
}

// StepInfo describes a built step for introspection (/debug/pipeline).
type StepInfo struct {
	Type   string         `json:"type"`
	Params map[string]any `json:"params"`
}

// Spec is what a Pipeline is made of (the builder fills it in).
type Spec struct {
	// Steps and Info are the built steps and their descriptions, in order.
	Steps []Step
	Info  []StepInfo
	// Tokenizer is the first of Steps that provides the prompt's tokens (render), nil when none
	// does: Tokenize runs it alone.
	Tokenizer Step
	// MediaGuard is the first of Steps that guards the media of conversational requests
	// (registry.Media, replace-media-urls), nil when none does: Tokenize runs it first.
	MediaGuard Step
	// Config and Revision are the configuration the steps were built from and its revision.
	Config   config.Config
	Revision string
	// PipelineRevision is the fingerprint of the pipeline block alone (config.Pipeline.Revision):
	// what the legs, the metrics and the tallies name, and what a promoted canary keeps.
	PipelineRevision string
	// Track is config.TrackStable, or config.TrackCanary for a canary.
	Track string
	// Canary is the canary pipeline this one carries (nil: none) and CanaryWeight the percentage
	// of requests Pick sends it. A canary is closed with the pipeline that carries it.
	Canary       *Pipeline
	CanaryWeight int
	// LoadedAt is when the pipeline was built.
	LoadedAt time.Time
	// Forwarder sends what no step serves to the workers (nil without gateway.address): the
	// pipeline's gateway client, which the pipeline closes.
	Forwarder Forwarder
	// Telemetry records the steps' metrics and spans.
	Telemetry observe.Telemetry
}

// Pipeline is a built, immutable list of steps with the configuration it came from.
type Pipeline struct {
	spec    Spec
	routes  *http.ServeMux
	forward []string // pipeline.forward_response_headers, canonical

	// revisionValue is PipelineRevision as a header value, shared by every leg header (never
	// modified), so stamping a request allocates nothing.
	revisionValue []string
	// picks counts Pick calls, which spread the canary's share evenly.
	picks atomic.Uint64
	// tally counts the requests run on this pipeline's revision; Holder.Swap hands it on to the
	// next pipeline of the same revision.
	tally *Tally

	inflight  atomic.Int64
	retired   atomic.Bool
	closeOnce sync.Once
}

// Tally counts the requests of one pipeline revision and those that failed.
type Tally struct {
	requests, errors atomic.Uint64
}

// Record counts one request; failed when the pipeline failed it (a 5xx, or a response cut).
func (t *Tally) Record(failed bool) {
	t.requests.Add(1)
	if failed {
		t.errors.Add(1)
	}
}

// Counts are the requests recorded and how many of them failed.
func (t *Tally) Counts() (requests, errors uint64) { return t.requests.Load(), t.errors.Load() }

// New assembles a pipeline from built steps; the routes of RouteProvider steps are registered.
func New(spec Spec) *Pipeline {
	p := &Pipeline{spec: spec, tally: &Tally{}, revisionValue: []string{spec.PipelineRevision}}
	for _, name := range spec.Config.Pipeline.ForwardResponseHeaders {
		p.forward = append(p.forward, textproto.CanonicalMIMEHeaderKey(name))
	}
	for _, s := range spec.Steps {
		rp, ok := s.(RouteProvider)
		if !ok {
			continue
		}
		for _, r := range rp.Routes() {
			if p.routes == nil {
				p.routes = http.NewServeMux()
			}
			p.routes.Handle(r.Pattern, r.Handler)
		}
	}
	return p
}

// Execute runs the steps in order. It stops at the first error (wrapped with the step name), at
// ErrDone (success), or when ctx is cancelled between steps. Each step is timed (rc.Timings, the
// step-duration metric) and traced as a child span of ctx.
func (p *Pipeline) Execute(ctx context.Context, rc *request.Context) error {
	return p.execute(ctx, rc, p.spec.Steps)
}

// CanTokenize reports whether the pipeline has a step that provides the prompt's tokens.
func (p *Pipeline) CanTokenize() bool { return p.spec.Tokenizer != nil }

// Tokenize runs only the pipeline's media guard (Spec.MediaGuard, when it has one: the media are
// held to its limits) and tokenizing step (Spec.Tokenizer) on rc, timed and traced as Execute
// does, so that rc.TokenIDs holds the rendered prompt (a token count that renders nothing else and
// sends no inference leg). Without a tokenizing step it does nothing and reports false.
func (p *Pipeline) Tokenize(ctx context.Context, rc *request.Context) (bool, error) {
	if p.spec.Tokenizer == nil {
		return false, nil
	}
	steps := []Step{p.spec.Tokenizer}
	if p.spec.MediaGuard != nil {
		steps = []Step{p.spec.MediaGuard, p.spec.Tokenizer}
	}
	return true, p.execute(ctx, rc, steps)
}

// execute runs steps in order (see Execute).
func (p *Pipeline) execute(ctx context.Context, rc *request.Context, steps []Step) error {
	if rc.Timings == nil {
		rc.Timings = make([]request.StepTiming, 0, len(steps))
	}
	tel := p.spec.Telemetry
	// stepDone ends the running step's metrics; a step that panics still stops counting as running.
	var stepDone func(outcome string, d time.Duration, err error)
	var stepStart time.Time
	defer func() {
		if stepDone != nil {
			stepDone("error", time.Since(stepStart), nil)
		}
	}()
	for _, s := range steps {
		name := s.Name()
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("pipeline cancelled before %s: %w", name, err)
		}
		sctx, span := tel.Start(ctx, "step "+name, trace.SpanKindInternal, observe.AttrStep.String(name))
		rc.StartStep(name)
		stepDone, stepStart = tel.Metrics.StepStarted(name), time.Now()
		err := s.Execute(sctx, rc)
		outcome := "ok"
		switch {
		case errors.Is(err, ErrDone):
			outcome, err = "done", nil
		case err != nil:
			outcome = "error"
		}
		t := rc.EndStep(outcome)
		stepDone(outcome, t.Duration, err)
		stepDone = nil
		if span.IsRecording() {
			span.SetAttributes(attribute.String("coordinator.outcome", outcome))
		}
		observe.End(span, 0, err)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if outcome == "done" {
			return nil
		}
	}
	return nil
}

// Pick returns the pipeline a new request runs on: the canary for CanaryWeight percent of the
// requests, else p. The share is spread evenly and exactly: of every 100 consecutive picks,
// CanaryWeight go to the canary. Only a pipeline acquired from a Holder picks; the request
// holds p (its canary lives as long).
func (p *Pipeline) Pick() *Pipeline {
	w := uint64(p.spec.CanaryWeight)
	if p.spec.Canary == nil || w == 0 {
		return p
	}
	k := (p.picks.Add(1) - 1) % 100
	if (k+1)*w/100 > k*w/100 {
		return p.spec.Canary
	}
	return p
}

// Canary is the canary p carries (nil: none) and its weight in percent.
func (p *Pipeline) Canary() (*Pipeline, int) { return p.spec.Canary, p.spec.CanaryWeight }

// Track is config.TrackStable or config.TrackCanary.
func (p *Pipeline) Track() string { return p.spec.Track }

// PipelineRevision is the fingerprint of the pipeline block (config.Pipeline.Revision).
func (p *Pipeline) PipelineRevision() string { return p.spec.PipelineRevision }

// Stamp sets name (the pipeline-revision header the legs carry) on h, a leg header set, to p's
// revision: the value is shared, so h's values of it must never be modified in place.
func (p *Pipeline) Stamp(h http.Header, name string) { h[name] = p.revisionValue }

// Share is one pipeline that serves requests and the percentage it serves.
type Share struct {
	*Pipeline
	WeightPercent int
}

// Serving are the pipelines p serves requests on: p, with the share its canary leaves it, then
// the canary.
func (p *Pipeline) Serving() []Share {
	c, w := p.Canary()
	if c == nil {
		return []Share{{p, 100}}
	}
	return []Share{{p, 100 - w}, {c, w}}
}

// Tracks describe Serving for the metrics.
func (p *Pipeline) Tracks() []observe.PipelineTrack {
	var out []observe.PipelineTrack
	for _, s := range p.Serving() {
		out = append(out, observe.PipelineTrack{Track: s.Track(), Revision: s.PipelineRevision(), WeightPercent: s.WeightPercent})
	}
	return out
}

// Tally counts the requests run on p's revision since a pipeline of that revision was first
// installed in the Holder.
func (p *Pipeline) Tally() *Tally { return p.tally }

// Config is the configuration the pipeline was built from.
func (p *Pipeline) Config() config.Config { return p.spec.Config }

// ForwardResponse are the canonical names of pipeline.forward_response_headers.
func (p *Pipeline) ForwardResponse() []string { return p.forward }

// Revision is the configuration's fingerprint.
func (p *Pipeline) Revision() string { return p.spec.Revision }

// LoadedAt is when the pipeline was built.
func (p *Pipeline) LoadedAt() time.Time { return p.spec.LoadedAt }

// Steps describes the steps with their effective params.
func (p *Pipeline) Steps() []StepInfo { return p.spec.Info }

// Handler returns the step-provided handler for r, if a step of this pipeline (or else of its
// canary) serves it.
func (p *Pipeline) Handler(r *http.Request) (http.Handler, bool) {
	if p.routes != nil {
		// Serve through the mux itself (not the matched handler) so that r.PathValue works.
		if _, pattern := p.routes.Handler(r); pattern != "" {
			return p.routes, true
		}
	}
	if p.spec.Canary != nil {
		return p.spec.Canary.Handler(r)
	}
	return nil, false
}

// GuardsMedia reports whether a step guards the media of conversational requests (Spec.MediaGuard).
func (p *Pipeline) GuardsMedia() bool { return p.spec.MediaGuard != nil }

// Forwarder sends what no step serves to the workers (nil without gateway.address).
func (p *Pipeline) Forwarder() Forwarder { return p.spec.Forwarder }

// Close releases the steps' and the forwarder's idle connections, and the canary's. In-flight
// requests on this pipeline are unaffected.
func (p *Pipeline) Close() {
	if p.spec.Canary != nil {
		p.spec.Canary.Close()
	}
	for _, s := range p.spec.Steps {
		if c, ok := s.(Closer); ok {
			c.Close()
		}
	}
	if p.spec.Forwarder != nil {
		p.spec.Forwarder.Close()
	}
}

// Holder holds the serving pipeline. Each request acquires the pipeline once and runs to
// completion on it; a reload swaps in a new one without disturbing requests in flight. A replaced
// pipeline is closed (its connection pools released) when its last request finishes.
type Holder struct {
	p atomic.Pointer[Pipeline]
}

// Load returns the current pipeline (nil before the first Swap) without holding it.
func (h *Holder) Load() *Pipeline { return h.p.Load() }

// Acquire returns the current pipeline (nil if none) and a release func to call when the request
// is done with it.
func (h *Holder) Acquire() (*Pipeline, func()) {
	for {
		p := h.p.Load()
		if p == nil {
			return nil, func() {}
		}
		p.inflight.Add(1)
		if h.p.Load() == p {
			return p, p.release
		}
		p.release() // swapped meanwhile: retry on the new one
	}
}

// Swap installs p and retires the previous pipeline, which it returns. p and its canary take
// over the tallies of the previous pipeline and canary of the same revisions, so that a reload
// that keeps a revision (a weight change, a promotion) keeps its counts.
func (h *Holder) Swap(p *Pipeline) *Pipeline {
	if prev := h.p.Load(); prev != nil && p != nil && prev != p {
		tallies := map[string]*Tally{}
		for _, q := range []*Pipeline{prev.spec.Canary, prev} {
			if q != nil {
				tallies[q.spec.PipelineRevision] = q.tally
			}
		}
		for _, q := range []*Pipeline{p.spec.Canary, p} {
			if q == nil {
				continue
			}
			if t, ok := tallies[q.spec.PipelineRevision]; ok {
				q.tally = t
			}
		}
	}
	old := h.p.Swap(p)
	if old != nil && old != p {
		old.retired.Store(true)
		if old.inflight.Load() == 0 {
			old.closeOnce.Do(old.Close)
		}
	}
	return old
}

func (p *Pipeline) release() {
	if p.inflight.Add(-1) == 0 && p.retired.Load() {
		p.closeOnce.Do(p.Close)
	}
}

// Package pipeline runs a request through an ordered list of steps. It defines the Step
// interface, the registry steps add themselves to, the RequestContext they share, and Pipeline:
// an immutable, built set of steps that can be swapped atomically on reload.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/epd-dev/coordinator/dataplane/config"
	"github.com/epd-dev/coordinator/dataplane/gateway"
	"github.com/epd-dev/coordinator/dataplane/observe"
)

// ErrDone stops the pipeline early with success: the step has written the whole response.
var ErrDone = errors.New("pipeline done")

// Step is one unit of request processing.
type Step interface {
	// Name is the registered type name.
	Name() string
	// Execute reads and enriches rc. It returns nil to continue, ErrDone when it served the
	// response, or an error to abort the request.
	Execute(ctx context.Context, rc *RequestContext) error
}

// Terminal is implemented by steps that always write the response (decode). The last step of a
// pipeline must be terminal, and only the last.
type Terminal interface {
	Terminal() bool
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

// Deps are the dependencies every factory receives besides its params.
type Deps struct {
	// Gateway is nil when gateway.address is empty; gateway steps call RequireGateway.
	Gateway *gateway.Client
	// Log is the process logger.
	Log logr.Logger
	// Getenv reads process environment (SGLANG_BOOTSTRAP_PORT); tests substitute it.
	Getenv func(string) string
	// Index is the step's position in pipeline.steps.
	Index int
	// Steps lists the configured step types, for steps whose validity depends on others.
	Steps []string
	// Hooks carries embedder-provided, non-configuration dependencies keyed by step type.
	Hooks map[string]any
	// Telemetry records metrics and spans.
	Telemetry observe.Telemetry
}

// RequireGateway records an error on p when there is no gateway client.
func (d Deps) RequireGateway(p *Params, step string) {
	if d.Gateway == nil && p.err == nil {
		p.err = &config.FieldError{Key: "gateway.address", Reason: fmt.Sprintf("is required by step %s (pipeline.steps[%d])", step, d.Index)}
	}
}

// Factory builds a step from its params. It must not do network I/O: the operator calls it to
// validate pipelines.
type Factory func(deps Deps, p *Params) (Step, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]Factory{}
)

// Register adds a step type. It panics on a duplicate name (a programming error).
func Register(name string, f Factory) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[name]; dup {
		panic("pipeline: step type registered twice: " + name)
	}
	registry[name] = f
}

// Registered lists the registered step types.
func Registered() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func lookup(name string) (Factory, bool) {
	registryMu.RLock()
	defer registryMu.RUnlock()
	f, ok := registry[name]
	return f, ok
}

// Options tune Build.
type Options struct {
	// Log is handed to steps (logr.Discard() when zero).
	Log logr.Logger
	// Getenv defaults to os.Getenv.
	Getenv func(string) string
	// Hooks are passed to factories as Deps.Hooks.
	Hooks map[string]any
	// Now stamps LoadedAt (time.Now when nil).
	Now func() time.Time
	// Telemetry records metrics and spans (none when zero).
	Telemetry observe.Telemetry
	// Revision overrides the reported revision (default cfg.Revision()); the coordinator passes
	// config.FileRevision of the file it loaded.
	Revision string
}

// StepInfo describes a built step for introspection (/debug/pipeline).
type StepInfo struct {
	Type   string         `json:"type"`
	Params map[string]any `json:"params"`
}

// Pipeline is a built, immutable list of steps with the configuration it came from.
type Pipeline struct {
	steps    []Step
	info     []StepInfo
	cfg      config.Config
	revision string
	loadedAt time.Time
	gw       *gateway.Client
	routes   *http.ServeMux
	nroutes  int
	tel      observe.Telemetry

	inflight  atomic.Int64
	retired   atomic.Bool
	closeOnce sync.Once
}

// Build constructs every step of cfg.Pipeline. It checks the pipeline's shape (known types, a
// terminal step last, a render step for tokens-in) and each step's params, without network I/O.
func Build(cfg config.Config, opts Options) (*Pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	var gw *gateway.Client
	if cfg.Gateway.Address != "" {
		var err error
		if gw, err = gateway.New(cfg.Gateway, opts.Telemetry); err != nil {
			return nil, &config.FieldError{Key: "gateway.address", Reason: err.Error()}
		}
	}
	types := make([]string, len(cfg.Pipeline.Steps))
	for i, s := range cfg.Pipeline.Steps {
		types[i] = s.Type
	}
	if err := checkTokensIn(cfg.Pipeline, types); err != nil {
		return nil, err
	}
	inherited := map[string]any{
		"kv_connector":      cfg.Pipeline.KVConnector,
		"ec_connector":      cfg.Pipeline.ECConnector,
		"use_openai_format": cfg.Pipeline.UseOpenAIFormat,
	}
	p := &Pipeline{cfg: cfg, revision: opts.Revision, gw: gw, tel: opts.Telemetry}
	if p.revision == "" {
		p.revision = cfg.Revision()
	}
	for i, sc := range cfg.Pipeline.Steps {
		f, ok := lookup(sc.Type)
		if !ok {
			return nil, &config.FieldError{
				Key:    fmt.Sprintf("pipeline.steps[%d].type", i),
				Reason: fmt.Sprintf("unknown step type %q (known: %s)", sc.Type, strings.Join(Registered(), ", ")),
			}
		}
		params := NewParams(fmt.Sprintf("pipeline.steps[%d].params", i), sc.Params, inherited)
		deps := Deps{Gateway: gw, Log: opts.Log.WithValues("step", sc.Type), Getenv: opts.Getenv, Index: i, Steps: types, Hooks: opts.Hooks, Telemetry: opts.Telemetry}
		step, err := f(deps, params)
		if err == nil {
			err = params.Err()
		}
		if err != nil {
			p.Close()
			var fe *config.FieldError
			if errors.As(err, &fe) {
				return nil, err
			}
			return nil, &config.FieldError{Key: params.Path(), Reason: err.Error()}
		}
		terminal := isTerminal(step)
		last := i == len(cfg.Pipeline.Steps)-1
		if terminal && !last {
			p.Close()
			return nil, &config.FieldError{Key: fmt.Sprintf("pipeline.steps[%d].type", i), Reason: fmt.Sprintf("%s writes the response and must be the last step", sc.Type)}
		}
		if !terminal && last {
			p.Close()
			return nil, &config.FieldError{Key: fmt.Sprintf("pipeline.steps[%d].type", i), Reason: fmt.Sprintf("the last step must write the response (decode), got %s", sc.Type)}
		}
		p.steps = append(p.steps, step)
		p.info = append(p.info, StepInfo{Type: sc.Type, Params: params.Effective()})
		if rp, ok := step.(RouteProvider); ok {
			for _, r := range rp.Routes() {
				if p.routes == nil {
					p.routes = http.NewServeMux()
				}
				p.routes.Handle(r.Pattern, r.Handler)
				p.nroutes++
			}
		}
	}
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	p.loadedAt = now()
	return p, nil
}

func isTerminal(s Step) bool {
	t, ok := s.(Terminal)
	return ok && t.Terminal()
}

// checkTokensIn rejects use_openai_format=false (globally or on a step) without a render step:
// tokens-in legs need the token ids render produces.
func checkTokensIn(pc config.Pipeline, types []string) error {
	for _, t := range types {
		if t == "render" {
			return nil
		}
	}
	if !pc.UseOpenAIFormat {
		return &config.FieldError{Key: "pipeline.use_openai_format", Reason: "false (tokens-in) requires a render step in pipeline.steps"}
	}
	for i, s := range pc.Steps {
		if v, ok := s.Params["use_openai_format"].(bool); ok && !v {
			return &config.FieldError{Key: fmt.Sprintf("pipeline.steps[%d].params.use_openai_format", i), Reason: "false (tokens-in) requires a render step in pipeline.steps"}
		}
	}
	return nil
}

// Execute runs the steps in order. It stops at the first error (wrapped with the step name), at
// ErrDone (success), or when ctx is cancelled between steps. Each step is timed (RequestContext
// Timings, the step-duration metric) and traced as a child span of ctx.
func (p *Pipeline) Execute(ctx context.Context, rc *RequestContext) error {
	if rc.Timings == nil {
		rc.Timings = make([]StepTiming, 0, len(p.steps))
	}
	for _, s := range p.steps {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("pipeline cancelled before %s: %w", s.Name(), err)
		}
		name := s.Name()
		sctx, span := p.tel.Start(ctx, "step "+name, trace.SpanKindInternal, observe.AttrStep.String(name))
		rc.stepStart, rc.step = time.Now(), name
		err := s.Execute(sctx, rc)
		t := StepTiming{Step: name, Duration: time.Since(rc.stepStart), Outcome: "ok"}
		rc.step = ""
		switch {
		case errors.Is(err, ErrDone):
			t.Outcome, err = "done", nil
		case err != nil:
			t.Outcome = "error"
		}
		rc.Timings = append(rc.Timings, t)
		p.tel.Metrics.Step(name, t.Outcome, t.Duration)
		if span.IsRecording() {
			span.SetAttributes(attribute.String("coordinator.outcome", t.Outcome))
		}
		observe.End(span, 0, err)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if t.Outcome == "done" {
			return nil
		}
	}
	return nil
}

// Config is the configuration the pipeline was built from.
func (p *Pipeline) Config() config.Config { return p.cfg }

// Revision is the configuration's fingerprint (config.Config.Revision, or Options.Revision).
func (p *Pipeline) Revision() string { return p.revision }

// LoadedAt is when the pipeline was built.
func (p *Pipeline) LoadedAt() time.Time { return p.loadedAt }

// Steps describes the steps with their effective params.
func (p *Pipeline) Steps() []StepInfo { return p.info }

// Handler returns the step-provided handler for r, if a step of this pipeline serves it.
func (p *Pipeline) Handler(r *http.Request) (http.Handler, bool) {
	if p.routes == nil {
		return nil, false
	}
	// Serve through the mux itself (not the matched handler) so that r.PathValue works.
	_, pattern := p.routes.Handler(r)
	return p.routes, pattern != ""
}

// Gateway is the pipeline's gateway client (nil without gateway.address).
func (p *Pipeline) Gateway() *gateway.Client { return p.gw }

// Close releases the steps' and the gateway client's idle connections. In-flight requests on
// this pipeline are unaffected.
func (p *Pipeline) Close() {
	for _, s := range p.steps {
		if c, ok := s.(Closer); ok {
			c.Close()
		}
	}
	if p.gw != nil {
		p.gw.Close()
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

// Swap installs p and retires the previous pipeline, which it returns.
func (h *Holder) Swap(p *Pipeline) *Pipeline {
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

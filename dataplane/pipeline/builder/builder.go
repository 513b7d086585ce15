// Package builder turns a configuration into a pipeline: it looks every step type up in a
// registry (Types, where step packages register), builds each step from its params and Deps (no
// network I/O, so the operator validates pipelines with it), and checks the pipeline's shape: a
// terminal step last and only last, the placement rules the step types declare, and a
// tokenizing step for tokens-in legs. It makes each pipeline's gateway client.
package builder

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/registry"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/dataplane/transport/retry"
)

// Options tune Build.
type Options struct {
	// Registry holds the step types (Types when nil).
	Registry *registry.Registry[Deps]
	// Log is handed to steps (logr.Discard() when zero).
	Log logr.Logger
	// Getenv defaults to os.Getenv.
	Getenv func(string) string
	// Shared and Overrides are handed to factories as Deps.Shared and Deps.Overrides.
	Shared    Shared
	Overrides Overrides
	// Now stamps LoadedAt (time.Now when nil).
	Now func() time.Time
	// Telemetry records metrics and spans (none when zero).
	Telemetry observe.Telemetry
	// RetryBudget is the process's retry budget, shared by the pipelines it loads (nil: each
	// pipeline's gateway client has its own, so a reload starts it afresh).
	RetryBudget *retry.Budget
	// Revision overrides the reported revision (default cfg.Revision()); the coordinator passes
	// config.FileRevision of the file it loaded.
	Revision string
}

// Build constructs every step of cfg.Pipeline, and of cfg.Canary's pipeline when there is one,
// and checks each pipeline's shape. Every error is a *config.FieldError naming the key at fault
// (canary.pipeline.steps[1].params... for the canary).
func Build(cfg config.Config, opts Options) (*pipeline.Pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Registry == nil {
		opts.Registry = Types
	}
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	if opts.Revision == "" {
		opts.Revision = cfg.Revision()
	}
	loadedAt := time.Now()
	if opts.Now != nil {
		loadedAt = opts.Now()
	}
	spec, err := buildSpec(cfg, "pipeline", opts)
	if err != nil {
		return nil, err
	}
	spec.Track, spec.LoadedAt = config.TrackStable, loadedAt
	if cfg.Canary != nil {
		cs, err := buildSpec(cfg.CanaryConfig(), "canary.pipeline", opts)
		if err != nil {
			pipeline.New(spec).Close()
			return nil, err
		}
		cs.Track, cs.LoadedAt = config.TrackCanary, loadedAt
		spec.Canary, spec.CanaryWeight = pipeline.New(cs), cfg.Canary.WeightPercent
	}
	return pipeline.New(spec), nil
}

// buildSpec builds the steps of cfg.Pipeline, the block found at key, with a gateway client of
// their own. On error everything built is closed.
func buildSpec(cfg config.Config, key string, opts Options) (pipeline.Spec, error) {
	reg := opts.Registry
	types, err := lookup(reg, key, cfg.Pipeline.Steps)
	if err != nil {
		return pipeline.Spec{}, err
	}
	if err := checkPlacement(reg, key, cfg.Pipeline, types); err != nil {
		return pipeline.Spec{}, err
	}
	spec := pipeline.Spec{Config: cfg, Revision: opts.Revision, PipelineRevision: cfg.Pipeline.Revision(), Telemetry: opts.Telemetry}
	var gw *gateway.Client
	if cfg.Gateway.Address != "" {
		if gw, err = gateway.New(cfg.Gateway, opts.Telemetry, opts.RetryBudget); err != nil {
			if config.KeyOf(err) != "" {
				return pipeline.Spec{}, err // gateway.allowed_hint_networks, when cfg was not validated
			}
			return pipeline.Spec{}, &config.FieldError{Key: "gateway.address", Reason: err.Error()}
		}
		spec.Forwarder = gw
	}
	inherited := cfg.Pipeline.StepDefaults()
	for i, sc := range cfg.Pipeline.Steps {
		stepKey := fmt.Sprintf("%s.steps[%d]", key, i)
		p := params.New(stepKey+".params", sc.Params, inherited)
		deps := Deps{Gateway: gw, Log: opts.Log.WithValues("step", sc.Type), Getenv: opts.Getenv,
			Key: stepKey, Telemetry: opts.Telemetry, Shared: opts.Shared, Overrides: opts.Overrides}
		step, err := types[i].New(deps, p)
		if err == nil {
			err = p.Err()
		}
		if err == nil {
			err = checkTerminal(step, stepKey, i, len(cfg.Pipeline.Steps))
		}
		if err != nil {
			pipeline.New(spec).Close()
			var fe *config.FieldError
			if errors.As(err, &fe) {
				return pipeline.Spec{}, err
			}
			return pipeline.Spec{}, &config.FieldError{Key: p.Path(), Reason: err.Error()}
		}
		spec.Steps = append(spec.Steps, step)
		spec.Info = append(spec.Info, pipeline.StepInfo{Type: sc.Type, Params: p.Effective()})
		if spec.Tokenizer == nil && slices.Contains(types[i].Provides, registry.Tokens) {
			spec.Tokenizer = step
		}
		if spec.MediaGuard == nil && slices.Contains(types[i].Provides, registry.Media) {
			spec.MediaGuard = step
		}
	}
	return spec, nil
}

func lookup(reg *registry.Registry[Deps], key string, steps []config.Step) ([]Type, error) {
	types := make([]Type, len(steps))
	for i, s := range steps {
		t, ok := reg.Lookup(s.Type)
		if !ok {
			return nil, &config.FieldError{
				Key:    fmt.Sprintf("%s.steps[%d].type", key, i),
				Reason: fmt.Sprintf("unknown step type %q (known: %s)", s.Type, strings.Join(reg.Names(), ", ")),
			}
		}
		types[i] = t
	}
	return types, nil
}

// checkPlacement checks the rules the step types declare (first, needs an earlier provider) and
// that tokens-in legs (use_openai_format false, pipeline-wide or on a step) have a step that
// provides the tokens. key is the pipeline block's key.
func checkPlacement(reg *registry.Registry[Deps], key string, pc config.Pipeline, types []Type) error {
	provided := map[registry.Capability]bool{}
	for i, t := range types {
		if t.First != "" && i != 0 {
			return &config.FieldError{Key: fmt.Sprintf("%s.steps[%d].type", key, i),
				Reason: fmt.Sprintf("%s must be the first step (%s), found at position %d", t.Name, t.First, i)}
		}
		for _, n := range t.Needs {
			if !provided[n.Capability] {
				return &config.FieldError{Key: fmt.Sprintf("%s.steps[%d]", key, i),
					Reason: fmt.Sprintf("%s needs a %s step before it (%s)", t.Name, providers(reg, n.Capability), n.Why)}
			}
		}
		for _, c := range t.Provides {
			provided[c] = true
		}
	}
	if provided[registry.Tokens] {
		return nil
	}
	reason := fmt.Sprintf("false (tokens-in) requires a %s step in %s.steps", providers(reg, registry.Tokens), key)
	if !pc.UseOpenAIFormat {
		return &config.FieldError{Key: key + "." + config.ParamUseOpenAIFormat, Reason: reason}
	}
	for i, s := range pc.Steps {
		if v, ok := s.Params[config.ParamUseOpenAIFormat].(bool); ok && !v {
			return &config.FieldError{Key: fmt.Sprintf("%s.steps[%d].params.%s", key, i, config.ParamUseOpenAIFormat), Reason: reason}
		}
	}
	return nil
}

// providers names the step types that provide c, for messages ("render").
func providers(reg *registry.Registry[Deps], c registry.Capability) string {
	if names := reg.Providers(c); len(names) > 0 {
		return strings.Join(names, " or ")
	}
	return string(c) // no registered type provides it: name the capability
}

// checkTerminal: the last step, and only the last, writes the response. key is the step's key.
func checkTerminal(step pipeline.Step, key string, i, n int) error {
	terminal, last := pipeline.IsTerminal(step), i == n-1
	switch {
	case terminal && !last:
		return &config.FieldError{Key: key + ".type", Reason: fmt.Sprintf("%s writes the response and must be the last step", step.Name())}
	case !terminal && last:
		return &config.FieldError{Key: key + ".type", Reason: fmt.Sprintf("the last step must write the response (decode), got %s", step.Name())}
	}
	return nil
}

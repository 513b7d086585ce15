package builder

import (
	"context"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/registry"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// testStep is a step of the test registry.
type testStep struct {
	name     string
	terminal bool
}

func (s *testStep) Name() string                                    { return s.name }
func (s *testStep) Terminal() bool                                  { return s.terminal }
func (s *testStep) Execute(context.Context, *request.Context) error { return nil }

var _ pipeline.Terminal = (*testStep)(nil)

// testRegistry holds test step types (its own registry, so tests can run any number of times):
// every type reads params behaviour and level; test-end is terminal and needs the gateway;
// render provides tokens, test-needy needs them, test-lead must be first.
func testRegistry() *registry.Registry[Deps] {
	r := registry.New[Deps]()
	mk := func(name string, terminal bool) registry.Factory[Deps] {
		return func(deps Deps, p *params.Params) (pipeline.Step, error) {
			if terminal {
				deps.RequireGateway(p, name)
			}
			p.String("behaviour", "ok")
			p.Int("level", 1, 0)
			return &testStep{name: name, terminal: terminal}, nil
		}
	}
	r.Register(Type{Name: "test-a", New: mk("test-a", false)})
	r.Register(Type{Name: "test-b", New: mk("test-b", false)})
	r.Register(Type{Name: "test-end", New: mk("test-end", true)})
	r.Register(Type{Name: "render", New: mk("render", false), Provides: []registry.Capability{registry.Tokens}})
	r.Register(Type{Name: "test-needy", New: mk("test-needy", false), Needs: []registry.Need{{Capability: registry.Tokens, Why: "it reads the tokens"}}})
	r.Register(Type{Name: "test-lead", New: mk("test-lead", false), First: "it leads"})
	return r
}

func cfgWith(stepList ...config.Step) config.Config {
	c := config.Default()
	c.Gateway.Address = "http://gw:80"
	c.Pipeline.Steps = stepList
	return c
}

func TestBuildErrors(t *testing.T) {
	tests := map[string]struct {
		cfg  func() config.Config
		key  string
		want string
	}{
		"unknown type": {
			cfg: func() config.Config { return cfgWith(config.Step{Type: "nope"}, config.Step{Type: "test-end"}) },
			key: "pipeline.steps[0].type", want: `unknown step type "nope"`,
		},
		"terminal not last": {
			cfg: func() config.Config { return cfgWith(config.Step{Type: "test-end"}, config.Step{Type: "test-end"}) },
			key: "pipeline.steps[0].type", want: "must be the last step",
		},
		"last not terminal": {
			cfg: func() config.Config { return cfgWith(config.Step{Type: "test-a"}) },
			key: "pipeline.steps[0].type", want: "the last step must write the response",
		},
		"unknown param": {
			cfg: func() config.Config {
				return cfgWith(config.Step{Type: "test-a", Params: map[string]any{"levle": 2}}, config.Step{Type: "test-end"}) //nolint:misspell // an unknown param
			},
			key: "pipeline.steps[0].params.levle", want: "unknown parameter (this step accepts: behaviour, level)",
		},
		"bad param type": {
			cfg: func() config.Config {
				return cfgWith(config.Step{Type: "test-a", Params: map[string]any{"level": "two"}}, config.Step{Type: "test-end"})
			},
			key: "pipeline.steps[0].params.level", want: "must be an integer",
		},
		"param below minimum": {
			cfg: func() config.Config {
				return cfgWith(config.Step{Type: "test-a", Params: map[string]any{"level": -1}}, config.Step{Type: "test-end"})
			},
			key: "pipeline.steps[0].params.level", want: "at least 0",
		},
		"tokens-in without render": {
			cfg: func() config.Config {
				c := cfgWith(config.Step{Type: "test-end"})
				c.Pipeline.UseOpenAIFormat = false
				return c
			},
			key: "pipeline.use_openai_format", want: "requires a render step",
		},
		"step tokens-in without render": {
			cfg: func() config.Config {
				return cfgWith(config.Step{Type: "test-a", Params: map[string]any{"use_openai_format": false}}, config.Step{Type: "test-end"})
			},
			key: "pipeline.steps[0].params.use_openai_format", want: "requires a render step",
		},
		"first not first": {
			cfg: func() config.Config {
				return cfgWith(config.Step{Type: "test-a"}, config.Step{Type: "test-lead"}, config.Step{Type: "test-end"})
			},
			key: "pipeline.steps[1].type", want: "test-lead must be the first step (it leads), found at position 1",
		},
		"need without an earlier provider": {
			cfg: func() config.Config {
				return cfgWith(config.Step{Type: "test-needy"}, config.Step{Type: "render"}, config.Step{Type: "test-end"})
			},
			key: "pipeline.steps[0]", want: "test-needy needs a render step before it (it reads the tokens)",
		},
		"no gateway for a step that needs one": {
			cfg: func() config.Config {
				c := cfgWith(config.Step{Type: "test-end"})
				c.Gateway.Address = ""
				return c
			},
			key: "gateway.address", want: "is required by step test-end (pipeline.steps[0])",
		},
		"invalid structure": {
			cfg: func() config.Config { return cfgWith() },
			key: "pipeline.steps", want: "at least one step",
		},
		"canary step unknown": {
			cfg: func() config.Config {
				return withCanary(cfgWith(config.Step{Type: "test-end"}), config.Step{Type: "nope"})
			},
			key: "canary.pipeline.steps[0].type", want: `unknown step type "nope"`,
		},
		"canary param invalid": {
			cfg: func() config.Config {
				return withCanary(cfgWith(config.Step{Type: "test-end"}), config.Step{Type: "test-end", Params: map[string]any{"level": -1}})
			},
			key: "canary.pipeline.steps[0].params.level", want: "at least 0",
		},
		"canary last not terminal": {
			cfg: func() config.Config {
				return withCanary(cfgWith(config.Step{Type: "test-end"}), config.Step{Type: "test-a"})
			},
			key: "canary.pipeline.steps[0].type", want: "the last step must write the response",
		},
		"canary tokens-in without render": {
			cfg: func() config.Config {
				c := withCanary(cfgWith(config.Step{Type: "test-end"}), config.Step{Type: "test-end"})
				c.Canary.Pipeline.UseOpenAIFormat = false
				return c
			},
			key: "canary.pipeline.use_openai_format", want: "requires a render step in canary.pipeline.steps",
		},
		"canary needs an earlier provider": {
			cfg: func() config.Config {
				return withCanary(cfgWith(config.Step{Type: "test-end"}), config.Step{Type: "test-needy"}, config.Step{Type: "test-end"})
			},
			key: "canary.pipeline.steps[0]", want: "test-needy needs a render step",
		},
		"canary with no gateway": {
			cfg: func() config.Config {
				c := withCanary(cfgWith(config.Step{Type: "test-a"}, config.Step{Type: "test-end"}), config.Step{Type: "test-end"})
				c.Gateway.Address = ""
				return c
			},
			key: "gateway.address", want: "(pipeline.steps[1])",
		},
		"stable errors come first": {
			cfg: func() config.Config {
				return withCanary(cfgWith(config.Step{Type: "test-a"}), config.Step{Type: "nope"})
			},
			key: "pipeline.steps[0].type", want: "the last step must write the response",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Build(tc.cfg(), Options{Registry: testRegistry()})
			if err == nil {
				t.Fatal("built")
			}
			if config.KeyOf(err) != tc.key || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %q, want key %s containing %q", err, tc.key, tc.want)
			}
		})
	}
}

// withCanary adds a canary of weight 5 with steps to c.
func withCanary(c config.Config, steps ...config.Step) config.Config {
	c.Canary = config.NewCanary()
	c.Canary.WeightPercent = 5
	c.Canary.Pipeline.Steps = steps
	return c
}

func TestBuildCanary(t *testing.T) {
	cfg := withCanary(cfgWith(config.Step{Type: "test-end"}), config.Step{Type: "test-a", Params: map[string]any{"level": 7}}, config.Step{Type: "test-end"})
	p, err := Build(cfg, Options{Registry: testRegistry(), Revision: "file-rev"})
	if err != nil {
		t.Fatal(err)
	}
	c, weight := p.Canary()
	if c == nil || weight != 5 {
		t.Fatalf("canary %v, weight %d", c, weight)
	}
	if p.Track() != config.TrackStable || c.Track() != config.TrackCanary {
		t.Fatalf("tracks %q, %q", p.Track(), c.Track())
	}
	if p.PipelineRevision() != cfg.Pipeline.Revision() || c.PipelineRevision() != cfg.Canary.Pipeline.Revision() || p.PipelineRevision() == c.PipelineRevision() {
		t.Fatal("each pipeline must carry its block's revision")
	}
	if c.Revision() != "file-rev" || p.Revision() != "file-rev" {
		t.Fatal("both report the configuration revision they came from")
	}
	if len(c.Steps()) != 2 || c.Steps()[0].Params["level"] != 7 || len(p.Steps()) != 1 {
		t.Fatalf("canary steps %+v, stable steps %+v", c.Steps(), p.Steps())
	}
	if c.Config().Canary != nil || len(c.Config().Pipeline.Steps) != 2 || c.Forwarder() == nil || c.Forwarder() == p.Forwarder() {
		t.Fatal("the canary runs its own pipeline block with its own gateway client and no canary")
	}
	if cc, _ := c.Canary(); cc != nil {
		t.Fatal("a canary carries no canary")
	}
}

func TestBuildDescribesEffectiveParams(t *testing.T) {
	p, err := Build(cfgWith(config.Step{Type: "test-a", Params: map[string]any{"level": 3}}, config.Step{Type: "test-end"}), Options{Registry: testRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	info := p.Steps()
	if len(info) != 2 || info[0].Params["level"] != 3 || info[0].Params["behaviour"] != "ok" || info[1].Params["level"] != 1 {
		t.Fatalf("steps = %+v", info)
	}
	if p.Revision() != p.Config().Revision() || p.Revision() == "" || p.LoadedAt().IsZero() || p.Forwarder() == nil {
		t.Fatal("pipeline metadata missing")
	}
}

func TestBuildWithProvidersAndLeaders(t *testing.T) {
	cfg := cfgWith(config.Step{Type: "test-lead"}, config.Step{Type: "render"}, config.Step{Type: "test-needy"}, config.Step{Type: "test-end"})
	cfg.Pipeline.UseOpenAIFormat = false
	p, err := Build(cfg, Options{Registry: testRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, s := range p.Steps() {
		types = append(types, s.Type)
	}
	if got := strings.Join(types, ","); got != "test-lead,render,test-needy,test-end" {
		t.Fatalf("steps = %s", got)
	}
	if !p.CanTokenize() {
		t.Error("the render step is not the pipeline's tokenizer")
	}
	q, err := Build(cfgWith(config.Step{Type: "test-a"}, config.Step{Type: "test-end"}), Options{Registry: testRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if q.CanTokenize() {
		t.Error("a pipeline without render tokenizes")
	}
}

func TestBuildUsesTheDefaultRegistry(t *testing.T) {
	_, err := Build(cfgWith(config.Step{Type: "test-a"}), Options{})
	if config.KeyOf(err) != "pipeline.steps[0].type" || !strings.Contains(err.Error(), `unknown step type "test-a"`) {
		t.Fatalf("err = %v", err)
	}
}

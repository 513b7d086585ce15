package pipeline

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/config"
)

// recorder is a test step that records its runs in the shared log.
type recorder struct {
	name     string
	log      *[]string
	mu       *sync.Mutex
	ret      error
	terminal bool
	onRun    func()
}

func (r *recorder) Name() string   { return r.name }
func (r *recorder) Terminal() bool { return r.terminal }
func (r *recorder) Execute(ctx context.Context, rc *RequestContext) error {
	r.mu.Lock()
	*r.log = append(*r.log, r.name)
	r.mu.Unlock()
	if r.onRun != nil {
		r.onRun()
	}
	return r.ret
}

type testSteps struct {
	mu  sync.Mutex
	log []string
}

// register adds test step types under a unique prefix; behaviour is chosen by params.
func (ts *testSteps) register(prefix string) {
	mk := func(name string, terminal bool) {
		Register(prefix+name, func(deps Deps, p *Params) (Step, error) {
			r := &recorder{name: name, log: &ts.log, mu: &ts.mu, terminal: terminal}
			switch p.String("behaviour", "ok") {
			case "fail":
				r.ret = errors.New("boom")
			case "done":
				r.ret = ErrDone
			}
			p.Int("level", 1, 0)
			return r, nil
		})
	}
	mk("a", false)
	mk("b", false)
	mk("end", true)
}

var steps = &testSteps{}

func init() { steps.register("test-") }

func cfgWith(stepList ...config.Step) config.Config {
	c := config.Default()
	c.Gateway.Address = "http://gw:80"
	c.Pipeline.Steps = stepList
	return c
}

func TestExecuteOrderDoneAndErrors(t *testing.T) {
	tests := map[string]struct {
		steps   []config.Step
		want    []string
		wantErr string
		outcome []string
	}{
		"in order": {
			steps:   []config.Step{{Type: "test-b"}, {Type: "test-a"}, {Type: "test-end"}},
			want:    []string{"b", "a", "end"},
			outcome: []string{"ok", "ok", "ok"},
		},
		"error aborts": {
			steps:   []config.Step{{Type: "test-a", Params: map[string]any{"behaviour": "fail"}}, {Type: "test-b"}, {Type: "test-end"}},
			want:    []string{"a"},
			wantErr: "a: boom",
			outcome: []string{"error"},
		},
		"done stops with success": {
			steps:   []config.Step{{Type: "test-a", Params: map[string]any{"behaviour": "done"}}, {Type: "test-b"}, {Type: "test-end"}},
			want:    []string{"a"},
			outcome: []string{"done"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			steps.mu.Lock()
			steps.log = nil
			steps.mu.Unlock()
			p, err := Build(cfgWith(tc.steps...), Options{})
			if err != nil {
				t.Fatal(err)
			}
			rc := &RequestContext{}
			err = p.Execute(context.Background(), rc)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			if strings.Join(steps.log, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("ran %v, want %v", steps.log, tc.want)
			}
			var outcomes []string
			for _, tm := range rc.Timings {
				outcomes = append(outcomes, tm.Outcome)
			}
			if strings.Join(outcomes, ",") != strings.Join(tc.outcome, ",") {
				t.Fatalf("outcomes %v, want %v", outcomes, tc.outcome)
			}
		})
	}
}

func TestCancellationBetweenSteps(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ts testSteps
	Register("cancel-first", func(Deps, *Params) (Step, error) {
		return &recorder{name: "first", log: &ts.log, mu: &ts.mu, onRun: cancel}, nil
	})
	ts.register("cancel-")
	p, err := Build(cfgWith(config.Step{Type: "cancel-first"}, config.Step{Type: "cancel-b"}, config.Step{Type: "cancel-end"}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = p.Execute(ctx, &RequestContext{})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "before b") {
		t.Fatalf("err = %v", err)
	}
	if strings.Join(ts.log, ",") != "first" {
		t.Fatalf("ran %v", ts.log)
	}
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
				return cfgWith(config.Step{Type: "test-a", Params: map[string]any{"levle": 2}}, config.Step{Type: "test-end"})
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
		"invalid structure": {
			cfg: func() config.Config { return cfgWith() },
			key: "pipeline.steps", want: "at least one step",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Build(tc.cfg(), Options{})
			if err == nil {
				t.Fatal("built")
			}
			if config.KeyOf(err) != tc.key || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %q, want key %s containing %q", err, tc.key, tc.want)
			}
		})
	}
}

func TestBuildDescribesEffectiveParams(t *testing.T) {
	p, err := Build(cfgWith(config.Step{Type: "test-a", Params: map[string]any{"level": 3}}, config.Step{Type: "test-end"}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	info := p.Steps()
	if len(info) != 2 || info[0].Params["level"] != 3 || info[0].Params["behaviour"] != "ok" || info[1].Params["level"] != 1 {
		t.Fatalf("steps = %+v", info)
	}
	if p.Revision() != p.Config().Revision() || p.Revision() == "" || p.LoadedAt().IsZero() || p.Gateway() == nil {
		t.Fatal("pipeline metadata missing")
	}
}

// closerStep is a terminal step that counts its Close calls.
type closerStep struct{ closed *atomic.Int32 }

func (closerStep) Name() string                                   { return "closer" }
func (closerStep) Terminal() bool                                 { return true }
func (closerStep) Execute(context.Context, *RequestContext) error { return nil }
func (c closerStep) Close()                                       { c.closed.Add(1) }

func TestHolderRetiresPipelinesAfterTheirLastRequest(t *testing.T) {
	var h Holder
	if p, release := h.Acquire(); p != nil {
		t.Fatal("empty holder returned a pipeline")
	} else {
		release()
	}
	counters := map[string]*atomic.Int32{}
	build := func(name string) *Pipeline {
		counters[name] = &atomic.Int32{}
		return &Pipeline{revision: name, steps: []Step{closerStep{closed: counters[name]}}}
	}
	p1, p2, p3 := build("1"), build("2"), build("3")
	h.Swap(p1)
	inflight, release := h.Acquire()
	if inflight != p1 {
		t.Fatal("acquire")
	}
	if old := h.Swap(p2); old != p1 || h.Load() != p2 {
		t.Fatal("swap")
	}
	if counters["1"].Load() != 0 {
		t.Fatal("a pipeline was closed under a request still running on it")
	}
	if cur, rel := h.Acquire(); cur != p2 {
		t.Fatal("new requests must take the new pipeline")
	} else {
		rel()
	}
	release()
	if counters["1"].Load() != 1 {
		t.Fatal("the retired pipeline was not closed after its last request")
	}
	h.Swap(p3) // nothing in flight on p2: closed at once
	if counters["2"].Load() != 1 || counters["3"].Load() != 0 {
		t.Fatalf("closes: %d %d", counters["2"].Load(), counters["3"].Load())
	}
}

func TestAcquireUnderConcurrentSwaps(t *testing.T) {
	var h Holder
	var closed atomic.Int32
	h.Swap(&Pipeline{steps: []Step{closerStep{closed: &closed}}})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				p, release := h.Acquire()
				if p.retired.Load() && p.inflight.Load() <= 0 {
					t.Error("acquired a retired pipeline without holding it")
				}
				release()
			}
		}()
	}
	for i := 0; i < 200; i++ {
		h.Swap(&Pipeline{steps: []Step{closerStep{closed: &closed}}})
	}
	close(stop)
	wg.Wait()
	if got := closed.Load(); got != 200 {
		t.Fatalf("%d of 200 retired pipelines closed", got)
	}
}

func TestRegisterTwicePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	Register("test-a", nil)
}

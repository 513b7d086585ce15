package pipeline

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/state/request"
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
func (r *recorder) Execute(ctx context.Context, rc *request.Context) error {
	r.mu.Lock()
	*r.log = append(*r.log, r.name)
	r.mu.Unlock()
	if r.onRun != nil {
		r.onRun()
	}
	return r.ret
}

var (
	_ Terminal = (*recorder)(nil)
	_ Terminal = closerStep{}
	_ Closer   = closerStep{}
)

// runLog collects the names of the recorders that ran.
type runLog struct {
	mu  sync.Mutex
	log []string
}

func (l *runLog) step(name string, ret error) *recorder {
	return &recorder{name: name, log: &l.log, mu: &l.mu, ret: ret, terminal: name == "end"}
}

func TestExecuteOrderDoneAndErrors(t *testing.T) {
	boom := errors.New("boom")
	tests := map[string]struct {
		steps   func(l *runLog) []Step
		want    []string
		wantErr string
		outcome []string
	}{
		"in order": {
			steps:   func(l *runLog) []Step { return []Step{l.step("b", nil), l.step("a", nil), l.step("end", nil)} },
			want:    []string{"b", "a", "end"},
			outcome: []string{"ok", "ok", "ok"},
		},
		"error aborts": {
			steps:   func(l *runLog) []Step { return []Step{l.step("a", boom), l.step("b", nil), l.step("end", nil)} },
			want:    []string{"a"},
			wantErr: "a: boom",
			outcome: []string{"error"},
		},
		"done stops with success": {
			steps:   func(l *runLog) []Step { return []Step{l.step("a", ErrDone), l.step("b", nil), l.step("end", nil)} },
			want:    []string{"a"},
			outcome: []string{"done"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var l runLog
			p := New(Spec{Steps: tc.steps(&l)})
			rc := &request.Context{}
			err := p.Execute(context.Background(), rc)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			if strings.Join(l.log, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("ran %v, want %v", l.log, tc.want)
			}
			var outcomes, names []string
			for _, tm := range rc.Timings {
				outcomes = append(outcomes, tm.Outcome)
				names = append(names, tm.Step)
			}
			if strings.Join(outcomes, ",") != strings.Join(tc.outcome, ",") {
				t.Fatalf("outcomes %v, want %v", outcomes, tc.outcome)
			}
			if strings.Join(names, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("timed steps %v, want %v", names, tc.want)
			}
		})
	}
}

// TestTokenize: Tokenize runs the tokenizer alone, timed; without one it runs nothing.
func TestTokenize(t *testing.T) {
	var l runLog
	render := l.step("render", nil)
	p := New(Spec{Steps: []Step{l.step("media", nil), render, l.step("end", nil)}, Tokenizer: render})
	rc := &request.Context{}
	ok, err := p.Tokenize(context.Background(), rc)
	if !ok || err != nil || !p.CanTokenize() {
		t.Fatalf("Tokenize = %v, %v", ok, err)
	}
	if strings.Join(l.log, ",") != "render" || len(rc.Timings) != 1 || rc.Timings[0].Step != "render" || rc.Timings[0].Outcome != "ok" {
		t.Fatalf("ran %v, timings %+v", l.log, rc.Timings)
	}
	render.ret = errors.New("boom")
	if _, err := p.Tokenize(context.Background(), &request.Context{}); err == nil || err.Error() != "render: boom" {
		t.Fatalf("err = %v", err)
	}
	l.log = nil
	bare := New(Spec{Steps: []Step{l.step("end", nil)}})
	if ok, err := bare.Tokenize(context.Background(), &request.Context{}); ok || err != nil || bare.CanTokenize() || len(l.log) != 0 {
		t.Fatalf("Tokenize without a tokenizer = %v, %v, ran %v", ok, err, l.log)
	}
}

func TestCancellationBetweenSteps(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var l runLog
	first := l.step("first", nil)
	first.onRun = cancel
	p := New(Spec{Steps: []Step{first, l.step("b", nil), l.step("end", nil)}})
	err := p.Execute(ctx, &request.Context{})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "before b") {
		t.Fatalf("err = %v", err)
	}
	if strings.Join(l.log, ",") != "first" {
		t.Fatalf("ran %v", l.log)
	}
}

// closerStep is a terminal step that counts its Close calls.
type closerStep struct{ closed *atomic.Int32 }

func (closerStep) Name() string                                    { return "closer" }
func (closerStep) Terminal() bool                                  { return true }
func (closerStep) Execute(context.Context, *request.Context) error { return nil }
func (c closerStep) Close()                                        { c.closed.Add(1) }

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
		return New(Spec{Revision: name, Steps: []Step{closerStep{closed: counters[name]}}})
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
	h.Swap(New(Spec{Steps: []Step{closerStep{closed: &closed}}}))
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
		h.Swap(New(Spec{Steps: []Step{closerStep{closed: &closed}}}))
	}
	close(stop)
	wg.Wait()
	if got := closed.Load(); got != 200 {
		t.Fatalf("%d of 200 retired pipelines closed", got)
	}
}

// TestStepMetrics: every step is timed once and counted running while it runs, also when it fails
// or panics; a failure is counted with its error code.
func TestStepMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	tel := observe.Telemetry{Metrics: observe.NewMetrics(reg)}
	var l runLog
	running := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0.0
		for _, mf := range mfs {
			if mf.GetName() == "llm_d_coordinator_step_running" {
				for _, m := range mf.GetMetric() {
					n += m.GetGauge().GetValue()
				}
			}
		}
		return n
	}
	a := l.step("a", nil)
	a.onRun = func() {
		if n := running(); n != 1 {
			t.Errorf("%v steps running during a", n)
		}
	}
	fail := l.step("end", &apierror.UpstreamError{Phase: "decode"})
	if err := New(Spec{Steps: []Step{a, fail}, Telemetry: tel}).Execute(context.Background(), &request.Context{}); err == nil {
		t.Fatal("no error")
	}
	p := l.step("end", nil)
	p.onRun = func() { panic("boom") }
	func() {
		defer func() { _ = recover() }()
		_ = New(Spec{Steps: []Step{p}, Telemetry: tel}).Execute(context.Background(), &request.Context{})
	}()
	if n := running(); n != 0 {
		t.Fatalf("%v steps still running", n)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP llm_d_coordinator_step_errors_total Pipeline step failures, by step and error code.
# TYPE llm_d_coordinator_step_errors_total counter
llm_d_coordinator_step_errors_total{error_code="upstream_transport",step="end"} 1
`), "llm_d_coordinator_step_errors_total"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "llm_d_coordinator_step_duration_seconds"); err != nil || n != 2 {
		t.Fatalf("%d step duration series, %v", n, err)
	}
}

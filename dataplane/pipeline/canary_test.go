package pipeline

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
)

func withCanary(weight int, stableRev, canaryRev string) *Pipeline {
	canary := New(Spec{Track: "canary", PipelineRevision: canaryRev})
	return New(Spec{Track: "stable", PipelineRevision: stableRev, Canary: canary, CanaryWeight: weight})
}

// Of every 100 consecutive picks exactly the weight go to the canary, spread out: never two
// canary picks in a row below 50%, and the first window starts on the stable pipeline.
func TestPickSplitsExactly(t *testing.T) {
	for _, w := range []int{0, 1, 5, 33, 50, 99, 100} {
		p := withCanary(w, "s", "c")
		canary, _ := p.Canary()
		for window := range 3 {
			got, run, longest := 0, 0, 0
			for range 100 {
				if p.Pick() == canary {
					got++
					run++
					longest = max(longest, run)
				} else {
					run = 0
				}
			}
			if got != w {
				t.Fatalf("weight %d: window %d sent %d of 100 to the canary", w, window, got)
			}
			if w <= 50 && longest > 1 {
				t.Fatalf("weight %d: %d canary picks in a row: not spread", w, longest)
			}
		}
	}
	plain := New(Spec{Track: "stable"})
	if plain.Pick() != plain {
		t.Fatal("a pipeline without a canary must pick itself")
	}
}

func TestPickIsExactUnderConcurrency(t *testing.T) {
	p := withCanary(5, "s", "c")
	canary, _ := p.Canary()
	var hits atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 250 {
				if p.Pick() == canary {
					hits.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if hits.Load() != 100 { // 2000 picks at 5%
		t.Fatalf("%d of 2000 picks went to the canary, want 100", hits.Load())
	}
}

// A reload that keeps a revision keeps its counts, whichever track the revision moves to; a
// new revision starts at zero.
func TestSwapHandsTalliesOn(t *testing.T) {
	var h Holder
	first := withCanary(5, "r1", "r2")
	h.Swap(first)
	first.Tally().Record(false)
	c, _ := first.Canary()
	c.Tally().Record(true)
	c.Tally().Record(false)

	reweighted := withCanary(50, "r1", "r2")
	h.Swap(reweighted)
	rc, _ := reweighted.Canary()
	if n, e := reweighted.Tally().Counts(); n != 1 || e != 0 {
		t.Fatalf("stable after a weight change: %d requests, %d errors", n, e)
	}
	if n, e := rc.Tally().Counts(); n != 2 || e != 1 {
		t.Fatalf("canary after a weight change: %d requests, %d errors", n, e)
	}

	promoted := New(Spec{Track: "stable", PipelineRevision: "r2"})
	h.Swap(promoted)
	if n, e := promoted.Tally().Counts(); n != 2 || e != 1 {
		t.Fatalf("promoted canary: %d requests, %d errors, want its canary counts", n, e)
	}

	next := withCanary(5, "r2", "r3")
	h.Swap(next)
	nc, _ := next.Canary()
	if n, _ := nc.Tally().Counts(); n != 0 {
		t.Fatalf("a new revision starts with %d requests", n)
	}

}

// The canary lives and dies with the pipeline carrying it: it is closed once the last request
// of the retired set is done, not before.
func TestCanaryClosedWithItsPipeline(t *testing.T) {
	var stableClosed, canaryClosed atomic.Int32
	canary := New(Spec{Track: "canary", Steps: []Step{closerStep{closed: &canaryClosed}}})
	set := New(Spec{Track: "stable", Steps: []Step{closerStep{closed: &stableClosed}}, Canary: canary, CanaryWeight: 100})
	var h Holder
	h.Swap(set)
	p, release := h.Acquire()
	if p.Pick() != canary {
		t.Fatal("weight 100 must pick the canary")
	}
	h.Swap(New(Spec{}))
	if canaryClosed.Load() != 0 || stableClosed.Load() != 0 {
		t.Fatal("closed while a request was in flight")
	}
	release()
	if canaryClosed.Load() != 1 || stableClosed.Load() != 1 {
		t.Fatalf("closed stable %d, canary %d times; want once each", stableClosed.Load(), canaryClosed.Load())
	}
}

// Routes a canary's steps serve are reachable through the pipeline carrying it; its own win.
func TestHandlerFallsBackToTheCanarysRoutes(t *testing.T) {
	route := func(body string) Step {
		return routeStep{pattern: "GET /v1/requests/{id}", body: body}
	}
	only := New(Spec{Canary: New(Spec{Steps: []Step{route("canary")}})})
	both := New(Spec{Steps: []Step{route("stable")}, Canary: New(Spec{Steps: []Step{route("canary")}})})
	none := New(Spec{Canary: New(Spec{})})
	for name, tc := range map[string]struct {
		p    *Pipeline
		want string
	}{"canary only": {only, "canary"}, "both": {both, "stable"}, "neither": {none, ""}} {
		r := httptest.NewRequest(http.MethodGet, "/v1/requests/abc", nil)
		h, ok := tc.p.Handler(r)
		if ok != (tc.want != "") {
			t.Fatalf("%s: handled %v", name, ok)
		}
		if !ok {
			continue
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Body.String() != tc.want+" abc" {
			t.Fatalf("%s: served %q, want %q", name, rec.Body.String(), tc.want)
		}
	}
}

// routeStep serves one route answering its body and the id.
type routeStep struct {
	closerStep
	pattern, body string
}

func (s routeStep) Routes() []Route {
	return []Route{{Pattern: s.pattern, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(s.body + " " + r.PathValue("id")))
	})}}
}

//go:build linux

package realepp

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/epd-dev/coordinator/test/doubles/extprocgw"
)

// readyWindow is how long the killed worker's Pod stays Ready (the kubelet's readiness probe
// failing threshold times its period is of this order).
const readyWindow = 10 * time.Second

// phases of the kill test: a request is "before" when it ended before the kill, "after" when it
// started once the EPP had dropped the Pod, and "in the window" otherwise (in flight at the
// kill, or started while the dead pod was Ready).
const (
	beforeKill = iota
	inWindow   // the process is dead, its Pod still Ready
	afterFlip  // the Pod is NotReady and the EPP has dropped it
)

var phaseNames = []string{"before the kill", "dead but Ready", "after NotReady"}

// killFigures are the counts of one kill run.
type killFigures struct {
	requests, failed [3]int
	// deadFirst counts the requests of the window whose first decode attempt went to the
	// killed pod, and deadFirstFailed those of them that failed.
	deadFirst, deadFirstFailed int
	// resumed counts the streams that broke and were resumed whole.
	resumed int
	// paths counts the requests of the window by their legs (pods and outcomes).
	paths map[string]int
	// failures are a few failed requests with their error and legs.
	failures []string
}

// runKill runs 16 clients against two decode pods, SIGKILLs decode-0's process while its Pod
// stays Ready for readyWindow, then marks the Pod NotReady, and counts what the clients got.
func runKill(t *testing.T, decodePicks int, retry *extprocgw.RetryPolicy) killFigures {
	st := startStack(t, stackOptions{decode: 2, steps: "{type: decode}", decodePicks: decodePicks, retry: retry,
		simArgs: []string{"--time-to-first-token", "5ms", "--inter-token-latency", "2ms"}})
	dead := st.byRole("decode")[0]
	const clients = 16
	var phase atomic.Int32
	var started [3]atomic.Int32
	// reached[p] is closed when 2×clients requests have started in phase p.
	reached := [3]chan struct{}{make(chan struct{}), make(chan struct{}), make(chan struct{})}
	type result struct {
		answer
		phase  int
		prompt string
	}
	var (
		mu      sync.Mutex
		results []result
	)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				p := int(phase.Load())
				if started[p].Add(1) == 2*clients {
					close(reached[p])
				}
				pr := prompt(fmt.Sprintf("client %d request %d %s", c, i, uuid.NewString()[:8]))
				a := st.chat(context.Background(), uuid.NewString(), pr, (c+i)%2 == 0)
				if end := int(phase.Load()); p != afterFlip && end != beforeKill {
					p = inWindow
				}
				mu.Lock()
				results = append(results, result{a, p, pr})
				mu.Unlock()
			}
		})
	}
	waitStarted := func(p int) {
		select {
		case <-reached[p]:
		case <-time.After(60 * time.Second):
			t.Fatalf("only %d requests started %s in 60s", started[p].Load(), phaseNames[p])
		}
	}
	waitStarted(beforeKill)
	dead.kill()
	phase.Store(inWindow)
	<-time.After(readyWindow) // the scenario: the dead pod stays Ready this long
	st.setReady(dead, false)
	st.waitReadyPods(1)
	phase.Store(afterFlip)
	waitStarted(afterFlip)
	stop()
	wg.Wait()

	recs := st.settled()
	f := killFigures{paths: map[string]int{}}
	for _, r := range results {
		f.requests[r.phase]++
		legs := legsOf(recs, r.id)
		ok := r.err == nil && r.finish == "stop" && r.text == r.prompt
		if !ok && r.err == nil && r.finish == "stop" && resumed(legs) {
			// The echo simulator answers a continuation (the text so far as a final assistant
			// message, continue_final_message) with that message again: a resumed answer is
			// the text the client got before the break, twice. A stream broken before its
			// first token is resent as it was (there is nothing to continue): its answer is
			// the prompt once, which the check above accepts.
			half := r.text[:len(r.text)/2]
			ok = len(r.text)%2 == 0 && half != "" && r.text == half+half && strings.HasPrefix(r.prompt, half)
			if ok {
				f.resumed++
			}
		}
		if !ok {
			f.failed[r.phase]++
			if len(f.failures) < 6 {
				f.failures = append(f.failures, fmt.Sprintf("%s: %q… %q %v; legs %s", phaseNames[r.phase], r.text[:min(len(r.text), 20)], r.finish, r.err, st.describe(legs)))
			}
		}
		if r.phase != inWindow {
			continue
		}
		f.paths[st.describe(legs)]++
		if len(legs) > 0 && len(legs[0].Attempts) > 0 && legs[0].Attempts[0].Endpoint == dead.addr {
			f.deadFirst++
			if !ok {
				f.deadFirstFailed++
			}
		}
	}
	t.Logf("decode picks %d, gateway retry %+v", decodePicks, retry)
	for p := range 3 {
		t.Logf("%s: %d requests, %d failed", phaseNames[p], f.requests[p], f.failed[p])
	}
	t.Logf("dead but Ready: %d requests first sent to the dead pod, %d of them failed; %d streams resumed whole", f.deadFirst, f.deadFirstFailed, f.resumed)
	keys := slices.Collect(maps.Keys(f.paths))
	slices.SortFunc(keys, func(a, b string) int { return f.paths[b] - f.paths[a] })
	for _, k := range keys[:min(len(keys), 8)] {
		t.Logf("  %4d × %s", f.paths[k], k)
	}
	for _, s := range f.failures {
		t.Logf("failure: %s", s)
	}
	return f
}

// resumed reports whether a request's legs include a stream resume.
func resumed(legs []extprocgw.Record) bool {
	for _, l := range legs {
		if strings.HasSuffix(l.RequestID, "-resume") {
			return true
		}
	}
	return false
}

// A decode worker's process dies while its Pod stays Ready for readyWindow, under 16 clients
// sending new prompts.
//
// With the EPP picking one endpoint and a gateway without a retry policy (the EPP's default
// and Envoy's), about half of the new prompts sent while the dead pod is Ready fail: the
// coordinator's retries (gateway.retry: 3 attempts) go back to the EPP, which records the
// prompt's prefix against its pick before forwarding (approx-prefix-cache-producer's
// PreRequest), so the prefix-cache scorer steers every retry of a prompt first picked to the
// dead pod back to it; each attempt is a connection refused (503), and the client gets 503
// after the third (after the first once the retry budget is spent). Nothing tells the EPP the
// pick failed: the gateway's 503 never reaches it.
//
// With the decode picker returning two endpoints (max-score-picker maxNumOfEndpoints: 2, the
// GAIE protocol's fallback list) and the gateway's route retrying a refused connection on the
// next endpoint of the list (retry_on: connect-failure, reset; num_retries: 1, as Envoy's
// override_host load balancing does), no request fails: the retry happens inside the gateway,
// on the fallback the EPP already chose, before the coordinator sees anything.
func TestKillDecodeWorker(t *testing.T) {
	t.Run("one pick, no gateway retry", func(t *testing.T) {
		f := runKill(t, 1, nil)
		if f.failed[beforeKill] != 0 || f.failed[afterFlip] != 0 {
			t.Errorf("failures outside the window: %v", f.failed)
		}
		// Why a deployment needs the fallback list and the gateway's retry (the next subtest):
		// without them the coordinator's retries cannot leave the dead pod. It cannot name the
		// dead endpoint on its retry (Envoy's 503 does not say which endpoint failed, and this
		// EPP has no header that excludes one, only pins: x-llm-d-pin-host-port), and the EPP
		// keeps the pick the gateway could not reach (x-gateway-destination-endpoint-served only
		// reports the endpoint that answered). About half of the window's requests fail (the
		// picker alternates the two pods for new prompts); at least a quarter is asserted, so
		// that a change of the mechanism shows here.
		if f.failed[inWindow]*4 < f.requests[inWindow] || f.deadFirst == 0 {
			t.Fatalf("%d of %d requests failed while the dead pod was Ready (%d first sent to it): the mechanism changed, "+
				"make this subtest assert 0 failures", f.failed[inWindow], f.requests[inWindow], f.deadFirst)
		}
		// Every failure is a prompt first sent to the dead pod, whose retries all went there too.
		if f.failed[inWindow] != f.deadFirstFailed {
			t.Errorf("%d failures in the window, %d of them first sent to the dead pod", f.failed[inWindow], f.deadFirstFailed)
		}
		// The EPP steers the retries of a prompt back to the dead pod: (almost) no request first
		// sent there is rescued by a retry on the live one.
		rescued := 0
		for path, n := range f.paths {
			if strings.HasPrefix(path, "decode→decode-0") && strings.Contains(path, "decode-1 200") {
				rescued += n
			}
		}
		if rescued*10 > f.deadFirst {
			t.Errorf("%d of the %d requests first sent to the dead pod were retried on the live one: the EPP no longer steers retries back",
				rescued, f.deadFirst)
		}
	})
	t.Run("fallback list, gateway retry on connect-failure", func(t *testing.T) {
		f := runKill(t, 2, &extprocgw.RetryPolicy{RetryOn: []string{extprocgw.RetryConnectFailure, extprocgw.RetryReset}, NumRetries: 1})
		for p := range 3 {
			if f.failed[p] != 0 {
				t.Errorf("%s: %d of %d requests failed, want none", phaseNames[p], f.failed[p], f.requests[p])
			}
		}
		if f.deadFirst == 0 {
			t.Errorf("no request of the window went to the dead pod first: the fallback was not exercised")
		}
	})
}

//go:build linux

package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/epd-dev/coordinator/test/doubles/gateway"
	"github.com/epd-dev/coordinator/test/doubles/simworker"
)

const pd = "{type: prefill}, {type: decode}"

// Two prefill and two decode workers under a steady mix of streamed and unstreamed chats; one
// prefill and one decode worker are SIGKILLed while a stream runs on the decode one. No client
// answer fails or is cut: legs that served nothing are retried on the living workers, the cut
// stream is resumed on the other decode worker.
func TestKillOneWorkerPerRole(t *testing.T) {
	killOneWorkerPerRole(t, startCluster(t, options{prefill: 2, decode: 2, steps: pd}), 320)
}

// kv-sglang under load through prefill-decode, with one prefill and one decode process
// SIGKILLed mid-run: a pair whose reserved prefill pod died fails before its decode produced
// anything and is sent again; a decode stream that breaks is resumed with a new pair.
func TestKillSGLangWorkersUnderLoad(t *testing.T) {
	killOneWorkerPerRole(t, startCluster(t, options{prefill: 2, decode: 2, steps: "{type: prefill-decode}", sglang: true}), 160)
}

// killOneWorkerPerRole runs total requests from 8 clients through c and, a quarter of the way in,
// SIGKILLs the first prefill worker and the first decode worker while a stream runs on it; no
// client may see it.
func killOneWorkerPerRole(t *testing.T, c *cluster, total int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const clients = 8
	var killed atomic.Bool
	killAt := make(chan struct{})
	go func() {
		<-killAt
		c.awaitInFlight(t, c.pools["decode"][0].url)
		c.pools["decode"][0].kill(t)
		c.pools["prefill"][0].kill(t)
		killed.Store(true)
	}()
	ta := c.load(ctx, clients, total/clients, func(done int) {
		if done == total/4 {
			close(killAt)
		}
	})
	resumed := c.metric(t, "coordinator_stream_resumes_total", "outcome", "resumed")
	retries := c.metric(t, "coordinator_upstream_retries_total")
	t.Logf("kill one worker per role: %s; streams resumed %v, legs retried %v; ejected %v", ta, resumed, retries, c.gw.Ejected())
	if !killed.Load() {
		t.Fatal("the workers were not killed during the run")
	}
	if ta.failed != 0 || ta.truncated != 0 || ta.sent != total {
		t.Fatalf("clients saw faults: %s", ta)
	}
	if resumed+retries == 0 {
		t.Fatal("no leg was retried and no stream resumed: the kill landed on nothing")
	}
}

// The real EPP's prefix affinity (the gateway double's PrefixAffinity): a prompt goes back to the
// pod it was first picked for, and the picker learns of a dead process only when its pod's
// readiness flips, so the coordinator's own retries of a leg sent to a killed decode process all
// go to it again (the double's TestPrefixAffinity shows the 503s: about half of new prompts failed
// through the real EPP, test/suites/realepp). What leaves the dead pod is the gateway's fallback
// endpoint (the picker's maxNumOfEndpoints of 2, Envoy's override_host retried on
// connect-failure and reset): with it, one decode process SIGKILLed under 16 clients while its
// pod stays in the pool fails and cuts no answer; a cut stream is resumed, its continuation's
// pick falling back the same way.
func TestKillDecodeUnderPrefixAffinity(t *testing.T) {
	c := startCluster(t, options{decode: 2, steps: "{type: decode}", gwConfig: gateway.Config{PrefixAffinity: true, Fallbacks: 1}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const clients, perClient = 16, 20
	var killed atomic.Bool
	killAt := make(chan struct{})
	go func() {
		<-killAt
		c.awaitInFlight(t, c.pools["decode"][0].url)
		c.pools["decode"][0].kill(t)
		killed.Store(true)
	}()
	ta := c.load(ctx, clients, perClient, func(done int) {
		if done == clients*perClient/4 {
			close(killAt)
		}
	})
	fellBack := 0
	for _, l := range c.gw.Legs() {
		fellBack += len(l.Tried)
	}
	t.Logf("kill a decode process under prefix affinity: %s; legs that fell back %d; streams resumed %v", ta, fellBack,
		c.metric(t, "coordinator_stream_resumes_total", "outcome", "resumed"))
	if !killed.Load() {
		t.Fatal("the worker was not killed during the run")
	}
	if ta.failed != 0 || ta.truncated != 0 || ta.sent != clients*perClient {
		t.Fatalf("clients saw faults: %s", ta)
	}
	if fellBack == 0 {
		t.Fatal("no leg fell back: the kill landed on nothing")
	}
}

// A decode worker that stops sending after its headers (and after a few tokens) costs the
// client at most the idle timeout: the stream is resumed, the unstreamed answer retried.
func TestHungWorkerCostsItsDeadline(t *testing.T) {
	const idle = 300 * time.Millisecond
	c := startCluster(t, options{prefill: 1, decode: 2, steps: pd, gateway: "idle_timeout: 300ms"})
	for _, stream := range []bool{true, false} {
		for _, w := range c.pools["decode"] {
			w.inject(t, simworker.Fault{Kind: simworker.FaultHangAfterHeaders, AfterTokens: 5})
		}
		o := c.ask(context.Background(), 0, 1, stream)
		if o.err != nil || o.truncated != "" {
			t.Fatalf("stream=%v: %v %s", stream, o.err, o.truncated)
		}
		t.Logf("stream=%v: answered whole in %s with both decode workers hanging once (idle timeout %s)", stream, o.duration.Round(time.Millisecond), idle)
		// Both workers hang once: two idle timeouts at most, plus the answer.
		if o.duration > 2*idle+time.Second {
			t.Fatalf("stream=%v took %s, want at most two idle timeouts (%s each)", stream, o.duration, idle)
		}
	}
	if n := c.metric(t, "coordinator_upstream_retries_total", "reason", "idle_timeout") +
		c.metric(t, "coordinator_stream_resumes_total", "outcome", "resumed"); n < 2 {
		t.Fatalf("%v retries and resumes after idle timeouts, want at least 2", n)
	}
}

// Resets before the headers and 503s from the workers or the gateway are invisible: every
// request is served by a retry.
func TestResetsAndUnavailableAreRetried(t *testing.T) {
	c := startCluster(t, options{prefill: 2, decode: 2, steps: pd})
	c.pools["prefill"][0].inject(t, simworker.Fault{Kind: simworker.FaultResetBeforeHeaders, Count: 3})
	c.pools["prefill"][1].inject(t, simworker.Fault{Kind: simworker.FaultStatus, Status: http.StatusServiceUnavailable, Count: 3, RetryAfter: 0})
	c.pools["decode"][0].inject(t, simworker.Fault{Kind: simworker.FaultResetBeforeHeaders, Count: 2})
	c.pools["decode"][1].inject(t, simworker.Fault{Kind: simworker.FaultDieMidStream, AfterTokens: 3, Count: 2})
	ta := c.load(context.Background(), 4, 10, nil)
	t.Logf("%s; retries by reason: reset %v, 503 %v; resumes %v", ta,
		c.metric(t, "coordinator_upstream_retries_total", "reason", "reset"),
		c.metric(t, "coordinator_upstream_retries_total", "reason", "503"),
		c.metric(t, "coordinator_stream_resumes_total", "outcome", "resumed"))
	if ta.failed != 0 || ta.truncated != 0 {
		t.Fatalf("clients saw faults: %s", ta)
	}
	if c.metric(t, "coordinator_upstream_retries_total") < 5 {
		t.Fatal("the faults were not retried")
	}
}

// With the whole decode pool down, clients get a fast, clear 503 with Retry-After, and the extra
// legs stay within the retry budget.
func TestDecodePoolDown(t *testing.T) {
	c := startCluster(t, options{prefill: 1, decode: 2, steps: pd, gateway: "retry: {budget_ratio: 0.2, budget_min_per_second: 1}"})
	for _, w := range c.pools["decode"] {
		w.kill(t)
	}
	const requests = 40
	start := time.Now()
	ta := c.load(context.Background(), 4, requests/4, nil)
	elapsed := time.Since(start)
	t.Logf("decode pool down: %s; %s", ta, c.checkBudget(t, elapsed))
	if ta.failed != requests || ta.byStatus[http.StatusServiceUnavailable] != requests || ta.maxDuration > 2*time.Second {
		t.Fatalf("want every request a fast 503: %s", ta)
	}
	o := c.ask(context.Background(), 99, 0, true)
	var apiErr *openai.Error
	if !errors.As(o.err, &apiErr) || apiErr.Type != "service_unavailable_error" || apiErr.Response.Header.Get("Retry-After") == "" {
		t.Fatalf("the 503: %v", o.err)
	}
}

// The endpoint picker answers conditional decode itself (412 when no decode pod holds the
// prompt): a miss runs the cascade, a hit is served by the holder, and a holder that died falls
// back to the cascade on the living pods.
func TestConditionalDecodeThroughThePicker(t *testing.T) {
	c := startCluster(t, options{prefill: 2, decode: 2, steps: "{type: conditional-decode}, " + pd,
		gwConfig: gateway.Config{EPPConditionalDecode: true}})
	for round := range 2 {
		if o := c.ask(context.Background(), 0, 0, round == 1); o.err != nil || o.truncated != "" {
			t.Fatalf("round %d: %v %s", round, o.err, o.truncated)
		}
	}
	var picker412, served int
	holder := ""
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, l := range c.gw.Settled(ctx) {
		switch {
		case l.Status == http.StatusPreconditionFailed && l.Backend == "":
			picker412++
		case l.Profile == "decode" && l.Status == http.StatusOK && holder == "":
			holder = l.Backend
		}
	}
	served = int(c.metric(t, "coordinator_conditional_decode_total", "outcome", "served"))
	if picker412 != 1 || served != 1 {
		t.Fatalf("%d 412s from the picker, %d served by conditional decode; want one of each", picker412, served)
	}
	for _, w := range c.pools["decode"] {
		if w.url == holder {
			w.kill(t)
		}
	}
	if o := c.ask(context.Background(), 0, 0, true); o.err != nil || o.truncated != "" {
		t.Fatalf("after the holder died: %v %s", o.err, o.truncated)
	}
}

// With the whole prefill pool down, on_pool_failure decides: fail answers a fast, clear 503,
// and the extra legs stay within the retry budget; aggregate serves every request on decode
// alone.
func TestWholePoolDown(t *testing.T) {
	for _, policy := range []string{"fail", "aggregate"} {
		t.Run(policy, func(t *testing.T) {
			c := startCluster(t, options{prefill: 2, decode: 1, steps: pd, pipeline: "on_pool_failure: " + policy,
				gateway: "retry: {budget_ratio: 0.2, budget_min_per_second: 1}"})
			for _, w := range c.pools["prefill"] {
				w.kill(t)
			}
			const requests = 60
			start := time.Now()
			ta := c.load(context.Background(), 4, requests/4, nil)
			elapsed := time.Since(start)
			t.Logf("%s: %s; %s", policy, ta, c.checkBudget(t, elapsed))
			if policy == "aggregate" {
				if ta.failed != 0 || ta.truncated != 0 {
					t.Fatalf("aggregate: %s", ta)
				}
				if n := c.metric(t, "coordinator_degraded_requests_total", "phase", "prefill", "outcome", "aggregated"); n != requests {
					t.Fatalf("%v requests degraded, want %d", n, requests)
				}
				return
			}
			if ta.failed != requests || ta.byStatus[http.StatusServiceUnavailable] != requests {
				t.Fatalf("fail: want every request a 503: %s", ta)
			}
			if ta.maxDuration > 2*time.Second {
				t.Fatalf("the slowest 503 took %s: a dead pool must fail fast", ta.maxDuration)
			}
			o := c.ask(context.Background(), 99, 0, false)
			var apiErr *openai.Error
			if !errors.As(o.err, &apiErr) || apiErr.Type != "service_unavailable_error" || apiErr.Code != "pool_unavailable" ||
				apiErr.Response.Header.Get("Retry-After") == "" {
				t.Fatalf("the 503: %v", o.err)
			}
		})
	}
}

// checkBudget fails the test when the retries (and resumes) exceed the budget the clusters
// configure (retry: {budget_ratio: 0.2, budget_min_per_second: 1}): a fifth of a retry per first
// attempt of any phase, a burst of ten, and one a second over elapsed. It describes the legs.
func (c *cluster) checkBudget(t *testing.T, elapsed time.Duration) string {
	t.Helper()
	legs := len(c.gw.Legs())
	retries := int(c.metric(t, "coordinator_upstream_retries_total") + c.metric(t, "coordinator_stream_resumes_total", "outcome", "resumed"))
	if budget := (legs-retries)/5 + 10 + int(elapsed.Seconds()) + 1; retries > budget {
		t.Fatalf("%d retries for %d first attempts: over the budget (%d)", retries, legs-retries, budget)
	}
	return fmt.Sprintf("%d legs (%d retries) in %s", legs, retries, elapsed.Round(time.Millisecond))
}

// A stream that cannot be continued exactly (n = 2 here) and whose decode worker dies: the
// client gets an error event and an aborted body, never a clean end (the previous coordinator
// ended the chunked response cleanly, without [DONE]).
func TestCutStreamIsAnError(t *testing.T) {
	// The gateway double is told not to eject, so that both requests reach a dying worker.
	c := startCluster(t, options{prefill: 1, decode: 1, steps: pd, gwConfig: gateway.Config{EjectFor: -1}})
	c.pools["decode"][0].inject(t, simworker.Fault{Kind: simworker.FaultDieMidStream, AfterTokens: 3})
	text, _ := prompt(0, 0)
	s := c.client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model: "sim-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(text)},
		MaxTokens: openai.Int(maxTokens), N: openai.Int(2),
	})
	events := 0
	for s.Next() {
		events++
	}
	if err := s.Err(); err == nil || !strings.Contains(err.Error(), "stream_interrupted") || events == 0 {
		t.Fatalf("after %d events: err = %v, want the error event", events, err)
	}
	// At the HTTP level: the error event, then the body ends with an error (no last chunk).
	c.pools["decode"][0].inject(t, simworker.Fault{Kind: simworker.FaultDieMidStream, AfterTokens: 3})
	resp, err := http.Post(c.url+"/v1/chat/completions", "application/json", strings.NewReader(
		`{"model":"sim-model","stream":true,"n":2,"max_tokens":24,"messages":[{"role":"user","content":"`+text+`"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(string(b), `data: {"error":`) || strings.Contains(string(b), "[DONE]") {
		t.Fatalf("read err = %v, body %q: want the error event then an aborted body", err, b)
	}
}

// A tokens-in generate stream whose decode worker dies is continued with the prompt ids plus
// the output ids so far: the client gets exactly the uninterrupted ids.
func TestGenerateStreamResumes(t *testing.T) {
	c := startCluster(t, options{prefill: 1, decode: 2, steps: "{type: decode}"})
	const req = `{"model":"sim-model","token_ids":[1,4,200,300,400,500],"stream":true,"sampling_params":{"max_tokens":12,"temperature":0}}`
	ids := func() ([]int, string) {
		resp, err := http.Post(c.url+"/inference/v1/generate", "application/json", strings.NewReader(req))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("read: %v (%q)", err, b)
		}
		var out []int
		reqIDs := map[string]bool{}
		for _, line := range strings.Split(string(b), "\n") {
			d, ok := strings.CutPrefix(line, "data: ")
			if !ok || d == "[DONE]" {
				continue
			}
			var ev struct {
				RequestID string `json:"request_id"`
				Choices   []struct {
					TokenIDs []int `json:"token_ids"`
				} `json:"choices"`
			}
			if err := json.Unmarshal([]byte(d), &ev); err != nil {
				t.Fatalf("event %q: %v", d, err)
			}
			reqIDs[ev.RequestID] = true
			for _, ch := range ev.Choices {
				out = append(out, ch.TokenIDs...)
			}
		}
		if len(reqIDs) != 1 || strings.Count(string(b), "data: [DONE]") != 1 {
			t.Fatalf("ids %v, body %q: want one request id and one [DONE]", reqIDs, b)
		}
		return out, string(b)
	}
	want, _ := ids()
	for _, w := range c.pools["decode"] {
		w.inject(t, simworker.Fault{Kind: simworker.FaultDieMidStream, AfterTokens: 4})
	}
	got, body := ids()
	if !slices.Equal(got, want) || len(want) != 12 {
		t.Fatalf("resumed ids %v, uninterrupted %v (%s)", got, want, body)
	}
	if n := c.metric(t, "coordinator_stream_resumes_total", "outcome", "resumed"); n < 1 {
		t.Fatalf("%v resumes", n)
	}
}

// With decode's force_stream, a non-streaming client's answer is streamed from the worker and
// folded: a decode worker dying mid-answer is resumed, and the client gets the whole JSON answer.
func TestForceStreamSurvivesADeadDecode(t *testing.T) {
	c := startCluster(t, options{prefill: 1, decode: 2, steps: "{type: prefill}, {type: decode, params: {force_stream: true}}"})
	for _, w := range c.pools["decode"] {
		w.inject(t, simworker.Fault{Kind: simworker.FaultDieMidStream, AfterTokens: 5})
	}
	if o := c.ask(context.Background(), 3, 0, false); o.err != nil || o.truncated != "" {
		t.Fatalf("%v %s\n%s", o.err, o.truncated, c.logs.Tail(3000))
	}
	if n := c.metric(t, "coordinator_stream_resumes_total", "outcome", "resumed"); n < 1 {
		t.Fatalf("%v resumes: the answer was not force-streamed", n)
	}
}

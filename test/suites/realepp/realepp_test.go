//go:build linux

package realepp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/epd-dev/coordinator/test/doubles/extprocgw"
)

// answer is what a client got for one request.
type answer struct {
	id     string
	text   string
	finish string
	err    error
}

// chat sends one chat completion with the request id id (streamed when stream) and reads the
// answer whole.
func (st *stack) chat(ctx context.Context, id, prompt string, stream bool, parts ...openai.ChatCompletionContentPartUnionParam) answer {
	msg := openai.UserMessage(prompt)
	if len(parts) > 0 {
		msg = openai.UserMessage(append([]openai.ChatCompletionContentPartUnionParam{openai.TextContentPart(prompt)}, parts...))
	}
	params := openai.ChatCompletionNewParams{Model: model, Messages: []openai.ChatCompletionMessageParamUnion{msg}}
	a := answer{id: id}
	opt := option.WithHeader("X-Request-Id", id)
	if !stream {
		resp, err := st.client.Chat.Completions.New(ctx, params, opt)
		if err != nil {
			a.err = err
			return a
		}
		if len(resp.Choices) != 1 {
			a.err = fmt.Errorf("%d choices", len(resp.Choices))
			return a
		}
		a.text, a.finish = resp.Choices[0].Message.Content, resp.Choices[0].FinishReason
		return a
	}
	s := st.client.Chat.Completions.NewStreaming(ctx, params, opt)
	var b strings.Builder
	for s.Next() {
		for _, c := range s.Current().Choices {
			b.WriteString(c.Delta.Content)
			if c.FinishReason != "" {
				a.finish = c.FinishReason
			}
		}
	}
	a.text, a.err = b.String(), s.Err()
	_ = s.Close()
	return a
}

// rawError is the JSON body of an API error, or "".
func rawError(err error) string {
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		return apiErr.RawJSON()
	}
	return ""
}

// settled returns the stand-in's records once none is in flight.
func (st *stack) settled() []extprocgw.Record {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return st.gw.Settled(ctx)
}

// legsOf returns the records of the legs of client request id, in arrival order: each leg has
// its own x-request-id (the decode leg keeps the client's) and carries the client's in
// x-coordinator-request-id.
func legsOf(recs []extprocgw.Record, id string) []extprocgw.Record {
	var out []extprocgw.Record
	for _, r := range recs {
		if r.Header.Get("X-Coordinator-Request-Id") == id {
			out = append(out, r)
		}
	}
	return out
}

// describe renders a request's legs as "profile→pod status" items, for messages and figures.
func (st *stack) describe(legs []extprocgw.Record) string {
	var parts []string
	for _, l := range legs {
		switch {
		case l.Immediate != 0:
			parts = append(parts, fmt.Sprintf("%s→EPP %d", l.Profile, l.Immediate))
		case len(l.Attempts) == 0:
			parts = append(parts, fmt.Sprintf("%s→%d", l.Profile, l.Status))
		default:
			var tries []string
			for _, a := range l.Attempts {
				out := fmt.Sprint(a.Status)
				if a.Failure != "" {
					out = a.Failure
				}
				tries = append(tries, st.podOf(a.Endpoint)+" "+out)
			}
			s := fmt.Sprintf("%s→%s", l.Profile, strings.Join(tries, ", "))
			if l.Status != 200 && l.Status != l.Attempts[len(l.Attempts)-1].Status {
				s += fmt.Sprintf(" (%d)", l.Status)
			}
			if l.Broken {
				s += " (broken)"
			}
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, "; ")
}

// prompt is a distinct prompt of about 400 characters (several prefix blocks of the EPP's
// approximate prefix index).
func prompt(tag string) string {
	return tag + ": " + strings.Repeat("the quick brown fox jumps over the lazy dog ", 9) + tag
}

// servedBy checks that leg was forwarded once, answered 200 by a pod of role, and returns it.
func (st *stack) servedBy(t *testing.T, leg extprocgw.Record, role string) *sim {
	t.Helper()
	if leg.Immediate != 0 || leg.Status != http.StatusOK || len(leg.Attempts) != 1 || leg.Attempts[0].Status != http.StatusOK {
		t.Errorf("%s leg: %s, want one 200 from a %s pod", leg.Profile, st.describe([]extprocgw.Record{leg}), role)
		return nil
	}
	for _, s := range st.byRole(role) {
		if s.addr == leg.Attempts[0].Endpoint {
			return s
		}
	}
	t.Errorf("%s leg served by %s (%s), not a %s pod", leg.Profile, leg.Attempts[0].Endpoint, st.podOf(leg.Attempts[0].Endpoint), role)
	return nil
}

// Decode only: plain and streamed answers, then 16 clients at once; every answer is the echo
// of its prompt and every request is one decode leg that a decode pod served.
func TestDecodeOnly(t *testing.T) {
	st := startStack(t, stackOptions{decode: 2, steps: "{type: decode}", simArgs: []string{"--inter-token-latency", "1ms"}})
	ctx := context.Background()
	for _, stream := range []bool{false, true} {
		id := uuid.NewString()
		a := st.chat(ctx, id, prompt("single"), stream)
		if a.err != nil || a.text != prompt("single") || a.finish != "stop" {
			t.Fatalf("stream=%v: %q %q %v", stream, a.text, a.finish, a.err)
		}
		legs := legsOf(st.settled(), id)
		if len(legs) != 1 || legs[0].Profile != "decode" || len(legs[0].Picks) != 1 {
			t.Fatalf("stream=%v: legs %s", stream, st.describe(legs))
		}
		st.servedBy(t, legs[0], "decode")
	}

	const clients, each = 16, 4
	var wg sync.WaitGroup
	answers := make([]answer, clients*each)
	for c := range clients {
		wg.Go(func() {
			for i := range each {
				answers[c*each+i] = st.chat(ctx, uuid.NewString(), prompt(fmt.Sprintf("client %d request %d", c, i)), (c+i)%2 == 0)
			}
		})
	}
	wg.Wait()
	recs := st.settled()
	served := map[string]int{}
	for n, a := range answers {
		want := prompt(fmt.Sprintf("client %d request %d", n/each, n%each))
		if a.err != nil || a.text != want || a.finish != "stop" {
			t.Errorf("request %d: %q %q %v", n, a.text, a.finish, a.err)
			continue
		}
		legs := legsOf(recs, a.id)
		if len(legs) != 1 {
			t.Errorf("request %d: legs %s", n, st.describe(legs))
			continue
		}
		if s := st.servedBy(t, legs[0], "decode"); s != nil {
			served[s.pod]++
		}
	}
	t.Logf("%d concurrent requests served by %v", clients*each, served)
	if len(served) != 2 || served["decode-0"]+served["decode-1"] != clients*each {
		t.Errorf("decode pods served %v, want both pods to share %d requests", served, clients*each)
	}
}

// Prefill then decode with kv-nixl: the prefill leg goes to the prefill pod capped at one
// token, and the decode pod gets the kv_transfer_params the prefill worker answered.
func TestPrefillDecodeNIXL(t *testing.T) {
	st := startStack(t, stackOptions{prefill: 1, decode: 1, steps: "{type: prefill}, {type: decode}"})
	ctx := context.Background()
	for _, stream := range []bool{false, true} {
		id := uuid.NewString()
		a := st.chat(ctx, id, prompt("pd"), stream)
		if a.err != nil || a.text != prompt("pd") || a.finish != "stop" {
			t.Fatalf("stream=%v: %q %q %v", stream, a.text, a.finish, a.err)
		}
		legs := legsOf(st.settled(), id)
		if len(legs) != 2 || legs[0].Profile != "prefill" || legs[1].Profile != "decode" {
			t.Fatalf("stream=%v: legs %s", stream, st.describe(legs))
		}
		st.servedBy(t, legs[0], "prefill")
		st.servedBy(t, legs[1], "decode")
		if legs[0].RequestID != id+"-prefill" || legs[1].RequestID != id {
			t.Errorf("x-request-id of the legs: %s, %s; want %s-prefill, %[3]s", legs[0].RequestID, legs[1].RequestID, id)
		}
		var prefill, decode struct {
			MaxTokens int             `json:"max_tokens"`
			Stream    bool            `json:"stream"`
			KV        json.RawMessage `json:"kv_transfer_params"`
		}
		if err := json.Unmarshal(legs[0].Body, &prefill); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(legs[1].Body, &decode); err != nil {
			t.Fatal(err)
		}
		// The prefill leg asks for a remote decode; the simulator answers its (dummy) NIXL
		// descriptor, which the decode leg carries with the flags flipped.
		if prefill.MaxTokens != 1 || prefill.Stream ||
			string(prefill.KV) != `{"do_remote_decode":true,"do_remote_prefill":false,"remote_block_ids":null,"remote_engine_id":null,"remote_host":null,"remote_port":null}` {
			t.Errorf("prefill leg: %s", legs[0].Body)
		}
		if decode.Stream != stream ||
			string(decode.KV) != `{"do_remote_decode":false,"do_remote_prefill":true,"remote_engine_id":"DUMMY_ID","remote_block_ids":["DUMMY_ID"],"remote_host":"DUMMY","remote_port":1234,"tp_size":1}` {
			t.Errorf("decode leg: %s", legs[1].Body)
		}
	}
}

// Conditional decode: the EPP itself answers 412 for a prompt no decode pod holds (it knows
// matches from its approximate prefix index), so the coordinator runs prefill and decode; the
// same prompt again is served by the conditional decode leg, on the decode pod that holds it.
func TestConditionalDecode(t *testing.T) {
	st := startStack(t, stackOptions{prefill: 1, decode: 2, steps: "{type: conditional-decode}, {type: prefill}, {type: decode}"})
	ctx := context.Background()
	for _, stream := range []bool{false, true} {
		p := prompt(fmt.Sprintf("conditional stream=%v", stream))
		first, repeat := uuid.NewString(), uuid.NewString()
		if a := st.chat(ctx, first, p, stream); a.err != nil || a.text != p || a.finish != "stop" {
			t.Fatalf("stream=%v first: %q %q %v", stream, a.text, a.finish, a.err)
		}
		legs := legsOf(st.settled(), first)
		if len(legs) != 3 || legs[0].Profile != "decode" || legs[0].Immediate != http.StatusPreconditionFailed || len(legs[0].Attempts) != 0 ||
			legs[1].Profile != "prefill" || legs[2].Profile != "decode" {
			t.Fatalf("stream=%v first request: legs %s, want decode→EPP 412; prefill; decode", stream, st.describe(legs))
		}
		st.servedBy(t, legs[1], "prefill")
		holder := st.servedBy(t, legs[2], "decode")
		if legs[0].RequestID != first+"-conditional" || legs[1].RequestID != first+"-prefill" || legs[2].RequestID != first {
			t.Errorf("x-request-id of the legs: %s, %s, %s", legs[0].RequestID, legs[1].RequestID, legs[2].RequestID)
		}

		if a := st.chat(ctx, repeat, p, stream); a.err != nil || a.text != p || a.finish != "stop" {
			t.Fatalf("stream=%v repeat: %q %q %v", stream, a.text, a.finish, a.err)
		}
		legs = legsOf(st.settled(), repeat)
		if len(legs) != 1 || legs[0].Profile != "decode" {
			t.Fatalf("stream=%v repeat: legs %s, want one conditional decode leg", stream, st.describe(legs))
		}
		if s := st.servedBy(t, legs[0], "decode"); s != nil && holder != nil && s != holder {
			t.Errorf("stream=%v: the repeat was served by %s, the prompt is on %s", stream, s.pod, holder.pod)
		}
		t.Logf("stream=%v: first %s | repeat %s", stream, st.describe(legsOf(st.settled(), first)), st.describe(legs))
	}
}

// Two distinct 1x1 PNG images.
const (
	imageA = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
	imageB = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)

// Encode, prefill and decode with three images (two distinct): render through the simulator's
// render service, one encode leg per image (in parallel, on the encode pods), the encoders'
// ec_transfer_params merged into the prefill leg, then decode.
func TestEncodePrefillDecodeImages(t *testing.T) {
	st := startStack(t, stackOptions{encode: 2, prefill: 1, decode: 1, render: true,
		steps: "{type: render, params: {address: %RENDER%}}, {type: encode}, {type: prefill}, {type: decode}"})
	ctx := context.Background()
	images := []string{imageA, imageB, imageA}
	var parts []openai.ChatCompletionContentPartUnionParam
	for _, img := range images {
		parts = append(parts, openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: img}))
	}
	id := uuid.NewString()
	a := st.chat(ctx, id, "describe", false, parts...)
	// The echo simulator answers the text and the image parts of the last message.
	if a.err != nil || a.finish != "stop" || !strings.HasPrefix(a.text, "describe") || strings.Count(a.text, "image: ") != 3 {
		t.Fatalf("%q %q %v", a.text, a.finish, a.err)
	}
	legs := legsOf(st.settled(), id)
	var encodes []extprocgw.Record
	for _, l := range legs {
		if l.Profile == "encode" {
			encodes = append(encodes, l)
		}
	}
	if len(legs) != 5 || len(encodes) != 3 || legs[3].Profile != "prefill" || legs[4].Profile != "decode" {
		t.Fatalf("legs %s, want three encode legs, prefill, decode", st.describe(legs))
	}
	// Each encode leg carries one image and its mm_hash; the simulator's encoder names its
	// output sim_img_0_<the image's hash>, so the two distinct images give two descriptors.
	wantEC := map[string]bool{}
	seenImages := map[string]int{}
	for _, l := range encodes {
		st.servedBy(t, l, "encode")
		var body struct {
			Messages []struct {
				Content []struct {
					ImageURL struct{ URL string } `json:"image_url"`
				} `json:"content"`
			} `json:"messages"`
			Tokens struct {
				Features struct {
					MMHashes struct{ Image []string } `json:"mm_hashes"`
				} `json:"features"`
			} `json:"tokens"`
		}
		if err := json.Unmarshal(l.Body, &body); err != nil || len(body.Messages) != 1 || len(body.Messages[0].Content) != 1 ||
			len(body.Tokens.Features.MMHashes.Image) != 1 {
			t.Fatalf("encode leg %s: %v", l.Body, err)
		}
		seenImages[body.Messages[0].Content[0].ImageURL.URL]++
		h := body.Tokens.Features.MMHashes.Image[0]
		wantEC["sim_img_0_"+h[strings.LastIndex(h, "_")+1:]] = true
	}
	if seenImages[imageA] != 2 || seenImages[imageB] != 1 {
		t.Errorf("encode legs carried %v", seenImages)
	}
	// Parallel legs have x-request-ids of their own: the EPP keys per-request plugin state on it.
	ids := map[string]bool{}
	for _, l := range encodes {
		ids[l.RequestID] = true
	}
	if !ids[id+"-encode-0"] || !ids[id+"-encode-1"] || !ids[id+"-encode-2"] {
		t.Errorf("encode legs' x-request-ids %v, want %s-encode-0..2", ids, id)
	}
	st.servedBy(t, legs[3], "prefill")
	st.servedBy(t, legs[4], "decode")
	var prefill struct {
		EC map[string]struct {
			PeerHost string `json:"peer_host"`
		} `json:"ec_transfer_params"`
	}
	if err := json.Unmarshal(legs[3].Body, &prefill); err != nil {
		t.Fatal(err)
	}
	var got []string
	for k := range prefill.EC {
		got = append(got, k)
	}
	slices.Sort(got)
	if len(wantEC) != 2 || len(got) != 2 || !wantEC[got[0]] || !wantEC[got[1]] {
		t.Errorf("prefill's ec_transfer_params %v, want the encoders' descriptors %v", got, wantEC)
	}
	t.Logf("legs: %s", st.describe(legs))
}

// A role without a Ready pod: the EPP answers 429 for that profile (503 is for an empty pool).
// The decode pod NotReady: the coordinator retries the 429 (three attempts, each an EPP 429)
// and the client gets 429. The prefill pod NotReady instead: the prefill pool's failure
// degrades the request (pipeline.on_pool_failure: aggregate) and the decode pod serves it alone.
func TestRoleNotReady(t *testing.T) {
	st := startStack(t, stackOptions{prefill: 1, decode: 1, steps: "{type: prefill}, {type: decode}"})
	ctx := context.Background()
	decode, prefill := st.byRole("decode")[0], st.byRole("prefill")[0]

	st.setReady(decode, false)
	st.waitReadyPods(1)
	id := uuid.NewString()
	a := st.chat(ctx, id, prompt("no decode"), false)
	var apiErr *openai.Error
	if !errors.As(a.err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Code != "rate_limit_exceeded" ||
		apiErr.Message != "decode: no endpoint can take the request now (HTTP 429: the endpoint picker found no ready pod for the profile, or the pod is saturated) (request_id: "+id+")" {
		t.Fatalf("decode NotReady: got %q %v (%s), want 429 rate_limit_exceeded", a.text, a.err, rawError(a.err))
	}
	legs := legsOf(st.settled(), id)
	if got := st.describe(legs); len(legs) != 4 || got != "prefill→prefill-0 200; decode→EPP 429; decode→EPP 429; decode→EPP 429" {
		t.Errorf("decode NotReady: legs %s", got)
	}

	st.setReady(decode, true)
	st.waitReadyPods(2)
	st.setReady(prefill, false)
	st.waitReadyPods(1)
	id = uuid.NewString()
	if a := st.chat(ctx, id, prompt("no prefill"), true); a.err != nil || a.text != prompt("no prefill") {
		t.Fatalf("prefill NotReady: %q %v", a.text, a.err)
	}
	legs = legsOf(st.settled(), id)
	if got := st.describe(legs); got != "prefill→EPP 429; prefill→EPP 429; prefill→EPP 429; decode→decode-0 200" {
		t.Errorf("prefill NotReady: legs %s", got)
	}
	var body struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(legs[len(legs)-1].Body, &body); err != nil || body.KV != nil {
		t.Errorf("the aggregated decode leg carries transfer parameters: %s", legs[len(legs)-1].Body)
	}
}

// kv-sglang's prefill-decode step first asks the picker for a reservation (Prefer:
// reserve-endpoint on the prefill profile). This EPP (llm-d-router ebab6879) has no
// reserve-endpoint plugin: it schedules the reservation like any prefill and forwards it, and the
// prefill pod answers it as a prefill (200 with a completion). The coordinator recognises a
// worker's answer, fails the request with 501 reserve_endpoint_unsupported naming the plugin, and
// for 30 s refuses prefill-decode requests without sending reservations (no more prefills wasted).
func TestSGLangReservationWithoutPlugin(t *testing.T) {
	st := startStack(t, stackOptions{prefill: 1, decode: 1, steps: "{type: prefill-decode}", kv: "kv-sglang"})
	const message = "prefill-decode needs the endpoint picker's reserve-endpoint plugin (llm-d-router's reserveendpoint, which answers " +
		"Prefer: reserve-endpoint with 204 and x-llm-d-reserved-host-port), and the picker in front of this pool does not run it: " +
		"the reservation was scheduled and served as a plain prefill. Configure the plugin in the EndpointPickerConfig, " +
		"or run prefill and decode steps with a connector other than kv-sglang"
	for i, want := range []string{"prefill→prefill-0 200", ""} {
		id := uuid.NewString()
		a := st.chat(context.Background(), id, prompt(fmt.Sprint("sglang ", i)), i == 1)
		var apiErr *openai.Error
		if !errors.As(a.err, &apiErr) || apiErr.StatusCode != http.StatusNotImplemented || apiErr.Code != "reserve_endpoint_unsupported" ||
			apiErr.Message != message+" (request_id: "+id+")" {
			t.Fatalf("request %d: got %q %v (%s), want 501 reserve_endpoint_unsupported naming the plugin", i, a.text, a.err, rawError(a.err))
		}
		// The first request's reservation reached the prefill pod as a prefill (compute spent on
		// an answer nobody reads); the next one sends nothing.
		legs := legsOf(st.settled(), id)
		if got := st.describe(legs); got != want {
			t.Errorf("request %d: legs %q, want %q", i, got, want)
		}
		if i == 0 && (len(legs) != 1 || legs[0].RequestID != id+"-reserve") {
			t.Errorf("the reservation's x-request-id is not %s-reserve: %+v", id, legs)
		}
	}
}

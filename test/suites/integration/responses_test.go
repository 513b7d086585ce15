package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/test/doubles/mediaserver"
	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/harness/stack"
)

// textInput is a Responses request of one text input.
func textInput(text string, maxTokens int64) responses.ResponseNewParams {
	return responses.ResponseNewParams{
		Model: "sim-model", MaxOutputTokens: openai.Int(maxTokens), Instructions: openai.String("answer briefly"),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(text)},
	}
}

// imageInput is a Responses request of a text part and one input_image part per URL.
func imageInput(text string, maxTokens int64, urls ...string) responses.ResponseNewParams {
	parts := responses.ResponseInputMessageContentListParam{{OfInputText: &responses.ResponseInputTextParam{Text: text}}}
	for _, u := range urls {
		parts = append(parts, responses.ResponseInputContentUnionParam{OfInputImage: &responses.ResponseInputImageParam{
			ImageURL: openai.String(u), Detail: responses.ResponseInputImageDetailAuto}})
	}
	return responses.ResponseNewParams{
		Model: "sim-model", MaxOutputTokens: openai.Int(maxTokens),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			responses.ResponseInputItemParamOfMessage(parts, responses.EasyInputMessageRoleUser)}},
	}
}

// streamResponse reads a Responses stream with the SDK: the text of its deltas, the event types
// in order, and the last event.
func streamResponse(ctx context.Context, c openai.Client, p responses.ResponseNewParams) (text string, types []string, last responses.ResponseStreamEventUnion, err error) {
	st := c.Responses.NewStreaming(ctx, p)
	var b strings.Builder
	for st.Next() {
		ev := st.Current()
		types = append(types, ev.Type)
		if ev.Type == "response.output_text.delta" {
			b.WriteString(ev.Delta)
		}
		last = ev
	}
	return b.String(), types, last, st.Err()
}

// legBodies returns the bodies a worker got on path, decoded.
func legBodies(t *testing.T, w *simworker.Worker, path string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, r := range w.Requests() {
		if r.Path != path {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(r.Body, &m); err != nil {
			t.Fatal(err)
		}
		m["__raw"] = string(r.Body)
		out = append(out, m)
	}
	return out
}

// tokenIDs reads tokens.token_ids of a leg body.
func tokenIDs(t *testing.T, leg map[string]any) []int {
	t.Helper()
	tok, _ := leg["tokens"].(map[string]any)
	raw, _ := tok["token_ids"].([]any)
	ids := make([]int, len(raw))
	for i, v := range raw {
		ids[i] = int(v.(float64))
	}
	return ids
}

// The Responses API runs the whole pipeline: render tokenizes the input once (translated to the
// chat messages vLLM builds from it; the workers' own reading of the Responses body gives the
// same ids), conditional decode misses then serves the repeat, prefill is capped to one output
// token, every leg is stateless (store: false), and the answer and its events reach the SDK as
// the worker sent them.
func TestResponsesThroughThePipeline(t *testing.T) {
	media := startMedia(t)
	s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, fullPipeline)
	ctx := context.Background()

	resp, err := s.client.Responses.New(ctx, textInput("alpha beta gamma", 5), option.WithHeader("X-Request-Id", "resp-text-1"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.OutputText() != "alpha beta gamma alpha beta" || resp.Usage.OutputTokens != 5 || resp.Object != "response" {
		t.Fatalf("answer %q, usage %+v", resp.OutputText(), resp.Usage)
	}
	if got := profiles(s.legsFor("resp-text-1")); got != "decode:412,prefill:200,decode:200" {
		t.Fatalf("legs %s", got)
	}
	pre := legBodies(t, s.stack.Prefill[0], simworker.PathResponses)
	if len(pre) != 1 {
		t.Fatalf("%d prefill legs on %s", len(pre), simworker.PathResponses)
	}
	p := pre[0]
	if p["max_output_tokens"] != 1.0 || p["stream"] != false || p["store"] != false || p["max_tokens"] != nil {
		t.Fatalf("prefill leg not capped to one output token, or not stateless: %s", p["__raw"])
	}
	own, err := simworker.RenderResponses([]byte(p["__raw"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	if ids := tokenIDs(t, p); len(ids) == 0 || !reflect.DeepEqual(ids, own) || int64(len(ids)) != resp.Usage.InputTokens {
		t.Fatalf("rendered ids %v; the worker reads the Responses body as %v (usage %d)", ids, own, resp.Usage.InputTokens)
	}
	dec := legBodies(t, s.stack.Decode[0], simworker.PathResponses)
	kv, _ := dec[len(dec)-1]["kv_transfer_params"].(map[string]any)
	if len(dec) != 2 || kv["do_remote_prefill"] != true || dec[len(dec)-1]["store"] != false || dec[len(dec)-1]["max_output_tokens"] != 5.0 {
		t.Fatalf("decode legs %v", dec)
	}

	// The same prompt again: the decode worker's prefix cache holds it, conditional decode serves it.
	again, err := s.client.Responses.New(ctx, textInput("alpha beta gamma", 5), option.WithHeader("X-Request-Id", "resp-text-2"))
	if err != nil || again.OutputText() != resp.OutputText() || again.Usage.InputTokensDetails.CachedTokens != resp.Usage.InputTokens {
		t.Fatalf("repeat: %v %q cached %d", err, again.OutputText(), again.Usage.InputTokensDetails.CachedTokens)
	}
	if got := profiles(s.legsFor("resp-text-2")); got != "decode:200" {
		t.Fatalf("repeat legs %s", got)
	}

	// Streamed, with one inline and one remote image: the remote one is downloaded by the media
	// guard, both are encoded (one chat-shaped leg each), and the stream is the worker's events.
	remote := media.URL() + "/img/b.png"
	text, types, last, err := streamResponse(ctx, s.client, imageInput("describe these", 4, dataURL(mediaserver.PNG("a")), remote))
	if err != nil {
		t.Fatal(err)
	}
	wantTypes := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"}
	if text != "describe these describe these" || !reflect.DeepEqual(types, wantTypes) || last.Response.Usage.OutputTokens != 4 {
		t.Fatalf("stream %q, events %v, last %+v", text, types, last.Response.Usage)
	}
	enc := legBodies(t, s.stack.Encode[0], simworker.PathChatCompletions)
	if len(enc) != 2 {
		t.Fatalf("%d encode legs, want one per image", len(enc))
	}
	dec = legBodies(t, s.stack.Decode[0], simworker.PathResponses)
	final := dec[len(dec)-1]
	input := final["input"].([]any)[0].(map[string]any)["content"].([]any)
	for i, part := range input[1:] {
		p := part.(map[string]any)
		u, _ := p["image_url"].(string)
		if p["type"] != "input_image" || !strings.HasPrefix(u, "data:image/png;base64,") || p["uuid"] == nil || p["detail"] != "auto" {
			t.Fatalf("decode leg image %d not inlined in the Responses shape with its mm_hash: %.200s", i, fmt.Sprint(p))
		}
	}
	if final["stream"] != true || final["ec_transfer_params"] != nil {
		t.Fatalf("decode leg %.300s", final["__raw"])
	}
}

// What a stateless coordinator cannot honour is a 400 naming the member, before any leg runs.
func TestResponsesStatefulRefused(t *testing.T) {
	s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, steps("prefill", "decode"))
	ctx := context.Background()
	tests := map[string]struct {
		edit  func(*responses.ResponseNewParams)
		param string
	}{
		"previous_response_id": {edit: func(p *responses.ResponseNewParams) { p.PreviousResponseID = openai.String("resp_earlier") }, param: "previous_response_id"},
		"store: true":          {edit: func(p *responses.ResponseNewParams) { p.Store = openai.Bool(true) }, param: "store"},
		"background: true":     {edit: func(p *responses.ResponseNewParams) { p.Background = openai.Bool(true) }, param: "background"},
		"a conversation": {edit: func(p *responses.ResponseNewParams) {
			p.Conversation = responses.ResponseNewParamsConversationUnion{OfString: openai.String("conv_1")}
		}, param: "conversation"},
		"a server-side tool": {edit: func(p *responses.ResponseNewParams) {
			p.Tools = []responses.ToolUnionParam{{OfWebSearch: &responses.WebSearchToolParam{Type: responses.WebSearchToolTypeWebSearch}}}
		}, param: "tools"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := textInput("x", 2)
			tc.edit(&p)
			_, err := s.client.Responses.New(ctx, p)
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != tc.param || !strings.Contains(apiErr.Message, "stateless") && tc.param != "tools" {
				t.Fatalf("got %v, want a 400 on %s", err, tc.param)
			}
		})
	}
	if n := len(s.stack.Prefill[0].Requests()) + len(s.stack.Decode[0].Requests()); n != 0 {
		t.Fatalf("%d legs ran for refused requests", n)
	}
}

// Decode workers failing under a Responses request: what the SDK client sees.
func TestResponsesDecodeFaults(t *testing.T) {
	t.Run("dying mid-stream: the deltas so far, then the API's error event and a broken stream", func(t *testing.T) {
		s := start(t, stack.Options{Decoders: 2}, "kv-nixl", "ec-nixl", true, steps("prefill", "decode"))
		for _, w := range s.stack.Decode {
			if err := w.InjectFault(simworker.Fault{Kind: simworker.FaultDieMidStream, AfterTokens: 2, Count: 1}); err != nil {
				t.Fatal(err)
			}
		}
		text, types, last, err := streamResponse(context.Background(), s.client, textInput("one two three", 6))
		if err == nil || text != "one two" || last.Type != "error" || last.Code != "stream_interrupted" || last.SequenceNumber != int64(len(types)-1) {
			t.Fatalf("text %q, last %s/%s #%d of %d events, err %v", text, last.Type, last.Code, last.SequenceNumber, len(types), err)
		}
		if !strings.Contains(last.Message, "responses streams are not resumed") {
			t.Fatalf("error event %q does not say why", last.Message)
		}
	})
	t.Run("refusing: a 503 on one pick is retried on the other, the client never sees it", func(t *testing.T) {
		s := start(t, stack.Options{Decoders: 2}, "kv-nixl", "ec-nixl", true, steps("decode"))
		s.stack.Decode[0].FailNext(1, http.StatusServiceUnavailable, "")
		s.stack.Decode[1].FailNext(1, http.StatusServiceUnavailable, "")
		for range 2 {
			resp, err := s.client.Responses.New(context.Background(), textInput("x y", 3))
			if err != nil || resp.OutputText() != "x y x" {
				t.Fatalf("%v %q", err, resp.OutputText())
			}
		}
	})
	t.Run("refusing every pick: the pool's 503", func(t *testing.T) {
		s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, steps("decode"))
		s.stack.Decode[0].FailNext(100, http.StatusServiceUnavailable, "")
		_, err := s.client.Responses.New(context.Background(), textInput("x y", 3))
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("got %v, want 503", err)
		}
	})
	t.Run("hanging after its headers: a 502 after gateway.idle_timeout", func(t *testing.T) {
		s := startWith(t, stack.Options{}, "kv-nixl", "ec-nixl", true, steps("decode"), func(c *config.Config) {
			c.Gateway.IdleTimeout = config.Duration(300 * time.Millisecond)
		})
		if err := s.stack.Decode[0].InjectFault(simworker.Fault{Kind: simworker.FaultHangAfterHeaders, Count: 100}); err != nil {
			t.Fatal(err)
		}
		_, _, _, err := streamResponse(context.Background(), s.client, textInput("x y", 3))
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadGateway {
			t.Fatalf("got %v, want 502", err)
		}
	})
}

// A Responses stream's time to first token, inter-token latency (one sample per delta after the
// first) and tokens (from response.completed's usage) are measured like chat's, route responses.
func TestResponsesMetrics(t *testing.T) {
	s, reg := startTokenMetrics(t, 1)
	const maxTokens = 5
	// A model is a label once a worker served it: the first answer admits it.
	if _, err := s.client.Responses.New(context.Background(), textInput("admit the model", 1)); err != nil {
		t.Fatal(err)
	}
	text, _, last, err := streamResponse(context.Background(), s.client, textInput("measure this", maxTokens))
	if err != nil || text == "" {
		t.Fatalf("%v %q", err, text)
	}
	route := map[string]string{"route": "responses", "model": simworker.DefaultModelName}
	awaitValue(func() float64 {
		n, _ := histogram(t, reg, "coordinator_time_to_first_token_seconds", route)
		return float64(n)
	}, 2)
	if n, sum := histogram(t, reg, "coordinator_time_to_first_token_seconds", route); n != 2 || sum < 2*workerTTFT.Seconds() {
		t.Fatalf("time to first token: %d samples, %.3fs", n, sum)
	}
	if n, _ := histogram(t, reg, "coordinator_inter_token_latency_seconds", route); n != maxTokens-1 {
		t.Fatalf("inter-token latency: %d samples, want one per delta after the first (%d)", n, maxTokens-1)
	}
	tokens := func(kind string) float64 {
		return counter(t, reg, "coordinator_tokens_total", map[string]string{"route": "responses", "model": simworker.DefaultModelName, "kind": kind})
	}
	if got := tokens(observe.TokensCompletion); got != maxTokens+1 {
		t.Fatalf("completion tokens %v, want %d", got, maxTokens+1)
	}
	if got := tokens(observe.TokensPrompt); got <= float64(last.Response.Usage.InputTokens) || last.Response.Usage.InputTokens == 0 {
		t.Fatalf("prompt tokens %v, the answer says %d", got, last.Response.Usage.InputTokens)
	}
}

// With use_openai_format: false the prefill leg is tokens-in generate, from the ids render gave
// the Responses request; decode stays on /v1/responses and its answer is the Responses API's.
func TestResponsesTokensInPrefill(t *testing.T) {
	s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", false, steps("render", "prefill", "decode"))
	resp, err := s.client.Responses.New(context.Background(), textInput("tokens in please", 4))
	if err != nil || resp.OutputText() != "tokens in please tokens" {
		t.Fatalf("%v %q", err, resp.OutputText())
	}
	pre := legBodies(t, s.stack.Prefill[0], simworker.PathGenerate)
	if len(pre) != 1 || len(legBodies(t, s.stack.Prefill[0], simworker.PathResponses)) != 0 {
		t.Fatalf("prefill legs: %d generate", len(pre))
	}
	dec := legBodies(t, s.stack.Decode[0], simworker.PathResponses)
	if len(dec) != 1 {
		t.Fatalf("%d decode legs on %s", len(dec), simworker.PathResponses)
	}
	own, err := simworker.RenderResponses([]byte(dec[0]["__raw"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := pre[0]["token_ids"].([]any)
	ids := make([]int, len(raw))
	for i, v := range raw {
		ids[i] = int(v.(float64))
	}
	if !reflect.DeepEqual(ids, own) || !reflect.DeepEqual(tokenIDs(t, dec[0]), own) {
		t.Fatalf("prefill token_ids %v, decode tokens %v; the worker renders %v", ids, tokenIDs(t, dec[0]), own)
	}
}

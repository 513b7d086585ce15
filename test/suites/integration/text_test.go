package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/harness/stack"
)

func chatParams(text string, maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     "sim-model",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage(text)},
		MaxTokens: openai.Int(maxTokens),
	}
}

// streamChat collects a streamed chat answer through the SDK.
func streamChat(t *testing.T, c openai.Client, p openai.ChatCompletionNewParams, opts ...option.RequestOption) (string, int) {
	t.Helper()
	text, chunks, err := readStream(c, p, nil, opts...)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	return text, chunks
}

// readStream streams a chat (with usage) through the SDK and returns its text, its number of
// chunks and the stream's error; first, when set, is called once the first chunk arrived. It
// does not touch the test, so a goroutine may call it.
func readStream(c openai.Client, p openai.ChatCompletionNewParams, first func(), opts ...option.RequestOption) (string, int, error) {
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	s := c.Chat.Completions.NewStreaming(context.Background(), p, opts...)
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for s.Next() {
		acc.AddChunk(s.Current())
		if chunks++; chunks == 1 && first != nil {
			first()
		}
	}
	if err := s.Err(); err != nil {
		return "", chunks, err
	}
	if len(acc.Choices) == 0 {
		return "", chunks, fmt.Errorf("a stream of %d chunks without a choice", chunks)
	}
	return acc.Choices[0].Message.Content, chunks, nil
}

func TestDecodeOnly(t *testing.T) {
	s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, steps("decode"))
	ctx := context.Background()
	var id string
	resp, err := s.client.Chat.Completions.New(ctx, chatParams("alpha beta gamma", 5), option.WithResponseInto(new(*http.Response)),
		option.WithHeader("X-Request-Id", "client-id-1"), option.WithHeader("Authorization", "Bearer user-key"))
	if err != nil {
		t.Fatal(err)
	}
	id = "client-id-1"
	if resp.Choices[0].Message.Content != "alpha beta gamma alpha beta" || resp.Usage.CompletionTokens != 5 {
		t.Fatalf("answer %+v", resp.Choices[0].Message)
	}
	text, chunks := streamChat(t, s.client, chatParams("one two", 3))
	if text != "one two one" || chunks < 4 {
		t.Fatalf("stream %q in %d chunks", text, chunks)
	}
	comp, err := s.client.Completions.New(ctx, openai.CompletionNewParams{
		Model: "sim-model", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x y z")}, MaxTokens: openai.Int(4),
	})
	if err != nil || comp.Choices[0].Text != "x y z x" {
		t.Fatalf("completions %v %+v", err, comp)
	}
	cs := s.client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model: "sim-model", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("p q")}, MaxTokens: openai.Int(3),
	})
	var streamed strings.Builder
	for cs.Next() {
		for _, c := range cs.Current().Choices {
			streamed.WriteString(c.Text)
		}
	}
	if cs.Err() != nil || streamed.String() != "p q p" {
		t.Fatalf("completions stream %q %v", streamed.String(), cs.Err())
	}

	dec := s.stack.Decode[0].Requests()
	if len(dec) != 4 || len(s.stack.Prefill[0].Requests()) != 0 || len(s.stack.Encode[0].Requests()) != 0 {
		t.Fatalf("legs: decode %d prefill %d encode %d", len(dec), len(s.stack.Prefill[0].Requests()), len(s.stack.Encode[0].Requests()))
	}
	for _, r := range dec {
		if strings.Contains(string(r.Body), "kv_transfer_params") || strings.Contains(string(r.Body), `"tokens"`) {
			t.Fatalf("decode-only leg carries invented fields: %s", r.Body)
		}
		if r.Header.Get("EPP-Profile") != "decode" || r.Header.Get("X-Request-Id") == "" {
			t.Fatalf("decode leg headers %v", r.Header)
		}
	}
	if dec[0].Header.Get("X-Request-Id") != id || dec[0].Header.Get("Authorization") != "Bearer user-key" {
		t.Fatalf("first leg headers %v", dec[0].Header)
	}
	if got := profiles(s.legsFor(id)); got != "decode:200" {
		t.Fatalf("legs %s", got)
	}
}

func TestPrefillDecodeEachKVConnector(t *testing.T) {
	for _, kv := range []string{"kv-nixl", "kv-shared-storage"} { // kv-sglang: sglang_test.go
		t.Run(kv, func(t *testing.T) {
			s := start(t, stack.Options{KVConnector: kv}, kv, "ec-shared-storage", true, steps("prefill", "decode"))
			ctx := context.Background()
			var httpResp *http.Response
			resp, err := s.client.Chat.Completions.New(ctx, chatParams("red green blue", 4), option.WithResponseInto(&httpResp))
			if err != nil {
				t.Fatal(err)
			}
			if resp.Choices[0].Message.Content != "red green blue red" {
				t.Fatalf("answer %q", resp.Choices[0].Message.Content)
			}
			text, _ := streamChat(t, s.client, chatParams("cyan magenta", 3))
			if text != "cyan magenta cyan" {
				t.Fatalf("stream %q", text)
			}
			id := httpResp.Header.Get("X-Request-Id")
			if got := profiles(s.legsFor(id)); got != "prefill:200,decode:200" {
				t.Fatalf("legs %s", got)
			}
			pre, dec := received(t, s.stack.Prefill[0]), received(t, s.stack.Decode[0])
			if len(pre) != 2 || len(dec) != 2 {
				t.Fatalf("prefill %d decode %d", len(pre), len(dec))
			}
			// Prefill legs are capped single-token, non-streaming, with the connector's params.
			p := pre[1]
			if p["max_tokens"] != 1.0 || p["stream"] != false || p["stream_options"] != nil {
				t.Fatalf("prefill leg not capped: %v", mustJSON(t, p))
			}
			kvp := p["kv_transfer_params"].(map[string]any)
			if kvp["do_remote_decode"] != true || kvp["do_remote_prefill"] != false {
				t.Fatalf("prefill kv params %v", kvp)
			}
			// Decode legs keep the client's own limits and stream flag and carry the transfer.
			d := dec[1]
			if d["max_tokens"] != 3.0 || d["stream"] != true {
				t.Fatalf("decode leg lost client fields: %v", mustJSON(t, d))
			}
			dkv := d["kv_transfer_params"].(map[string]any)
			if dkv["do_remote_decode"] != false || dkv["do_remote_prefill"] != true {
				t.Fatalf("decode kv params %v", dkv)
			}
			switch kv {
			case "kv-nixl":
				if kvp["remote_engine_id"] != nil || dkv["remote_engine_id"] != s.stack.Prefill[0].EngineID() || dkv["remote_block_ids"] == nil {
					t.Fatalf("nixl params: prefill %v decode %v", kvp, dkv)
				}
			case "kv-shared-storage":
				if len(kvp) != 2 || len(dkv) != 2 {
					t.Fatalf("shared-storage params carry extras: %v %v", kvp, dkv)
				}
			}
		})
	}
}

func TestConditionalDecodeMissThenHit(t *testing.T) {
	s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, steps("conditional-decode", "prefill", "decode"))
	ctx := context.Background()
	var first, second *http.Response
	a, err := s.client.Chat.Completions.New(ctx, chatParams("cache me please", 3), option.WithResponseInto(&first))
	if err != nil {
		t.Fatal(err)
	}
	if got := profiles(s.legsFor(first.Header.Get("X-Request-Id"))); got != "decode:412,prefill:200,decode:200" {
		t.Fatalf("miss legs %s", got)
	}
	probe := s.stack.Decode[0].Requests()[0]
	if probe.Header.Get("Prefer") != "if-available" || strings.Contains(string(probe.Body), "kv_transfer_params") {
		t.Fatalf("probe %v %s", probe.Header, probe.Body)
	}
	b, err := s.client.Chat.Completions.New(ctx, chatParams("cache me please", 3), option.WithResponseInto(&second))
	if err != nil {
		t.Fatal(err)
	}
	if got := profiles(s.legsFor(second.Header.Get("X-Request-Id"))); got != "decode:200" {
		t.Fatalf("hit legs %s", got)
	}
	if a.Choices[0].Message.Content != b.Choices[0].Message.Content {
		t.Fatalf("hit answer differs: %q vs %q", a.Choices[0].Message.Content, b.Choices[0].Message.Content)
	}
	// A streamed hit is streamed through.
	text, chunks := streamChat(t, s.client, chatParams("cache me please", 3))
	if text != a.Choices[0].Message.Content || chunks < 4 {
		t.Fatalf("streamed hit %q in %d chunks", text, chunks)
	}
}

func TestGenerateFormat(t *testing.T) {
	s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, steps("prefill", "decode"))
	body := `{"model":"sim-model","token_ids":[1,4,200,300,400],"sampling_params":{"max_tokens":3,"temperature":0}}`
	resp, b := s.post("/inference/v1/generate", body, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	var out simworker.GenerateResponse
	if err := json.Unmarshal(b, &out); err != nil || len(out.Choices) != 1 || len(out.Choices[0].TokenIDs) != 3 {
		t.Fatalf("answer %s", b)
	}
	pre, dec := received(t, s.stack.Prefill[0]), received(t, s.stack.Decode[0])
	sp := pre[0]["sampling_params"].(map[string]any)
	if sp["max_tokens"] != 1.0 || sp["temperature"] != 0.0 || sp["extra_args"].(map[string]any)["kv_transfer_params"] == nil || pre[0]["request_id"] == nil {
		t.Fatalf("prefill leg %s", mustJSON(t, pre[0]))
	}
	dsp := dec[0]["sampling_params"].(map[string]any)
	if dsp["max_tokens"] != 3.0 || dsp["extra_args"].(map[string]any)["kv_transfer_params"].(map[string]any)["remote_engine_id"] != s.stack.Prefill[0].EngineID() {
		t.Fatalf("decode leg %s", mustJSON(t, dec[0]))
	}
	if _, top := dec[0]["kv_transfer_params"]; top {
		t.Fatal("generate decode leg has top-level kv_transfer_params")
	}
}

func TestUpstreamErrors(t *testing.T) {
	s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, steps("prefill", "decode"))
	ctx := context.Background()
	var apiErr *openai.Error

	// A worker's rejection reaches the client with the worker's own message (addresses redacted):
	// tools detect context-length errors by it.
	s.stack.Prefill[0].FailNext(1, http.StatusBadRequest,
		`{"error":{"message":"This model's maximum context length is 16 tokens (worker 10.0.0.9:8000)","type":"BadRequestError","param":"messages","code":400}}`)
	_, err := s.client.Chat.Completions.New(ctx, chatParams("x", 2))
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Type != "invalid_request_error" || apiErr.Param != "messages" ||
		!strings.HasPrefix(apiErr.Message, "This model's maximum context length is 16 tokens (worker <redacted>)") {
		t.Fatalf("prefill 4xx: %v", err)
	}

	s.stack.Prefill[0].FailNext(1, http.StatusInternalServerError, "")
	_, err = s.client.Chat.Completions.New(ctx, chatParams("x", 2))
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadGateway || apiErr.Type != "api_error" {
		t.Fatalf("prefill 5xx: %v", err)
	}
	if len(s.stack.Decode[0].Requests()) != 0 {
		t.Fatal("decode ran after a failed prefill")
	}

	// The decode worker's own error answer reaches the client as the worker sent it. After a
	// prefill, a decode 4xx is first taken for a failed KV transfer and retried without it, so
	// the worker refuses twice here.
	s.stack.Decode[0].FailNext(2, http.StatusBadRequest, `{"error":{"message":"decode refuses","type":"BadRequestError","param":null,"code":400}}`)
	resp, b := s.post("/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"x"}]}`, nil)
	if resp.StatusCode != http.StatusBadRequest || string(b) != `{"error":{"message":"decode refuses","type":"BadRequestError","param":null,"code":400}}` {
		t.Fatalf("decode error not passed through: %d %s", resp.StatusCode, b)
	}
	// A 503 says nothing was served: the leg is sent again and the client never sees it.
	before := len(s.stack.Decode[0].Requests())
	s.stack.Decode[0].FailNext(1, http.StatusServiceUnavailable, `{"error":{"message":"decode overloaded","type":"ServiceUnavailableError","param":null,"code":503}}`)
	if _, err := s.client.Chat.Completions.New(ctx, chatParams("x", 2)); err != nil {
		t.Fatalf("a 503 was not retried: %v", err)
	}
	if n := len(s.stack.Decode[0].Requests()) - before; n != 2 {
		t.Fatalf("decode got %d legs, want the refused one and its retry", n)
	}

	// Unregistered /v1 paths pass through with the decode profile.
	models, err := s.client.Models.List(ctx)
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != "sim-model" {
		t.Fatalf("models %v %+v", err, models)
	}
	if last := s.stack.Decode[0].Requests(); last[len(last)-1].Path != "/v1/models" || last[len(last)-1].Header.Get("EPP-Profile") != "decode" {
		t.Fatalf("passthrough leg %+v", last[len(last)-1])
	}
}

func TestClientDisconnectCancelsUpstream(t *testing.T) {
	s := start(t, stack.Options{ITL: 50 * time.Millisecond}, "kv-nixl", "ec-nixl", true, steps("prefill", "decode"))
	ctx, cancel := context.WithCancel(context.Background())
	stream := s.client.Chat.Completions.NewStreaming(ctx, chatParams("slow stream", 200))
	if !stream.Next() {
		t.Fatalf("no first chunk: %v", stream.Err())
	}
	cancel()
	for stream.Next() {
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		legs := s.stack.Gateway.Legs()
		last := legs[len(legs)-1]
		if last.Profile == "decode" && last.Status != 0 {
			if !last.Aborted || last.Duration > 5*time.Second {
				t.Fatalf("decode leg was not cut short: %+v", last)
			}
			break // the decode leg ended long before its 200 tokens * 50ms
		}
		if time.Now().After(deadline) {
			t.Fatalf("decode leg still running after the client left: %+v", last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestGracefulShutdownDrainsStreams(t *testing.T) {
	s := start(t, stack.Options{ITL: 20 * time.Millisecond}, "kv-nixl", "ec-nixl", true, steps("decode"))
	type result struct {
		text string
		err  error
	}
	started, done := make(chan struct{}), make(chan result, 1)
	go func() {
		text, _, err := readStream(s.client, chatParams("drain me", 30), func() { close(started) })
		done <- result{text, err}
	}()
	select {
	case <-started: // the stream is under way
	case r := <-done:
		t.Fatalf("the stream ended before its first chunk: %q, %v", r.text, r.err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.coord.Server.Shutdown(ctx); err != nil {
		t.Fatalf("drain: %v", err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("stream during drain: %v", r.err)
	}
	if len(strings.Fields(r.text)) != 30 {
		t.Fatalf("stream cut during drain: %d words", len(strings.Fields(r.text)))
	}
}

func TestAutoConnectorPoolFollowsEveryCoordinatorConnector(t *testing.T) {
	st, err := stack.Start(stack.Options{KVConnector: "kv-auto"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, kv := range []string{"kv-nixl", "kv-sglang", "kv-shared-storage"} {
		pipe := "[{type: prefill}, {type: decode}]"
		if kv == "kv-sglang" {
			pipe = "[{type: prefill-decode}]"
		}
		cfg, err := config.Parse([]byte(fmt.Sprintf("gateway: {address: %s, allowed_hint_networks: [%s]}\npipeline: {kv_connector: %s, steps: %s}",
			st.Gateway.URL(), stack.HintNetworks, kv, pipe)), nil)
		if err != nil {
			t.Fatal(err)
		}
		// The prefill worker serves SGLang's bootstrap on its own listener too.
		u, _ := url.Parse(st.Prefill[0].URL())
		getenv := func(string) string { return u.Port() }
		coord, err := stack.StartCoordinatorWith(cfg, stack.CoordinatorOptions{Log: testLogger(t), Getenv: getenv})
		if err != nil {
			t.Fatal(err)
		}
		client := clientFor(coord.URL())
		resp, err := client.Chat.Completions.New(context.Background(), chatParams("auto pool", 2))
		coord.Close()
		if err != nil || resp.Choices[0].Message.Content != "auto pool" {
			t.Fatalf("%s: %v", kv, err)
		}
	}
}

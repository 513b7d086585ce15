package integration

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/test/doubles/mediaserver"
	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/harness/stack"
)

// anthropicFor is the official Anthropic SDK pointed at a coordinator.
func anthropicFor(url string) anthropic.Client {
	return anthropic.NewClient(aoption.WithBaseURL(url+"/"), aoption.WithAPIKey("sk-ant-test"), aoption.WithMaxRetries(0),
		aoption.WithRequestTimeout(20*time.Second))
}

// textMessage is a Messages request: a system prompt and one user text.
func textMessage(text string, maxTokens int64) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     "sim-model",
		MaxTokens: maxTokens,
		System:    []anthropic.TextBlockParam{{Text: "be brief"}},
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(text))},
	}
}

// streamed is what a client read of a Messages stream.
type streamed struct {
	msg    anthropic.Message
	events []string
	err    error
}

// streamMessage reads a Messages stream to its end, accumulating the message.
func streamMessage(ctx context.Context, c anthropic.Client, p anthropic.MessageNewParams) streamed {
	var out streamed
	st := c.Messages.NewStreaming(ctx, p)
	defer st.Close()
	for st.Next() {
		ev := st.Current()
		out.events = append(out.events, ev.Type)
		if err := out.msg.Accumulate(ev); err != nil {
			out.err = err
			return out
		}
	}
	out.err = st.Err()
	return out
}

// text is the concatenated text of a message's text blocks.
func text(m anthropic.Message) string {
	var b strings.Builder
	for _, c := range m.Content {
		if c.Type == "text" {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// promptTokens is what the workers count for chat messages (JSON).
func promptTokens(t *testing.T, messages string) int64 {
	t.Helper()
	r, err := simworker.RenderChat(json.RawMessage(messages))
	if err != nil {
		t.Fatal(err)
	}
	return int64(len(r.TokenIDs))
}

// chatMessages is the messages member of a worker's request body, as JSON.
func chatMessages(t *testing.T, body map[string]any) string {
	t.Helper()
	b, err := json.Marshal(body["messages"])
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestMessagesText: a Messages request through decode alone and through prefill and decode,
// answered whole and streamed, gets the chat answer as a message: the same text, stop reason and
// usage both ways, on the legs a chat request takes.
func TestMessagesText(t *testing.T) {
	// The SDK sends the system prompt as text blocks.
	const wantChat = `[{"content":[{"text":"be brief","type":"text"}],"role":"system"},{"content":[{"text":"hello there","type":"text"}],"role":"user"}]`
	wantInput := promptTokens(t, wantChat)
	for name, tc := range map[string]struct {
		steps, legs string
	}{
		"decode only":        {steps("decode"), "decode:200"},
		"prefill and decode": {steps("prefill", "decode"), "prefill:200,decode:200"},
	} {
		t.Run(name, func(t *testing.T) {
			s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, tc.steps)
			c := anthropicFor(s.coord.URL())
			var httpResp *http.Response
			msg, err := c.Messages.New(context.Background(), textMessage("hello there", 5), aoption.WithResponseInto(&httpResp))
			if err != nil {
				t.Fatal(err)
			}
			if got := text(*msg); got != "hello there hello there hello" || msg.StopReason != anthropic.StopReasonMaxTokens || msg.Role != "assistant" ||
				msg.Model != "sim-model" || !strings.HasPrefix(msg.ID, "msg_") || len(msg.Content) != 1 {
				t.Fatalf("message %s", msg.RawJSON())
			}
			// After a prefill the decode worker loaded the prompt's KV: the usage counts those
			// tokens as cache reads, as Anthropic's does, and input_tokens the rest.
			if msg.Usage.InputTokens+msg.Usage.CacheReadInputTokens != wantInput || msg.Usage.OutputTokens != 5 {
				t.Fatalf("usage %s, want %d input tokens", msg.Usage.RawJSON(), wantInput)
			}
			if got := s.legProfiles(httpResp); got != tc.legs {
				t.Fatalf("legs %s, want %s", got, tc.legs)
			}
			bodies := received(t, s.stack.Decode[0])
			if got := chatMessages(t, bodies[0]); got != wantChat || bodies[0]["max_tokens"] != 5.0 {
				t.Fatalf("the decode worker got %s", mustJSON(t, bodies[0]))
			}

			st := streamMessage(context.Background(), c, textMessage("hello there", 5))
			if st.err != nil {
				t.Fatal(st.err)
			}
			want := "message_start,content_block_start," + strings.Repeat("content_block_delta,", 5) + "content_block_stop,message_delta,message_stop"
			if got := strings.Join(st.events, ","); got != want {
				t.Fatalf("events %s, want %s", got, want)
			}
			// The decode worker has the prompt cached now: usage says so, as Anthropic's would.
			if text(st.msg) != text(*msg) || st.msg.StopReason != anthropic.StopReasonMaxTokens || st.msg.Usage.OutputTokens != 5 ||
				st.msg.Usage.InputTokens+st.msg.Usage.CacheReadInputTokens != wantInput || st.msg.ID == msg.ID {
				t.Fatalf("streamed %s", st.msg.RawJSON())
			}
		})
	}
}

// TestMessagesMultimodal: a base64 image and an image URL go through the whole multimodal
// pipeline: the URL downloaded by the media guard, both encoded, prefilled and decoded.
func TestMessagesMultimodal(t *testing.T) {
	media := startMedia(t)
	s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, fullPipeline)
	c := anthropicFor(s.coord.URL())
	pngA, pngB := mediaserver.PNG("a"), mediaserver.PNG("b")
	p := anthropic.MessageNewParams{Model: "sim-model", MaxTokens: 4, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(
		anthropic.NewTextBlock("describe these"),
		anthropic.NewImageBlockBase64("image/png", base64.StdEncoding.EncodeToString(pngA)),
		anthropic.NewImageBlock(anthropic.URLImageSourceParam{URL: media.URL() + "/img/b.png"}))}}
	var httpResp *http.Response
	msg, err := c.Messages.New(context.Background(), p, aoption.WithResponseInto(&httpResp))
	if err != nil {
		t.Fatal(err)
	}
	if text(*msg) != "describe these describe these" {
		t.Fatalf("message %s", msg.RawJSON())
	}
	if got := s.legProfiles(httpResp); got != "decode:412,encode:200,encode:200,prefill:200,decode:200" {
		t.Fatalf("legs %s", got)
	}
	if n := len(media.Requests()); n != 1 {
		t.Fatalf("%d downloads, want 1", n)
	}
	render := received(t, s.stack.Render)
	if len(render) != 1 {
		t.Fatalf("%d render calls", len(render))
	}
	r, err := simworker.RenderChat(json.RawMessage(chatMessages(t, render[0])))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Images) != 2 || r.Images[0].Hash != simworker.ImageHash(pngA) || r.Images[1].Hash != simworker.ImageHash(pngB) {
		t.Fatalf("render saw images %+v", r.Images)
	}
	if got := msg.Usage.InputTokens + msg.Usage.CacheReadInputTokens; got != int64(len(r.TokenIDs)) {
		t.Fatalf("input tokens %d (with cache reads), render gave %d", got, len(r.TokenIDs))
	}

	st := streamMessage(context.Background(), c, p)
	if st.err != nil || text(st.msg) != text(*msg) || st.msg.Usage.OutputTokens != 4 {
		t.Fatalf("%v: streamed %s", st.err, st.msg.RawJSON())
	}
}

// weatherTool is a client tool with a string and an integer parameter.
var weatherTool = anthropic.ToolUnionParam{OfTool: &anthropic.ToolParam{
	Name: "get_weather", Description: anthropic.String("The weather in a city."),
	InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"city": map[string]any{"type": "string"}, "days": map[string]any{"type": "integer"}},
		Required: []string{"city"}},
}}

// TestMessagesToolUse: a forced tool call comes back as a tool_use block (whole and streamed as
// input_json_delta), and its result goes back to the worker as a tool message.
func TestMessagesToolUse(t *testing.T) {
	for name, pipe := range map[string]string{"decode only": steps("decode"), "prefill and decode": steps("prefill", "decode")} {
		t.Run(name, func(t *testing.T) {
			s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, pipe)
			c := anthropicFor(s.coord.URL())
			ask := anthropic.NewUserMessage(anthropic.NewTextBlock("paris weather please"))
			p := anthropic.MessageNewParams{Model: "sim-model", MaxTokens: 16, Messages: []anthropic.MessageParam{ask},
				Tools: []anthropic.ToolUnionParam{weatherTool}, ToolChoice: anthropic.ToolChoiceUnionParam{OfTool: &anthropic.ToolChoiceToolParam{Name: "get_weather"}}}
			msg, err := c.Messages.New(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			if msg.StopReason != anthropic.StopReasonToolUse || len(msg.Content) != 1 || msg.Content[0].Type != "tool_use" {
				t.Fatalf("message %s", msg.RawJSON())
			}
			call := msg.Content[0]
			if call.Name != "get_weather" || string(call.Input) != `{"city":"paris","days":2}` || !strings.HasPrefix(call.ID, "call_") || msg.Usage.OutputTokens != 3 {
				t.Fatalf("tool use %s, usage %s", call.RawJSON(), msg.Usage.RawJSON())
			}
			// The worker got a function tool and a named tool choice.
			got := received(t, s.stack.Decode[0])[0]
			if tools := mustJSON(t, got["tools"]); tools != `[{"function":{"description":"The weather in a city.","name":"get_weather","parameters":{"properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"],"type":"object"}},"type":"function"}]` ||
				mustJSON(t, got["tool_choice"]) != `{"function":{"name":"get_weather"},"type":"function"}` {
				t.Fatalf("the decode worker got tools %s, tool_choice %s", tools, mustJSON(t, got["tool_choice"]))
			}

			st := streamMessage(context.Background(), c, p)
			if st.err != nil {
				t.Fatal(st.err)
			}
			if want := "message_start,content_block_start,content_block_delta,content_block_delta,content_block_delta,content_block_stop,message_delta,message_stop"; strings.Join(st.events, ",") != want {
				t.Fatalf("events %s, want %s", strings.Join(st.events, ","), want)
			}
			if len(st.msg.Content) != 1 || string(st.msg.Content[0].Input) != `{"city":"paris","days":2}` || st.msg.Content[0].Name != "get_weather" || st.msg.StopReason != anthropic.StopReasonToolUse {
				t.Fatalf("streamed %s", st.msg.RawJSON())
			}

			// The round trip: the assistant's tool use and the tool's result.
			s.stack.Reset()
			p.Messages = append(p.Messages, msg.ToParam(), anthropic.NewUserMessage(anthropic.NewToolResultBlock(call.ID, "sunny, 21C", false)))
			p.ToolChoice = anthropic.ToolChoiceUnionParam{OfAuto: &anthropic.ToolChoiceAutoParam{}}
			p.MaxTokens = 3
			answer, err := c.Messages.New(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			if text(*answer) != "paris weather please" || answer.StopReason != anthropic.StopReasonMaxTokens {
				t.Fatalf("answer %s", answer.RawJSON())
			}
			want := fmt.Sprintf(`[{"content":[{"text":"paris weather please","type":"text"}],"role":"user"},`+
				`{"content":null,"role":"assistant","tool_calls":[{"function":{"arguments":"{\"city\":\"paris\",\"days\":2}","name":"get_weather"},"id":%q,"type":"function"}]},`+
				`{"content":[{"text":"sunny, 21C","type":"text"}],"role":"tool","tool_call_id":%q}]`, call.ID, call.ID)
			if got := chatMessages(t, received(t, s.stack.Decode[0])[0]); got != want {
				t.Fatalf("the decode worker got messages\n%s\nwant\n%s", got, want)
			}
			if got := answer.Usage.InputTokens + answer.Usage.CacheReadInputTokens; got != promptTokens(t, want) {
				t.Fatalf("input tokens %d (with cache reads), want %d", got, promptTokens(t, want))
			}
		})
	}
}

// TestMessagesCountTokens: with render, count_tokens is render's count, the prompt a message of
// the same request is charged for, and runs no inference leg; without render it is passed
// through to a decode worker.
func TestMessagesCountTokens(t *testing.T) {
	s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, steps("render", "encode", "prefill", "decode"))
	c := anthropicFor(s.coord.URL())
	png := mediaserver.PNG("count")
	user := anthropic.NewUserMessage(anthropic.NewTextBlock("count these tokens"), anthropic.NewImageBlockBase64("image/png", base64.StdEncoding.EncodeToString(png)))
	count, err := c.Messages.CountTokens(context.Background(), anthropic.MessageCountTokensParams{Model: "sim-model",
		System: anthropic.MessageCountTokensParamsSystemUnion{OfString: anthropic.String("be brief")}, Messages: []anthropic.MessageParam{user}})
	if err != nil {
		t.Fatal(err)
	}
	render := received(t, s.stack.Render)
	if len(render) != 1 {
		t.Fatalf("%d render calls", len(render))
	}
	r, err := simworker.RenderChat(json.RawMessage(chatMessages(t, render[0])))
	if err != nil {
		t.Fatal(err)
	}
	if count.InputTokens != int64(len(r.TokenIDs)) || len(r.Images) != 1 || r.Images[0].Hash != simworker.ImageHash(png) {
		t.Fatalf("count %d, render gave %d tokens and images %+v", count.InputTokens, len(r.TokenIDs), r.Images)
	}
	if n := len(s.stack.Decode[0].Requests()) + len(s.stack.Prefill[0].Requests()) + len(s.stack.Encode[0].Requests()); n != 0 {
		t.Fatalf("%d inference legs for a count", n)
	}
	msg, err := c.Messages.New(context.Background(), anthropic.MessageNewParams{Model: "sim-model", MaxTokens: 2,
		System: []anthropic.TextBlockParam{{Text: "be brief"}}, Messages: []anthropic.MessageParam{user}})
	if err != nil {
		t.Fatal(err)
	}
	if got := msg.Usage.InputTokens + msg.Usage.CacheReadInputTokens; got != count.InputTokens {
		t.Fatalf("the message was charged %d input tokens (with cache reads), count_tokens said %d", got, count.InputTokens)
	}

	// Images by URL are counted only when sent.
	_, err = c.Messages.CountTokens(context.Background(), anthropic.MessageCountTokensParams{Model: "sim-model", Messages: []anthropic.MessageParam{
		anthropic.NewUserMessage(anthropic.NewImageBlock(anthropic.URLImageSourceParam{URL: "https://example.com/a.png"}))}})
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Type() != "invalid_request_error" ||
		!strings.HasPrefix(apiErr.Message, "messages[0].content[0].source.url: count_tokens takes images as base64") {
		t.Fatalf("got %v, want a 400 naming the image", err)
	}

	bare := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, steps("decode"))
	bc := anthropicFor(bare.coord.URL())
	_, err = bc.Messages.CountTokens(context.Background(), anthropic.MessageCountTokensParams{Model: "sim-model",
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("x"))}})
	reqs := bare.stack.Decode[0].Requests()
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || len(reqs) != 1 || reqs[0].Path != "/v1/messages/count_tokens" {
		t.Fatalf("got %v and %d decode requests, want the simworker's 404 for the passed-through count", err, len(reqs))
	}
}

// TestMessagesDecodeFaults: decode workers failing under a Messages request, as an Anthropic
// client sees it.
func TestMessagesDecodeFaults(t *testing.T) {
	t.Run("dying once mid-stream: resumed on the other worker, the message whole", func(t *testing.T) {
		s := start(t, stack.Options{Decoders: 2}, "kv-nixl", "ec-nixl", true, steps("prefill", "decode"))
		for _, w := range s.stack.Decode {
			if err := w.InjectFault(simworker.Fault{Kind: simworker.FaultDieMidStream, AfterTokens: 2, Count: 1}); err != nil {
				t.Fatal(err)
			}
		}
		st := streamMessage(context.Background(), anthropicFor(s.coord.URL()), textMessage("one two three", 6))
		if st.err != nil || text(st.msg) != "one two three one two three" || st.msg.Usage.OutputTokens != 6 || st.msg.StopReason != anthropic.StopReasonMaxTokens {
			t.Fatalf("%v: %s", st.err, st.msg.RawJSON())
		}
	})
	t.Run("dying at every try: the text so far, then an Anthropic error event ends the stream", func(t *testing.T) {
		s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, steps("decode"))
		if err := s.stack.Decode[0].InjectFault(simworker.Fault{Kind: simworker.FaultDieMidStream, AfterTokens: 2, Count: 100}); err != nil {
			t.Fatal(err)
		}
		st := streamMessage(context.Background(), anthropicFor(s.coord.URL()), textMessage("one two three", 9))
		var apiErr *anthropic.Error
		if !errors.As(st.err, &apiErr) || apiErr.Type() != "api_error" || !strings.Contains(apiErr.Message, "the answer broke off and could not be resumed") {
			t.Fatalf("stream error %v, want an api_error event", st.err)
		}
		got, whole := text(st.msg), "one two three one two three one two three"
		if got == "" || len(got) >= len(whole) || whole[:len(got)] != got || st.events[len(st.events)-1] != "content_block_delta" {
			t.Fatalf("text %q, events %v", got, st.events)
		}
	})
	t.Run("refusing: the pool's 503 as overloaded_error", func(t *testing.T) {
		s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, steps("decode"))
		s.stack.Decode[0].FailNext(100, http.StatusServiceUnavailable, "")
		c := anthropicFor(s.coord.URL())
		_, err := c.Messages.New(context.Background(), textMessage("x y", 3))
		st := streamMessage(context.Background(), c, textMessage("x y", 3))
		for _, err := range []error{err, st.err} {
			var apiErr *anthropic.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable || apiErr.Type() != "overloaded_error" ||
				apiErr.Message != "decode: no endpoint served the request (HTTP 503: the pool has no endpoint, or the one picked could not be reached)" || apiErr.Response.Header.Get("Retry-After") == "" {
				t.Fatalf("got %v, want a 503 overloaded_error", err)
			}
		}
	})
	t.Run("refusing a request: the worker's 400 as invalid_request_error", func(t *testing.T) {
		s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, steps("decode"))
		s.stack.Decode[0].FailNext(1, http.StatusBadRequest, `{"error":{"message":"This model's maximum context length is 4 tokens","type":"BadRequestError","param":null,"code":400}}`)
		c := anthropicFor(s.coord.URL())
		_, err := c.Messages.New(context.Background(), textMessage("x y", 3))
		var apiErr *anthropic.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Type() != "invalid_request_error" ||
			apiErr.Message != "This model's maximum context length is 4 tokens" {
			t.Fatalf("got %v, want the worker's 400", err)
		}
	})
	t.Run("hanging after its headers: a 502 api_error after gateway.idle_timeout", func(t *testing.T) {
		s := startWith(t, stack.Options{}, "kv-nixl", "ec-nixl", true, steps("decode"), func(c *config.Config) {
			c.Gateway.IdleTimeout = config.Duration(300 * time.Millisecond)
		})
		if err := s.stack.Decode[0].InjectFault(simworker.Fault{Kind: simworker.FaultHangAfterHeaders, Count: 100}); err != nil {
			t.Fatal(err)
		}
		c := anthropicFor(s.coord.URL())
		began := time.Now()
		st := streamMessage(context.Background(), c, textMessage("x y", 3))
		_, err := c.Messages.New(context.Background(), textMessage("x y", 3))
		for _, err := range []error{st.err, err} {
			var apiErr *anthropic.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadGateway || apiErr.Type() != "api_error" || !strings.Contains(apiErr.Message, "decode") {
				t.Fatalf("got %v, want a 502 api_error", err)
			}
		}
		if d := time.Since(began); d < 600*time.Millisecond {
			t.Fatalf("answered after %s: the idle timeout did not run", d)
		}
	})
}

// TestMessagesMetrics: a Messages request is counted under route messages, its tokens from the
// usage it was charged.
func TestMessagesMetrics(t *testing.T) {
	s, reg := startTokenMetrics(t, 1)
	c := anthropicFor(s.coord.URL())
	msg, err := c.Messages.New(context.Background(), textMessage("count me", 3))
	if err != nil {
		t.Fatal(err)
	}
	st := streamMessage(context.Background(), c, textMessage("count me too", 4))
	if st.err != nil {
		t.Fatal(st.err)
	}
	labels := func(extra ...string) map[string]string {
		m := map[string]string{"route": "messages"}
		for i := 0; i+1 < len(extra); i += 2 {
			m[extra[i]] = extra[i+1]
		}
		return m
	}
	requests := func() float64 { return counter(t, reg, "coordinator_requests_total", labels("status", "200")) }
	if got := awaitValue(requests, 2); got != 2 {
		t.Fatalf("%v messages requests counted, want 2", got)
	}
	if got := counter(t, reg, "coordinator_tokens_total", labels("kind", observe.TokensCompletion)); got != 3+4 {
		t.Fatalf("%v completion tokens, want 7", got)
	}
	prompt := counter(t, reg, "coordinator_tokens_total", labels("kind", observe.TokensPrompt))
	if want := msg.Usage.InputTokens + msg.Usage.CacheReadInputTokens + st.msg.Usage.InputTokens + st.msg.Usage.CacheReadInputTokens; prompt != float64(want) {
		t.Fatalf("%v prompt tokens, the answers say %d", prompt, want)
	}
}

// TestMessagesContentBlocks: a Messages request's content blocks (system and message blocks
// together) are bounded by server.max_content_blocks: at the limit it is served, one over it an
// Anthropic client gets a 400 invalid_request_error naming the block and the key, and no worker
// is called.
func TestMessagesContentBlocks(t *testing.T) {
	s := startWith(t, stack.Options{}, "kv-nixl", "ec-nixl", true, steps("decode"), func(c *config.Config) { c.Server.MaxContentBlocks = 8 })
	c := anthropicFor(s.coord.URL())
	blocks := func(n int) []anthropic.ContentBlockParamUnion {
		out := make([]anthropic.ContentBlockParamUnion, n)
		for i := range out {
			out[i] = anthropic.NewTextBlock(fmt.Sprint("part ", i))
		}
		return out
	}
	params := func(n int) anthropic.MessageNewParams {
		return anthropic.MessageNewParams{Model: "sim-model", MaxTokens: 2,
			System:   []anthropic.TextBlockParam{{Text: "be brief"}, {Text: "be kind"}},
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(blocks(n)...)}}
	}
	if _, err := c.Messages.New(context.Background(), params(6)); err != nil {
		t.Fatalf("8 blocks, the limit: %v", err)
	}
	served := len(s.stack.Decode[0].Requests())
	_, err := c.Messages.New(context.Background(), params(7))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Type() != "invalid_request_error" ||
		apiErr.Message != "messages[0].content[6]: more than 8 content blocks in the request (server.max_content_blocks)" {
		t.Fatalf("9 blocks: %v, want a 400 naming the ninth block and server.max_content_blocks", err)
	}
	if n := len(s.stack.Decode[0].Requests()); n != served {
		t.Fatalf("%d decode requests for a refused request", n-served)
	}
}

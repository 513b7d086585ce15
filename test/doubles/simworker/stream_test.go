package simworker

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// sdkClient returns an official OpenAI client pointed at w.
func sdkClient(w *Worker) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(w.URL()+"/v1/"),
		option.WithAPIKey("test"),
		option.WithMaxRetries(0),
		option.WithHTTPClient(testClient),
	)
}

func TestSDKChat(t *testing.T) {
	w := startWorker(t, Config{ITL: time.Millisecond, ModelName: "my-model"})
	client := sdkClient(w)
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Model: "my-model",
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage("be terse"),
			openai.UserMessage([]openai.ChatCompletionContentPartUnionParam{
				openai.TextContentPart("describe this picture please"),
				openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: dataURL([]byte("pixels"))}),
			}),
		},
		MaxTokens: openai.Int(6),
	}
	full, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	const want = "describe this picture please describe this"
	if full.Choices[0].Message.Content != want || full.Choices[0].FinishReason != "length" || full.Model != "my-model" ||
		full.Usage.CompletionTokens != 6 || full.Usage.PromptTokens != int64(1+1+2+1+4+ImageTokenCount([]byte("pixels"))) {
		t.Fatalf("completion = %+v", full)
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	defer stream.Close()
	var acc openai.ChatCompletionAccumulator
	chunks, roleChunks := 0, 0
	for stream.Next() {
		chunk := stream.Current()
		acc.AddChunk(chunk)
		chunks++
		if len(chunk.Choices) > 0 && chunk.Choices[0].Delta.Role == "assistant" {
			roleChunks++
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks != 1+6+1 || roleChunks != 1 {
		t.Errorf("got %d chunks (%d with role), want role + 6 tokens + usage", chunks, roleChunks)
	}
	if got := acc.Choices[0].Message.Content; got != want {
		t.Errorf("streamed content %q, want %q", got, want)
	}
	if acc.Choices[0].FinishReason != "length" || acc.Usage.TotalTokens != full.Usage.TotalTokens {
		t.Errorf("accumulated %+v", acc.ChatCompletion)
	}
}

func TestSDKCompletions(t *testing.T) {
	w := startWorker(t, Config{})
	client := sdkClient(w)
	ctx := context.Background()
	params := openai.CompletionNewParams{
		Model:     DefaultModelName,
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon a time")},
		MaxTokens: openai.Int(5),
	}
	full, err := client.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if full.Choices[0].Text != "once upon a time once" || full.Choices[0].FinishReason != "length" || full.Usage.PromptTokens != 5 {
		t.Fatalf("completion = %+v", full)
	}
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Completions.NewStreaming(ctx, params)
	defer stream.Close()
	var text strings.Builder
	var usage int64
	finish := ""
	for stream.Next() {
		c := stream.Current()
		if c.Object != "text_completion" {
			t.Errorf("object %q", c.Object)
		}
		for _, ch := range c.Choices {
			text.WriteString(ch.Text)
			if ch.FinishReason != "" {
				finish = string(ch.FinishReason)
			}
		}
		usage += c.Usage.TotalTokens
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != full.Choices[0].Text || finish != "length" || usage != 10 {
		t.Errorf("streamed %q finish %q usage %d", text.String(), finish, usage)
	}
}

// sseEvents reads a whole SSE body and returns the data of each event.
func sseEvents(t *testing.T, body io.Reader) []string {
	t.Helper()
	raw, err := io.ReadAll(body)
	if err != nil {
		t.Fatal(err)
	}
	s := string(raw)
	if !strings.HasSuffix(s, "data: [DONE]\n\n") {
		t.Fatalf("stream does not end with [DONE]: %q", s)
	}
	var events []string
	for _, ev := range strings.Split(strings.TrimSuffix(s, "\n\n"), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("malformed event %q", ev)
		}
		events = append(events, data)
	}
	return events
}

func TestGenerateStream(t *testing.T) {
	w := startWorker(t, Config{})
	body := generate([]int{1, 7, 8}, obj{"max_tokens": 3}, obj{"stream": true, "request_id": "g1", "stream_options": obj{"include_usage": true}})
	resp, err := testClient.Post(w.URL()+PathGenerate, "application/json", strings.NewReader(string(mustJSON(t, body))))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q", ct)
	}
	events := sseEvents(t, resp.Body)
	if len(events) != 3+1+1 {
		t.Fatalf("events %q", events)
	}
	var ids []int
	for i, ev := range events[:3] {
		g := decode[GenerateResponse](t, []byte(ev))
		ids = append(ids, g.Choices[0].TokenIDs...)
		if last := g.Choices[0].FinishReason != nil; last != (i == 2) || g.RequestID != "g1" {
			t.Errorf("event %d = %s", i, ev)
		}
	}
	if len(ids) != 3 || ids[0] != 7 || ids[1] != 8 || ids[2] != 7 {
		t.Errorf("token ids %v", ids)
	}
	if u := decode[GenerateResponse](t, []byte(events[3])).Usage; u == nil || *u != (Usage{PromptTokens: 3, CompletionTokens: 3, TotalTokens: 6}) {
		t.Errorf("usage event %s", events[3])
	}
}

func TestChatStreamFraming(t *testing.T) {
	w := startWorker(t, Config{})
	resp, err := testClient.Post(w.URL()+PathChatCompletions, "application/json",
		strings.NewReader(string(mustJSON(t, userChat("x y", obj{"stream": true, "max_tokens": 2})))))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := sseEvents(t, resp.Body)
	want := []string{`"delta":{"role":"assistant","content":""}`, `"delta":{"content":"x"}`, `"delta":{"content":" y"},"logprobs":null,"finish_reason":"length"`}
	if len(events) != len(want)+1 {
		t.Fatalf("events %q", events)
	}
	for i, w := range want {
		if !strings.Contains(events[i], w) || !strings.Contains(events[i], `"object":"chat.completion.chunk"`) {
			t.Errorf("event %d = %s, want it to contain %s", i, events[i], w)
		}
	}
}

func TestStreamTiming(t *testing.T) {
	const ttft, itl = 300 * time.Millisecond, 50 * time.Millisecond
	w := startWorker(t, Config{TTFT: ttft, ITL: itl})
	start := time.Now()
	resp, err := testClient.Post(w.URL()+PathCompletions, "application/json",
		strings.NewReader(string(mustJSON(t, completion("a b", obj{"stream": true, "max_tokens": 3})))))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if d := time.Since(start); d >= ttft {
		t.Errorf("headers after %v, want them before TTFT", d)
	}
	br := bufio.NewReader(resp.Body)
	var arrivals []time.Duration
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			break
		}
		if strings.HasPrefix(line, "data: {") {
			arrivals = append(arrivals, time.Since(start))
		}
	}
	if len(arrivals) != 3 {
		t.Fatalf("%d token events", len(arrivals))
	}
	if arrivals[0] < ttft || arrivals[2] < ttft+2*itl {
		t.Errorf("arrivals %v, want first >= %v and last >= %v", arrivals, ttft, ttft+2*itl)
	}
}

func TestStreamStopsOnClientDisconnect(t *testing.T) {
	w := startWorker(t, Config{ITL: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL()+PathChatCompletions,
		strings.NewReader(string(mustJSON(t, userChat("a", obj{"stream": true, "max_tokens": 1000})))))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for w.Requests()[0].Status == 0 {
		if time.Now().After(deadline) {
			t.Fatal("handler still running after the client went away")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestCloseEndsStreams(t *testing.T) {
	w, err := Start(Config{TTFT: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := testClient.Post(w.URL()+PathCompletions, "application/json",
		strings.NewReader(string(mustJSON(t, completion("a", obj{"stream": true})))))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	done := make(chan error, 1)
	go func() { done <- w.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close blocked on an in-flight stream")
	}
	_, _ = io.Copy(io.Discard, resp.Body)
}

func TestJSONErrorsParseWithSDK(t *testing.T) {
	w := startWorker(t, Config{Role: RolePrefill})
	client := sdkClient(w)
	_, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:    DefaultModelName,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	var apiErr *openai.Error
	if !errorsAs(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(apiErr.Message, "accepts only prefill legs") {
		t.Fatalf("err = %v", err)
	}
}

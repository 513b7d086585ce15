package simworker

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestEchoGeneration(t *testing.T) {
	w := startWorker(t, Config{DefaultMaxTokens: 4})
	t.Run("chat cycles last user message", func(t *testing.T) {
		body := obj{"model": DefaultModelName, "max_tokens": 5, "messages": []obj{
			{"role": "system", "content": "be brief"},
			{"role": "user", "content": "first question"},
			{"role": "assistant", "content": "answer"},
			{"role": "user", "content": []obj{{"type": "text", "text": "red"}, {"type": "text", "text": "green blue"}}},
		}}
		r := post(t, w, PathChatCompletions, body)
		mustStatus(t, r, 200)
		c := decode[ChatCompletion](t, r.body)
		wantPrompt := len(TokenizeText("be brief first question answer red green blue")) + 5
		if c.Object != "chat.completion" || c.Model != DefaultModelName || !strings.HasPrefix(c.ID, "chatcmpl-") ||
			c.Choices[0].Message.Content != "red green blue red green" || c.Choices[0].Message.Role != "assistant" ||
			c.Choices[0].FinishReason != "length" || c.Usage != (Usage{PromptTokens: wantPrompt, CompletionTokens: 5, TotalTokens: wantPrompt + 5}) {
			t.Errorf("chat completion = %+v", c)
		}
	})
	t.Run("max_completion_tokens wins", func(t *testing.T) {
		r := post(t, w, PathChatCompletions, userChat("a", obj{"max_tokens": 9, "max_completion_tokens": 2}))
		if got := decode[ChatCompletion](t, r.body).Choices[0].Message.Content; got != "a a" {
			t.Errorf("content = %q", got)
		}
	})
	t.Run("default max tokens and image-only fallback", func(t *testing.T) {
		body := obj{"messages": []obj{{"role": "user", "content": []obj{{"type": "image_url", "image_url": obj{"url": "http://x/y.png"}}}}}}
		r := post(t, w, PathChatCompletions, body)
		c := decode[ChatCompletion](t, r.body)
		if c.Choices[0].Message.Content != "sim sim sim sim" || c.Model != "sim-model" {
			t.Errorf("completion = %+v", c)
		}
	})
	t.Run("completions text", func(t *testing.T) {
		r := post(t, w, PathCompletions, completion("to be or not", obj{"max_tokens": 6}))
		mustStatus(t, r, 200)
		c := decode[TextCompletion](t, r.body)
		if c.Object != "text_completion" || !strings.HasPrefix(c.ID, "cmpl-") || c.Choices[0].Text != "to be or not to be" ||
			*c.Choices[0].FinishReason != "length" || *c.Usage != (Usage{PromptTokens: 5, CompletionTokens: 6, TotalTokens: 11}) {
			t.Errorf("completion = %+v", c)
		}
	})
	t.Run("completions token prompt", func(t *testing.T) {
		r := post(t, w, PathCompletions, completion([]int{1, 500, 600}, obj{"max_tokens": 3}))
		if got := decode[TextCompletion](t, r.body).Choices[0].Text; got != "t500 t600 t500" {
			t.Errorf("text = %q", got)
		}
	})
	t.Run("generate", func(t *testing.T) {
		r := post(t, w, PathGenerate, generate([]int{1, 11, 12, 13}, obj{"max_tokens": 5}, obj{"request_id": "gen-1"}))
		mustStatus(t, r, 200)
		g := decode[GenerateResponse](t, r.body)
		if g.RequestID != "gen-1" || !slices.Equal(g.Choices[0].TokenIDs, []int{11, 12, 13, 11, 12}) ||
			*g.Choices[0].FinishReason != "length" || *g.Usage != (Usage{PromptTokens: 4, CompletionTokens: 5, TotalTokens: 9}) {
			t.Errorf("generate = %+v", g)
		}
		if strings.Contains(string(r.body), "kv_transfer_params") {
			t.Errorf("local generate answered kv_transfer_params: %s", r.body)
		}
	})
	t.Run("generate default max tokens", func(t *testing.T) {
		r := post(t, w, PathGenerate, generate([]int{1, 11}, obj{}, nil))
		if got := decode[GenerateResponse](t, r.body).Choices[0].TokenIDs; len(got) != 4 {
			t.Errorf("token_ids = %v", got)
		}
	})
}

func TestNonStreamLatency(t *testing.T) {
	w := startWorker(t, Config{TTFT: 40 * time.Millisecond, ITL: 10 * time.Millisecond})
	start := time.Now()
	mustStatus(t, post(t, w, PathCompletions, completion("a", obj{"max_tokens": 5})), 200)
	if d := time.Since(start); d < 80*time.Millisecond {
		t.Errorf("5 tokens took %v, want at least TTFT + 4*ITL = 80ms", d)
	}
}

// continuation returns a chat request continuing the final assistant message said.
func continuation(user, said string, n int, extra obj) obj {
	b := obj{"model": DefaultModelName, "max_tokens": n, "continue_final_message": true, "add_generation_prompt": false,
		"messages": []obj{{"role": "system", "content": "be brief"}, {"role": "user", "content": user}, {"role": "assistant", "content": said}}}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

// streamedText concatenates the content pieces of a streamed chat answer.
func streamedText(t *testing.T, w *Worker, body obj) string {
	t.Helper()
	resp, err := testClient.Post(w.URL()+PathChatCompletions, "application/json", strings.NewReader(string(mustJSON(t, body))))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var text strings.Builder
	for _, ev := range sseEvents(t, resp.Body) {
		if ev == "[DONE]" {
			continue
		}
		for _, c := range decode[ChatCompletionChunk](t, []byte(ev)).Choices {
			if c.Delta.Content != nil {
				text.WriteString(*c.Delta.Content)
			}
		}
	}
	return text.String()
}

func TestContinueFinalMessage(t *testing.T) {
	w := startWorker(t, Config{})
	const user, total = "red green blue", 7
	original := decode[ChatCompletion](t, post(t, w, PathChatCompletions, obj{"model": DefaultModelName, "max_tokens": total,
		"messages": []obj{{"role": "system", "content": "be brief"}, {"role": "user", "content": user}}}).body).Choices[0].Message.Content
	if original != "red green blue red green blue red" {
		t.Fatalf("original %q", original)
	}
	words := strings.Fields(original)
	for m := 0; m < total; m++ {
		t.Run("after "+itoa(m)+" words", func(t *testing.T) {
			said := strings.Join(words[:m], " ")
			r := post(t, w, PathChatCompletions, continuation(user, said, total-m, nil))
			mustStatus(t, r, 200)
			c := decode[ChatCompletion](t, r.body)
			if got := said + c.Choices[0].Message.Content; got != original {
				t.Errorf("%q + %q = %q, want %q", said, c.Choices[0].Message.Content, got, original)
			}
			// BOS, system role and words, user role and words, assistant role and words.
			wantPrompt := 1 + 1 + 2 + 1 + 3 + 1 + m
			if c.Usage != (Usage{PromptTokens: wantPrompt, CompletionTokens: total - m, TotalTokens: wantPrompt + total - m}) {
				t.Errorf("usage %+v, want %d prompt tokens", c.Usage, wantPrompt)
			}
			if got := said + streamedText(t, w, continuation(user, said, total-m, obj{"stream": true})); got != original {
				t.Errorf("streamed continuation gives %q, want %q", got, original)
			}
		})
	}
}

func TestContinueFinalMessageChecks(t *testing.T) {
	w := startWorker(t, Config{})
	const both = "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
	msgs := func(last string) []obj {
		return []obj{{"role": "user", "content": "a b"}, {"role": last, "content": "a"}}
	}
	tests := []struct {
		name    string
		body    obj
		status  int
		content string // or the error message
	}{
		{"both set", obj{"messages": msgs("assistant"), "continue_final_message": true, "add_generation_prompt": true}, 400, both},
		{"generation prompt by default", obj{"messages": msgs("assistant"), "continue_final_message": true}, 400, both},
		{"final message not the assistant's", obj{"messages": msgs("user"), "continue_final_message": true, "add_generation_prompt": false}, 400,
			`continue_final_message needs a final assistant message to continue, the last message has role "user"`},
		{"not a boolean", obj{"messages": msgs("assistant"), "continue_final_message": "yes"}, 400, "invalid JSON body: continue_final_message must be a boolean"},
		{"continuation", obj{"messages": msgs("assistant"), "continue_final_message": true, "add_generation_prompt": false}, 200, " b a b"},
		{"empty final message", obj{"messages": []obj{{"role": "user", "content": "a b"}, {"role": "assistant", "content": ""}},
			"continue_final_message": true, "add_generation_prompt": false}, 200, "a b a"},
		{"no continuation", obj{"messages": msgs("assistant"), "continue_final_message": false}, 200, "a b a"},
		{"no generation prompt alone", obj{"messages": msgs("user"), "add_generation_prompt": false}, 200, "a a a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.body["max_tokens"] = 3
			r := post(t, w, PathChatCompletions, tt.body)
			mustStatus(t, r, tt.status)
			if tt.status != 200 {
				if e := decode[ErrorBody](t, r.body).Error; e.Message != tt.content || e.Type != "BadRequestError" {
					t.Errorf("error %+v, want %q", e, tt.content)
				}
				return
			}
			if got := decode[ChatCompletion](t, r.body).Choices[0].Message.Content; got != tt.content {
				t.Errorf("content %q, want %q", got, tt.content)
			}
		})
	}
}

// generated returns what the worker generates for prompt ids with max tokens n.
func generated(t *testing.T, w *Worker, ids []int, n int) []int {
	t.Helper()
	r := post(t, w, PathGenerate, generate(ids, obj{"max_tokens": n}, nil))
	mustStatus(t, r, 200)
	g := decode[GenerateResponse](t, r.body)
	if g.Usage.PromptTokens != len(ids) || g.Usage.CompletionTokens != n {
		t.Errorf("usage %+v for %d prompt ids", g.Usage, len(ids))
	}
	return g.Choices[0].TokenIDs
}

func TestGenerateContinuation(t *testing.T) {
	w := startWorker(t, Config{})
	tests := []struct {
		name   string
		prompt []int
		want   []int // the first 7 ids generated
	}{
		{"distinct ids cycle from the start", []int{1, 11, 12, 13}, []int{11, 12, 13, 11, 12, 13, 11}},
		{"one id", []int{1, 9}, []int{9, 9, 9, 9, 9, 9, 9}},
		{"a repeated id", []int{1, 7, 7, 7}, []int{7, 7, 7, 7, 7, 7, 7}},
		{"a pattern that repeats goes on", []int{1, 7, 8, 7}, []int{8, 7, 8, 7, 8, 7, 8}},
		{"first id again at the end", []int{1, 5, 6, 9, 5}, []int{6, 9, 5, 6, 9, 5, 6}},
		{"images and BOS are skipped", []int{1, ImageTokenID, ImageTokenID, 21, 22}, []int{21, 22, 21, 22, 21, 22, 21}},
		{"only BOS", []int{1}, slices.Repeat([]int{WordTokenID(fallbackWord)}, 7)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			full := generated(t, w, tt.prompt, len(tt.want))
			if !slices.Equal(full, tt.want) {
				t.Fatalf("generated %v, want %v", full, tt.want)
			}
			// A continuation (the prompt and the first k ids) gets exactly the rest.
			for k := 1; k < len(full); k++ {
				if got := generated(t, w, slices.Concat(tt.prompt, full[:k]), len(full)-k); !slices.Equal(got, full[k:]) {
					t.Errorf("continuation after %d ids: %v, want %v", k, got, full[k:])
				}
			}
		})
	}
}

func TestShortestPeriod(t *testing.T) {
	tests := []struct {
		s    []int
		want int
	}{
		{[]int{1}, 1},
		{[]int{1, 2, 3}, 3},
		{[]int{1, 1, 1}, 1},
		{[]int{1, 2, 1}, 2},
		{[]int{1, 2, 1, 2, 1}, 2},
		{[]int{1, 2, 3, 1, 2}, 3},
		{[]int{1, 2, 1, 1, 2}, 3},
		{[]int{1, 1, 2}, 3},
	}
	for _, tt := range tests {
		if got := shortestPeriod(tt.s); got != tt.want {
			t.Errorf("shortestPeriod(%v) = %d, want %d", tt.s, got, tt.want)
		}
	}
}

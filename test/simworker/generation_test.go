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
			c.Choices[0].FinishReason != "length" || c.Usage != (Usage{wantPrompt, 5, wantPrompt + 5}) {
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
			*c.Choices[0].FinishReason != "length" || *c.Usage != (Usage{5, 6, 11}) {
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
			*g.Choices[0].FinishReason != "length" || *g.Usage != (Usage{4, 5, 9}) {
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

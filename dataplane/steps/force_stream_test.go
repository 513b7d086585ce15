package steps

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// A non-streaming client's decode is sent as a stream and folded back into one JSON answer; a
// decode worker dying mid-stream is resumed, invisibly to the client.
func TestForceStream(t *testing.T) {
	words := strings.Fields("one two three four five six")
	var legs atomic.Int32
	gw := newFakeGateway(t, func(w http.ResponseWriter, c captured) {
		if legs.Add(1) == 1 {
			streamWords(w, words, 0, 2)
			return
		}
		streamWords(w, words, 2, 0)
	})
	s := newStep(t, DecodeStep, gw, map[string]any{"force_stream": true})
	rc, rec := newRC(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":6}`, nil)
	if err := s.Execute(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	first := gw.requests()[0]
	if first.Body["stream"] != true || first.Body["stream_options"].(map[string]any)["include_usage"] != true {
		t.Fatalf("the decode leg was not streamed: %s", first.Raw)
	}
	var got struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Choices []struct {
			Message      struct{ Role, Content string } `json:"message"`
			FinishReason string                         `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("answer %q: %v", rec.Body.String(), err)
	}
	if got.Object != "chat.completion" || got.ID != "chatcmpl-x" || len(got.Choices) != 1 || got.Choices[0].Message.Role != "assistant" ||
		got.Choices[0].Message.Content != strings.Join(words, " ") || got.Choices[0].FinishReason != "length" || legs.Load() != 2 {
		t.Fatalf("folded answer %s after %d legs", rec.Body.String(), legs.Load())
	}
	if held := s.(*decode).force.Held(); held != 0 {
		t.Fatalf("%d bytes still reserved", held)
	}
}

// What cannot be force-streamed goes unstreamed, as upstream does: tools, logprobs, no token
// limit, over the per-request budget.
func TestForceStreamFallbacks(t *testing.T) {
	for name, body := range map[string]string{
		"tools":          `{"messages":[],"max_tokens":4,"tools":[{"type":"function","function":{"name":"f"}}]}`,
		"logprobs":       `{"messages":[],"max_tokens":4,"logprobs":true}`,
		"no token limit": `{"messages":[]}`,
		"over budget":    `{"messages":[],"max_tokens":100000}`,
	} {
		t.Run(name, func(t *testing.T) {
			gw := newFakeGateway(t, func(w http.ResponseWriter, c captured) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"id":"plain"}`)
			})
			s := newStep(t, DecodeStep, gw, map[string]any{"force_stream": true})
			rc, rec := newRC(t, "/v1/chat/completions", body, nil)
			if err := s.Execute(context.Background(), rc); err != nil {
				t.Fatal(err)
			}
			if leg := gw.only(); leg.Body["stream"] != nil || rec.Body.String() != `{"id":"plain"}` {
				t.Fatalf("leg %s, answer %s: want the unstreamed path", leg.Raw, rec.Body.String())
			}
		})
	}
}

// A worker's error answer to a force-streamed leg reaches the client as it came; a stream that
// breaks off for good is a clean 502, never a partial JSON.
func TestForceStreamErrors(t *testing.T) {
	gw := newFakeGateway(t, func(w http.ResponseWriter, c captured) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"message":"nope"}}`)
	})
	s := newStep(t, DecodeStep, gw, map[string]any{"force_stream": true})
	rc, rec := newRC(t, "/v1/chat/completions", `{"messages":[],"max_tokens":4}`, nil)
	if err := s.Execute(context.Background(), rc); err != nil || rec.Code != 400 || rec.Body.String() != `{"error":{"message":"nope"}}` {
		t.Fatalf("err %v, answer %d %s", err, rec.Code, rec.Body.String())
	}
	cut := newFakeGateway(t, func(w http.ResponseWriter, c captured) { streamWords(w, []string{"a", "b", "c"}, 0, 1) })
	s = newStep(t, DecodeStep, cut, map[string]any{"force_stream": true, "max_resumes": 0})
	rc, rec = newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":4}`, nil)
	err := s.Execute(context.Background(), rc)
	if err == nil || rec.Body.Len() != 0 || len(rec.Header()) != 0 {
		t.Fatalf("err %v, client got %q", err, rec.Body.String())
	}
}

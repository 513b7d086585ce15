package simworker

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// weatherTools are two function tools; get_weather's schema has a member of each type.
var weatherTools = []obj{
	{"type": "function", "function": obj{"name": "get_weather", "parameters": obj{"type": "object", "properties": obj{
		"city": obj{"type": "string"}, "days": obj{"type": "integer"}, "metric": obj{"type": "boolean"},
		"hours": obj{"type": "array"}, "opts": obj{"type": "object"}, "note": obj{"type": []string{"string", "null"}}, "x": obj{}}}}},
	{"type": "function", "function": obj{"name": "get_time", "parameters": obj{"type": "object"}}},
}

// TestToolCalls: tool_choice required or named answers one deterministic call, whole or streamed
// one piece per token; auto answers text.
func TestToolCalls(t *testing.T) {
	w := startWorker(t, Config{})
	const weatherArgs = `{"city":"paris","days":2,"hours":[],"metric":true,"note":"weather","opts":{},"x":null}`
	tests := []struct {
		name       string
		choice     any
		maxTokens  int
		wantName   string
		wantArgs   string
		wantFinish string
	}{
		{name: "required: the first tool", choice: "required", maxTokens: 50, wantName: "get_weather", wantArgs: weatherArgs, wantFinish: "tool_calls"},
		{name: "named", choice: obj{"type": "function", "function": obj{"name": "get_time"}}, maxTokens: 50, wantName: "get_time", wantArgs: `{}`, wantFinish: "stop"}, // vLLM's finish of a named call
		{name: "cut by max tokens", choice: "required", maxTokens: 2, wantName: "get_weather", wantArgs: `{"city":"paris","days":2`, wantFinish: "length"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := userChat("paris weather now", obj{"tools": weatherTools, "tool_choice": tc.choice, "max_tokens": tc.maxTokens})
			r := post(t, w, PathChatCompletions, req)
			mustStatus(t, r, http.StatusOK)
			full := decode[struct {
				Choices []struct {
					Message struct {
						Content   *string    `json:"content"`
						ToolCalls []ToolCall `json:"tool_calls"`
					} `json:"message"`
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
				Usage Usage `json:"usage"`
			}](t, r.body)
			ch := full.Choices[0]
			if len(ch.Message.ToolCalls) != 1 || ch.Message.Content != nil || ch.FinishReason != tc.wantFinish {
				t.Fatalf("%s", r.body)
			}
			call := ch.Message.ToolCalls[0]
			if call.Function.Name != tc.wantName || call.Function.Arguments != tc.wantArgs || call.Type != "function" || !strings.HasPrefix(call.ID, "call_") {
				t.Errorf("call %+v", call)
			}
			pieces := strings.Count(tc.wantArgs, ",") + 1
			if tc.wantArgs != "{}" && tc.wantFinish == "tool_calls" {
				pieces++ // the closing brace
			}
			if full.Usage.CompletionTokens != pieces {
				t.Errorf("%d completion tokens, want %d", full.Usage.CompletionTokens, pieces)
			}

			req["stream"], req["stream_options"] = true, obj{"include_usage": true}
			r = post(t, w, PathChatCompletions, req)
			mustStatus(t, r, http.StatusOK)
			var args strings.Builder
			var events int
			var finish, id string
			for _, ev := range strings.Split(strings.TrimSpace(string(r.body)), "\n\n") {
				data := strings.TrimPrefix(ev, "data: ")
				if data == "[DONE]" {
					continue
				}
				var c struct {
					Choices []struct {
						Delta struct {
							ToolCalls []ToolCall `json:"tool_calls"`
						} `json:"delta"`
						FinishReason *string `json:"finish_reason"`
					} `json:"choices"`
				}
				if err := json.Unmarshal([]byte(data), &c); err != nil {
					t.Fatal(err)
				}
				for _, ch := range c.Choices {
					for _, tcall := range ch.Delta.ToolCalls {
						events++
						args.WriteString(tcall.Function.Arguments)
						if tcall.ID != "" {
							id = tcall.ID
						}
					}
					if ch.FinishReason != nil {
						finish = *ch.FinishReason
					}
				}
			}
			if args.String() != tc.wantArgs || events != pieces || finish != tc.wantFinish || !strings.HasPrefix(id, "call_") {
				t.Errorf("streamed %q in %d events (finish %s, id %s), want %q in %d", args.String(), events, finish, id, tc.wantArgs, pieces)
			}
		})
	}
	t.Run("auto answers text", func(t *testing.T) {
		r := post(t, w, PathChatCompletions, userChat("hello there", obj{"tools": weatherTools, "tool_choice": "auto", "max_tokens": 2}))
		mustStatus(t, r, http.StatusOK)
		if !strings.Contains(string(r.body), `"content":"hello there"`) || strings.Contains(string(r.body), "tool_calls") {
			t.Errorf("%s", r.body)
		}
	})
}

func TestToolCallErrors(t *testing.T) {
	w := startWorker(t, Config{})
	for name, tc := range map[string]struct {
		extra obj
		says  string
	}{
		"required without tools":        {obj{"tool_choice": "required"}, "`tools` must be set"},
		"an unknown name":               {obj{"tools": weatherTools, "tool_choice": obj{"type": "function", "function": obj{"name": "nope"}}}, "Tool 'nope' has not been passed"},
		"a named choice without a name": {obj{"tools": weatherTools, "tool_choice": obj{"type": "function"}}, "tool_choice must be"},
	} {
		t.Run(name, func(t *testing.T) {
			r := post(t, w, PathChatCompletions, userChat("x", tc.extra))
			mustStatus(t, r, http.StatusBadRequest)
			if !strings.Contains(string(r.body), tc.says) {
				t.Errorf("%s", r.body)
			}
		})
	}
}

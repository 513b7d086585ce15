package anthropic

import (
	"net/http"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
)

func TestAnswer(t *testing.T) {
	o := Options{RequestID: "req-1", Model: "asked", StopSequences: []string{"END"}}
	tests := []struct {
		name, chat, want string
	}{
		{
			name: "text, length, usage with cached tokens",
			chat: `{"id":"chatcmpl-abc","object":"chat.completion","model":"served","choices":[{"index":0,"message":{"role":"assistant","content":"hello there"},"finish_reason":"length"}],
				"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":4}}}`,
			want: `{"id":"msg_abc","type":"message","role":"assistant","model":"served","content":[{"type":"text","text":"hello there"}],
				"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":6,"cache_creation_input_tokens":0,"cache_read_input_tokens":4,"output_tokens":2}}`,
		},
		{
			name: "tool calls after text",
			chat: `{"id":"chatcmpl-x","model":"served","choices":[{"message":{"role":"assistant","content":"Checking.","tool_calls":[
				{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},
				{"id":"","type":"function","function":{"name":"get_time","arguments":""}}]},"finish_reason":"tool_calls"}],
				"usage":{"prompt_tokens":3,"completion_tokens":9}}`,
			want: `{"id":"msg_x","type":"message","role":"assistant","model":"served","content":[{"type":"text","text":"Checking."},
				{"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Paris"}},
				{"type":"tool_use","id":"toolu_req-1_1","name":"get_time","input":{}}],
				"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":3,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":9}}`,
		},
		{
			name: "stop on a stop sequence (vLLM's stop_reason), no model, no id, no usage",
			chat: `{"choices":[{"message":{"content":"a"},"finish_reason":"stop","stop_reason":"END"}]}`,
			want: `{"id":"msg_req-1","type":"message","role":"assistant","model":"asked","content":[{"type":"text","text":"a"}],
				"stop_reason":"stop_sequence","stop_sequence":"END","usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}`,
		},
		{
			name: "stop on the end-of-sequence token, empty content",
			chat: `{"id":"chatcmpl-y","model":"s","choices":[{"message":{"content":""},"finish_reason":"stop","stop_reason":2}]}`,
			want: `{"id":"msg_y","type":"message","role":"assistant","model":"s","content":[],"stop_reason":"end_turn","stop_sequence":null,
				"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}`,
		},
		{
			name: "a stop string that is not a requested stop sequence",
			chat: `{"id":"z","model":"s","choices":[{"message":{"content":null},"finish_reason":"stop","stop_reason":"</s>"}]}`,
			want: `{"id":"msg_z","type":"message","role":"assistant","model":"s","content":[],"stop_reason":"end_turn","stop_sequence":null,
				"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}`,
		},
		{
			name: "a named tool call: vLLM finishes it with stop",
			chat: `{"id":"chatcmpl-n","model":"s","choices":[{"message":{"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"stop"}]}`,
			want: `{"id":"msg_n","type":"message","role":"assistant","model":"s","content":[{"type":"tool_use","id":"c1","name":"f","input":{}}],"stop_reason":"tool_use","stop_sequence":null,
				"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}`,
		},
		{
			name: "content filter",
			chat: `{"id":"z","model":"s","choices":[{"message":{"content":"no"},"finish_reason":"content_filter"}]}`,
			want: `{"id":"msg_z","type":"message","role":"assistant","model":"s","content":[{"type":"text","text":"no"}],"stop_reason":"refusal","stop_sequence":null,
				"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}`,
		},
		{
			name: "no finish reason, reasoning dropped",
			chat: `{"id":"z","model":"s","choices":[{"message":{"content":"k","reasoning_content":"hmm"},"finish_reason":null}]}`,
			want: `{"id":"msg_z","type":"message","role":"assistant","model":"s","content":[{"type":"text","text":"k"}],"stop_reason":"end_turn","stop_sequence":null,
				"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := Answer([]byte(tc.chat), o)
			if err != nil {
				t.Fatal(err)
			}
			equalJSON(t, out, tc.want)
		})
	}
}

func TestAnswerErrors(t *testing.T) {
	for name, chat := range map[string]string{
		"not JSON":           `{"choices":`,
		"no choice":          `{"id":"x","choices":[]}`,
		"arguments not JSON": `{"choices":[{"message":{"tool_calls":[{"id":"c","function":{"name":"f","arguments":"{\"a\":"}}]},"finish_reason":"tool_calls"}]}`,
		"arguments an array": `{"choices":[{"message":{"tool_calls":[{"id":"c","function":{"name":"f","arguments":"[1]"}}]},"finish_reason":"tool_calls"}]}`,
		"choices an object":  `{"choices":{}}`,
	} {
		t.Run(name, func(t *testing.T) {
			if out, err := Answer([]byte(chat), Options{}); err == nil {
				t.Errorf("translated to %s", out)
			}
		})
	}
}

func TestErrorBody(t *testing.T) {
	tests := map[int]string{
		400: TypeInvalidRequest, 401: TypeAuthentication, 403: TypePermission, 404: TypeNotFound, 405: TypeInvalidRequest,
		408: TypeInvalidRequest, 413: TypeTooLarge, 429: TypeRateLimit, 499: TypeInvalidRequest, 500: TypeAPI, 502: TypeAPI,
		503: TypeOverloaded, 504: TypeTimeout, 529: TypeOverloaded,
	}
	for status, typ := range tests {
		e := &apierror.Error{Status: status, Type: apierror.TypeAPI, Code: "c", Message: `say "hi"`, Param: "p"}
		equalJSON(t, ErrorBody(e, "rid"), `{"type":"error","error":{"type":"`+typ+`","message":"say \"hi\""},"request_id":"rid"}`)
	}
	if b := ErrorBody(&apierror.Error{Status: http.StatusBadGateway, Message: "m"}, ""); strings.Contains(string(b), "request_id") || !strings.HasSuffix(string(b), "\n") {
		t.Errorf("%s", b)
	}
}

package anthropic

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/state/body"
)

// equalJSON fails unless got and want are the same JSON value.
func equalJSON(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad want: %v\n%s", err, want)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestTranslate(t *testing.T) {
	tests := []struct {
		name string
		kind Kind
		in   string
		want string
		// stops and remote are the Request's StopSequences and RemoteImage.
		stops  []string
		remote string
		stream bool
	}{
		{
			name: "minimal",
			in:   `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
			want: `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`,
		},
		{
			name: "system string, sampling, stop sequences, user id, stream",
			in: `{"model":"m","max_tokens":7,"system":"be brief","temperature":0.5,"top_p":0.9,"top_k":40,"stop_sequences":["END","##"],
				"metadata":{"user_id":"u-1"},"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			want: `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"max_tokens":7,
				"temperature":0.5,"top_p":0.9,"top_k":40,"stop":["END","##"],"stream":true,"stream_options":{"include_usage":true},"user":"u-1"}`,
			stops:  []string{"END", "##"},
			stream: true,
		},
		{
			name: "system text blocks, cache_control and citations ignored, stream false, null metadata user",
			in: `{"model":"m","max_tokens":1,"stream":false,"metadata":{"user_id":null},"cache_control":{"type":"ephemeral"},"service_tier":"auto",
				"system":[{"type":"text","text":"one","cache_control":{"type":"ephemeral"}},{"type":"text","text":"two","citations":[]}],
				"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}]}`,
			want: `{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"one"},{"type":"text","text":"two"}]},
				{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":1}`,
		},
		{
			name: "images: base64 as a data URL, a URL as it is",
			in: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[
				{"type":"text","text":"what is this"},
				{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},
				{"type":"image","source":{"type":"url","url":"https://example.com/a.jpg"}}]}]}`,
			want: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is this"},
				{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}},
				{"type":"image_url","image_url":{"url":"https://example.com/a.jpg"}}]}],"max_tokens":1}`,
			remote: "messages[0].content[2].source.url",
		},
		{
			name: "escaped base64 is decoded once",
			in:   `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/gif","data":"R0lG\/OD=="}}]}]}`,
			want: `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/gif;base64,R0lG/OD=="}}]}],"max_tokens":1}`,
		},
		{
			name: "a tool round trip: tool_use as tool_calls, tool_result as tool messages",
			in: `{"model":"m","max_tokens":9,"messages":[
				{"role":"user","content":"weather in Paris?"},
				{"role":"assistant","content":[{"type":"text","text":"Let me look."},
					{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris","days":[1,2],"q":"a \"b\"\n"}},
					{"type":"tool_use","id":"toolu_2","name":"get_time","input":{}}]},
				{"role":"user","content":[
					{"type":"tool_result","tool_use_id":"toolu_1","content":"sunny","is_error":false},
					{"type":"tool_result","tool_use_id":"toolu_2","content":[{"type":"text","text":"noon"},{"type":"text","text":"CET"}]},
					{"type":"text","text":"thanks"}]}]}`,
			want: `{"model":"m","messages":[
				{"role":"user","content":"weather in Paris?"},
				{"role":"assistant","content":"Let me look.","tool_calls":[
					{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"days\":[1,2],\"q\":\"a \\\"b\\\"\\n\"}"}},
					{"id":"toolu_2","type":"function","function":{"name":"get_time","arguments":"{}"}}]},
				{"role":"tool","tool_call_id":"toolu_1","content":"sunny"},
				{"role":"tool","tool_call_id":"toolu_2","content":[{"type":"text","text":"noon"},{"type":"text","text":"CET"}]},
				{"role":"user","content":[{"type":"text","text":"thanks"}]}],"max_tokens":9}`,
		},
		{
			name: "images inside a tool result follow the tool messages in a user message",
			in: `{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"shot","input":{}}]},
				{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"done"},
					{"type":"image","source":{"type":"base64","media_type":"image/jpeg","data":"/9j/"}}]},
				{"type":"tool_result","tool_use_id":"u"}]}]}`,
			want: `{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"t","type":"function","function":{"name":"shot","arguments":"{}"}}]},
				{"role":"tool","tool_call_id":"t","content":[{"type":"text","text":"done"}]},
				{"role":"tool","tool_call_id":"u","content":""},
				{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,/9j/"}}]}],"max_tokens":1}`,
		},
		{
			name: "assistant text blocks as parts; a final assistant message is continued",
			in: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"go"},
				{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`,
			want: `{"model":"m","messages":[{"role":"user","content":"go"},{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
				"max_tokens":1,"continue_final_message":true,"add_generation_prompt":false}`,
		},
		{
			name: "an empty assistant block list",
			in:   `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"go"},{"role":"assistant","content":"Sure,"}]}`,
			want: `{"model":"m","messages":[{"role":"user","content":"go"},{"role":"assistant","content":"Sure,"}],"max_tokens":1,
				"continue_final_message":true,"add_generation_prompt":false}`,
		},
		{
			name: "tools and tool_choice tool with parallel calls disabled",
			in: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],
				"tools":[{"name":"get_weather","description":"Weather.","input_schema":{"type":"object","properties":{"city":{"type":"string"}}},"cache_control":{"type":"ephemeral"}},
					{"type":"custom","name":"noop","input_schema":{"type":"object"},"strict":true}],
				"tool_choice":{"type":"tool","name":"get_weather","disable_parallel_tool_use":true}}`,
			want: `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1,
				"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather.","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}},
					{"type":"function","function":{"name":"noop","parameters":{"type":"object"},"strict":true}}],
				"tool_choice":{"type":"function","function":{"name":"get_weather"}},"parallel_tool_calls":false}`,
		},
		{
			name: "tool_choice any is required",
			in:   `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tools":[],"tool_choice":{"type":"any","disable_parallel_tool_use":false}}`,
			want: `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1,"tool_choice":"required"}`,
		},
		{
			name: "tool_choice auto, thinking disabled, output_config effort",
			in: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"auto"},"thinking":{"type":"disabled"},
				"output_config":{"effort":"low"}}`,
			want: `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1,"tool_choice":"auto"}`,
		},
		{
			name: "tool_choice none",
			in:   `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"none"}}`,
			want: `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1,"tool_choice":"none"}`,
		},
		{
			name:  "count_tokens: no max_tokens, sampling and stop dropped",
			kind:  CountTokens,
			in:    `{"model":"m","system":"s","messages":[{"role":"user","content":"hi"}],"stop_sequences":["x"],"max_tokens":3}`,
			want:  `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}]}`,
			stops: []string{"x"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := Translate([]byte(tc.in), tc.kind, 0)
			if err != nil {
				t.Fatal(err)
			}
			equalJSON(t, req.Chat.Bytes(), tc.want)
			if req.Model != "m" || req.Stream != tc.stream || req.RemoteImage != tc.remote || !reflect.DeepEqual(req.StopSequences, tc.stops) {
				t.Errorf("model %q stream %v remote %q stops %q", req.Model, req.Stream, req.RemoteImage, req.StopSequences)
			}
		})
	}
}

// TestTranslateReferencesLargeValues: base64 data and long texts are not copied; the chat body
// references the client's bytes, so they are copied at most once (by a step reading the messages
// whole).
func TestTranslateReferencesLargeValues(t *testing.T) {
	data := strings.Repeat("QUJD", 64<<10) // 256 KiB of base64
	text := strings.Repeat("word ", 4096)
	raw := []byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"` + text +
		`"},{"type":"image","source":{"type":"base64","media_type":"image/webp","data":"` + data + `"}}]}]}`)
	req, err := Translate(raw, Create, 0)
	if err != nil {
		t.Fatal(err)
	}
	bufs, n := req.Chat.Buffers()
	var referenced int
	for _, b := range bufs {
		if len(b) > inlineMax && body.Offset(raw, b) >= 0 {
			referenced += len(b)
		}
	}
	if referenced != len(data)+len(text)+2 { // the text with its quotes, the data without
		t.Errorf("%d bytes referenced, want %d", referenced, len(data)+len(text)+2)
	}
	if int(n) < len(data)+len(text) || !json.Valid(req.Chat.Bytes()) {
		t.Fatalf("body of %d bytes, valid %v", n, json.Valid(req.Chat.Bytes()))
	}
	msgs, _ := req.Chat.Get("messages")
	if !strings.Contains(string(msgs), `"url":"data:image/webp;base64,`+data+`"`) {
		t.Error("the data URL is not the client's data")
	}
}

// TestTranslateErrors: every field of the wrong type or value is a 400 naming it.
func TestTranslateErrors(t *testing.T) {
	msg := func(content string) string {
		return `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":` + content + `}]}`
	}
	asst := func(content string) string {
		return `{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":` + content + `}]}`
	}
	top := func(extra string) string {
		return `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],` + extra + `}`
	}
	tests := []struct {
		name, in, param, says string
		kind                  Kind
	}{
		{name: "not JSON", in: `{"model":`, says: "invalid JSON"},
		{name: "not an object", in: `[1]`, says: "must be a JSON object"},
		{name: "model missing", in: `{"max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, param: "model", says: "is required"},
		{name: "model a number", in: `{"model":1,"max_tokens":1,"messages":[]}`, param: "model", says: "must be a string"},
		{name: "max_tokens missing", in: `{"model":"m","messages":[{"role":"user","content":"x"}]}`, param: "max_tokens", says: "is required"},
		{name: "max_tokens zero", in: `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, param: "max_tokens", says: "positive integer"},
		{name: "max_tokens a string", in: `{"model":"m","max_tokens":"5","messages":[{"role":"user","content":"x"}]}`, param: "max_tokens"},
		{name: "max_tokens a fraction", in: `{"model":"m","max_tokens":1.5,"messages":[{"role":"user","content":"x"}]}`, param: "max_tokens"},
		{name: "messages missing", in: `{"model":"m","max_tokens":1}`, param: "messages", says: "is required"},
		{name: "messages an object", in: `{"model":"m","max_tokens":1,"messages":{}}`, param: "messages", says: "must be an array"},
		{name: "messages empty", in: `{"model":"m","max_tokens":1,"messages":[]}`, param: "messages", says: "must not be empty"},
		{name: "a message not an object", in: `{"model":"m","max_tokens":1,"messages":["hi"]}`, param: "messages[0]", says: "must be an object"},
		{name: "role system", in: `{"model":"m","max_tokens":1,"messages":[{"role":"system","content":"x"}]}`, param: "messages[0].role", says: "user or assistant"},
		{name: "role a number", in: `{"model":"m","max_tokens":1,"messages":[{"role":1,"content":"x"}]}`, param: "messages[0].role", says: "must be a string"},
		{name: "content missing", in: `{"model":"m","max_tokens":1,"messages":[{"role":"user"}]}`, param: "messages[0].content", says: "is required"},
		{name: "content a number", in: msg(`5`), param: "messages[0].content", says: "string or an array"},
		{name: "a block not an object", in: msg(`[[{"type":"text","text":"x"}]]`), param: "messages[0].content[0]", says: "must be an object"},
		{name: "block type missing", in: msg(`[{"text":"x"}]`), param: "messages[0].content[0].type", says: "is required"},
		{name: "block type a number", in: msg(`[{"type":3}]`), param: "messages[0].content[0].type", says: "must be a string"},
		{name: "text block without text", in: msg(`[{"type":"text"},{"type":"hologram"}]`), param: "messages[0].content[0].text", says: "is required"},
		{name: "unknown block type", in: msg(`[{"type":"hologram"}]`), param: "messages[0].content[0].type", says: `unknown content block type "hologram"`},
		{name: "text a number", in: msg(`[{"type":"text","text":5}]`), param: "messages[0].content[0].text", says: "must be a string"},
		{name: "document", in: msg(`[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"x"}}]`), param: "messages[0].content[0].type", says: "document blocks"},
		{name: "search result", in: msg(`[{"type":"search_result"}]`), param: "messages[0].content[0].type", says: "search result"},
		{name: "thinking in input", in: asst(`[{"type":"thinking","thinking":"hm","signature":"s"}]`), param: "messages[0].content[0].type", says: "thinking blocks"},
		{name: "redacted thinking", in: asst(`[{"type":"redacted_thinking","data":"x"}]`), param: "messages[0].content[0].type", says: "redacted thinking"},
		{name: "server tool use", in: asst(`[{"type":"server_tool_use","id":"x","name":"web_search","input":{}}]`), param: "messages[0].content[0].type", says: "server tools"},
		{name: "web search result", in: msg(`[{"type":"web_search_tool_result"}]`), param: "messages[0].content[0].type", says: "server tools"},
		{name: "image in an assistant message", in: asst(`[{"type":"image","source":{"type":"url","url":"http://x"}}]`), param: "messages[0].content[0].type", says: "user messages"},
		{name: "tool_use in a user message", in: msg(`[{"type":"tool_use","id":"a","name":"b","input":{}}]`), param: "messages[0].content[0].type", says: "assistant messages"},
		{name: "tool_result in an assistant message", in: asst(`[{"type":"tool_result","tool_use_id":"a"}]`), param: "messages[0].content[0].type", says: "user messages"},
		{name: "image without source", in: msg(`[{"type":"image"}]`), param: "messages[0].content[0].source", says: "is required"},
		{name: "image source a string", in: msg(`[{"type":"image","source":"http://x"}]`), param: "messages[0].content[0].source", says: "must be an object"},
		{name: "image source type file", in: msg(`[{"type":"image","source":{"type":"file","file_id":"f"}}]`), param: "messages[0].content[0].source.type", says: "Files API"},
		{name: "image source type unknown", in: msg(`[{"type":"image","source":{"type":"s3"}}]`), param: "messages[0].content[0].source.type", says: "base64 or url"},
		{name: "image media type", in: msg(`[{"type":"image","source":{"type":"base64","media_type":"image/bmp","data":"x"}}]`), param: "messages[0].content[0].source.media_type", says: "image/jpeg"},
		{name: "image media type a number", in: msg(`[{"type":"image","source":{"type":"base64","media_type":1,"data":"x"}}]`), param: "messages[0].content[0].source.media_type"},
		{name: "image data missing", in: msg(`[{"type":"image","source":{"type":"base64","media_type":"image/png"}}]`), param: "messages[0].content[0].source.data", says: "is required"},
		{name: "image data empty", in: msg(`[{"type":"image","source":{"type":"base64","media_type":"image/png","data":""}}]`), param: "messages[0].content[0].source.data", says: "must not be empty"},
		{name: "image data a number", in: msg(`[{"type":"image","source":{"type":"base64","media_type":"image/png","data":7}}]`), param: "messages[0].content[0].source.data", says: "must be a string"},
		{name: "image url empty", in: msg(`[{"type":"image","source":{"type":"url","url":""}}]`), param: "messages[0].content[0].source.url", says: "must not be empty"},
		{name: "image url an object", in: msg(`[{"type":"image","source":{"type":"url","url":{}}}]`), param: "messages[0].content[0].source.url", says: "must be a string"},
		{name: "tool_use without id", in: asst(`[{"type":"tool_use","name":"b","input":{}}]`), param: "messages[0].content[0].id", says: "is required"},
		{name: "tool_use name a number", in: asst(`[{"type":"tool_use","id":"a","name":2,"input":{}}]`), param: "messages[0].content[0].name"},
		{name: "tool_use input a string", in: asst(`[{"type":"tool_use","id":"a","name":"b","input":"{}"}]`), param: "messages[0].content[0].input", says: "must be an object"},
		{name: "tool_result without id", in: msg(`[{"type":"tool_result","content":"x"}]`), param: "messages[0].content[0].tool_use_id", says: "is required"},
		{name: "tool_result content a number", in: msg(`[{"type":"tool_result","tool_use_id":"a","content":1}]`), param: "messages[0].content[0].content"},
		{name: "tool_result is_error a string", in: msg(`[{"type":"tool_result","tool_use_id":"a","is_error":"yes"}]`), param: "messages[0].content[0].is_error"},
		{name: "tool_result holding a document", in: msg(`[{"type":"tool_result","tool_use_id":"a","content":[{"type":"document"}]}]`), param: "messages[0].content[0].content[0].type", says: "document"},
		{name: "tool_result holding a tool_use", in: msg(`[{"type":"tool_result","tool_use_id":"a","content":[{"type":"tool_use"}]}]`), param: "messages[0].content[0].content[0].type", says: "text and image"},
		{name: "tool_result holding a bad image", in: msg(`[{"type":"tool_result","tool_use_id":"a","content":[{"type":"image","source":{"type":"base64","media_type":"image/tiff","data":"x"}}]}]`), param: "messages[0].content[0].content[0].source.media_type"},
		{name: "system a number", in: top(`"system":1`), param: "system", says: "string or an array"},
		{name: "system image block", in: top(`"system":[{"type":"image"}]`), param: "system[0].type", says: "text blocks"},
		{name: "system block text missing", in: top(`"system":[{"type":"text"}]`), param: "system[0].text"},
		{name: "stop_sequences a string", in: top(`"stop_sequences":"END"`), param: "stop_sequences", says: "must be an array"},
		{name: "a stop sequence a number", in: top(`"stop_sequences":["a",1]`), param: "stop_sequences[1]", says: "must be a string"},
		{name: "temperature a string", in: top(`"temperature":"hot"`), param: "temperature", says: "must be a number"},
		{name: "top_p a boolean", in: top(`"top_p":true`), param: "top_p"},
		{name: "top_k negative", in: top(`"top_k":-1`), param: "top_k", says: "non-negative integer"},
		{name: "top_k a fraction", in: top(`"top_k":1.5`), param: "top_k"},
		{name: "stream a string", in: top(`"stream":"true"`), param: "stream", says: "must be a boolean"},
		{name: "count_tokens streamed", in: top(`"stream":true`), kind: CountTokens, param: "stream", says: "does not stream"},
		{name: "metadata a string", in: top(`"metadata":"u"`), param: "metadata", says: "must be an object"},
		{name: "metadata user id a number", in: top(`"metadata":{"user_id":1}`), param: "metadata.user_id"},
		{name: "tools an object", in: top(`"tools":{}`), param: "tools", says: "must be an array"},
		{name: "a tool a string", in: top(`"tools":["get"]`), param: "tools[0]", says: "must be an object"},
		{name: "a server tool", in: top(`"tools":[{"type":"web_search_20250305","name":"web_search"}]`), param: "tools[0].type", says: "server tools"},
		{name: "a bash tool", in: top(`"tools":[{"name":"x","input_schema":{}},{"type":"bash_20250124","name":"bash"}]`), param: "tools[1].type", says: "bash_20250124"},
		{name: "a tool type a number", in: top(`"tools":[{"type":1}]`), param: "tools[0].type"},
		{name: "a tool without a name", in: top(`"tools":[{"input_schema":{}}]`), param: "tools[0].name", says: "is required"},
		{name: "a tool without a schema", in: top(`"tools":[{"name":"x"}]`), param: "tools[0].input_schema", says: "JSON Schema"},
		{name: "a tool description a number", in: top(`"tools":[{"name":"x","input_schema":{},"description":1}]`), param: "tools[0].description"},
		{name: "a tool strict a string", in: top(`"tools":[{"name":"x","input_schema":{},"strict":"yes"}]`), param: "tools[0].strict"},
		{name: "tool_choice a string", in: top(`"tool_choice":"auto"`), param: "tool_choice", says: "must be an object"},
		{name: "tool_choice type unknown", in: top(`"tool_choice":{"type":"required"}`), param: "tool_choice.type", says: "auto, any, tool or none"},
		{name: "tool_choice type a number", in: top(`"tool_choice":{"type":1}`), param: "tool_choice.type"},
		{name: "tool_choice tool without a name", in: top(`"tool_choice":{"type":"tool"}`), param: "tool_choice.name", says: "is required"},
		{name: "tool_choice parallel a string", in: top(`"tool_choice":{"type":"auto","disable_parallel_tool_use":"no"}`), param: "tool_choice.disable_parallel_tool_use"},
		{name: "thinking enabled", in: top(`"thinking":{"type":"enabled","budget_tokens":2048}`), param: "thinking", says: "extended thinking"},
		{name: "thinking adaptive", in: top(`"thinking":{"type":"adaptive"}`), param: "thinking", says: "adaptive"},
		{name: "thinking a boolean", in: top(`"thinking":true`), param: "thinking", says: "must be an object"},
		{name: "thinking type a number", in: top(`"thinking":{"type":1}`), param: "thinking.type"},
		{name: "structured outputs", in: top(`"output_config":{"format":{"type":"json_schema","schema":{}}}`), param: "output_config.format"},
		{name: "output_config a string", in: top(`"output_config":"x"`), param: "output_config"},
		{name: "a container", in: top(`"container":"c"`), param: "container", says: "code execution"},
		{name: "MCP servers", in: top(`"mcp_servers":[{"type":"url","url":"https://mcp","name":"x"}]`), param: "mcp_servers", says: "MCP"},
		{name: "context management", in: top(`"context_management":{}`), param: "context_management"},
		{name: "an unknown field", in: top(`"frequency_penalty":1`), param: "frequency_penalty", says: "unknown field"},
		{name: "a long unknown type is cut", in: msg(`[{"type":"` + strings.Repeat("x", 500) + `"}]`), param: "messages[0].content[0].type", says: strings.Repeat("x", 64) + "..."},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Translate([]byte(tc.in), tc.kind, 0)
			var e *apierror.Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v, want an *apierror.Error", err)
			}
			if e.Status != http.StatusBadRequest || e.Type != apierror.TypeInvalidRequest || e.Param != tc.param {
				t.Errorf("status %d type %q param %q, want 400 invalid_request_error %q (%s)", e.Status, e.Type, e.Param, tc.param, e.Message)
			}
			if !strings.Contains(e.Message, tc.says) || (tc.param != "" && !strings.HasPrefix(e.Message, tc.param+": ")) {
				t.Errorf("message %q, want it to start with the param and say %q", e.Message, tc.says)
			}
		})
	}
}

// TestContentBlockLimit: every content block counts against server.max_content_blocks (system
// blocks, message blocks across messages, the blocks of a tool_result's content); the first one
// over it is refused with a 400 naming it and the key. String contents are no blocks.
func TestContentBlockLimit(t *testing.T) {
	text := `{"type":"text","text":"x"}`
	blocks := func(n int) string { return "[" + strings.TrimSuffix(strings.Repeat(text+",", n), ",") + "]" }
	user := func(content string) string { return `{"role":"user","content":` + content + `}` }
	req := func(system string, msgs ...string) string {
		if system != "" {
			system = `"system":` + system + `,`
		}
		return `{"model":"m","max_tokens":1,` + system + `"messages":[` + strings.Join(msgs, ",") + `]}`
	}
	result := `{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":` + blocks(3) + `}]}`
	tests := []struct {
		name, in string
		limit    int
		param    string // the block refused; "" when accepted
	}{
		{name: "at the limit", in: req("", user(blocks(4))), limit: 4},
		{name: "over the limit", in: req("", user(blocks(5))), limit: 4, param: "messages[0].content[4]"},
		{name: "no limit", in: req("", user(blocks(50))), limit: 0},
		{name: "across messages, at", in: req("", user(blocks(2)), `{"role":"assistant","content":`+blocks(2)+`}`), limit: 4},
		{name: "across messages, over", in: req("", user(blocks(2)), `{"role":"assistant","content":`+blocks(2)+`}`, user(blocks(1))), limit: 4,
			param: "messages[2].content[0]"},
		{name: "string contents are no blocks", in: req(`"s"`, user(`"a"`), user(blocks(4))), limit: 4},
		{name: "system blocks count", in: req(blocks(3), user(blocks(2))), limit: 4, param: "messages[0].content[1]"},
		{name: "system blocks alone", in: req(blocks(5), user(`"a"`)), limit: 4, param: "system[4]"},
		{name: "a tool_result and its content, at", in: req("", result), limit: 4},
		{name: "a tool_result and its content, over", in: req("", user(blocks(1)), result), limit: 4, param: "messages[1].content[0].content[2]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Translate([]byte(tc.in), Create, tc.limit)
			if tc.param == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var e *apierror.Error
			if !errors.As(err, &e) || e.Status != http.StatusBadRequest || e.Param != tc.param ||
				e.Message != fmt.Sprintf("%s: more than %d content blocks in the request (server.max_content_blocks)", tc.param, tc.limit) {
				t.Fatalf("error %v (param %q), want a 400 naming %s and server.max_content_blocks", err, e.Param, tc.param)
			}
		})
	}
}

// A request over the limit is refused when the count passes it: the blocks after it are not
// read (they are not even valid here).
func TestContentBlockLimitFailsFast(t *testing.T) {
	in := `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[` + strings.Repeat(`{"type":"text","text":"x"},`, 3) + `{"type":"bogus"}]}]}`
	if _, err := Translate([]byte(in), Create, 2); err == nil || !strings.Contains(err.Error(), "server.max_content_blocks") {
		t.Fatalf("error %v, want the block limit (the bogus block after it is never read)", err)
	}
}

// TestTranslateHostile: deep nesting, huge arrays and every wrong type stay 400s or translate to
// valid JSON.
func TestTranslateHostile(t *testing.T) {
	t.Run("deeply nested content", func(t *testing.T) {
		deep := strings.Repeat("[", 5000) + strings.Repeat("]", 5000)
		_, err := Translate([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":`+deep+`}]}`), Create, 0)
		var e *apierror.Error
		if !errors.As(err, &e) || e.Param != "messages[0].content[0]" {
			t.Fatalf("%v, want a 400 naming messages[0].content[0]", err)
		}
	})
	t.Run("deeply nested tool input is passed as arguments", func(t *testing.T) {
		deep := strings.Repeat(`{"a":`, 3000) + "1" + strings.Repeat("}", 3000)
		req, err := Translate([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"i","name":"n","input":`+deep+`}]}]}`), Create, 0)
		if err != nil {
			t.Fatal(err)
		}
		var chat struct {
			Messages []struct {
				ToolCalls []struct {
					Function struct{ Arguments string } `json:"function"`
				} `json:"tool_calls"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(req.Chat.Bytes(), &chat); err != nil {
			t.Fatal(err)
		}
		if got := chat.Messages[0].ToolCalls[0].Function.Arguments; got != deep {
			t.Errorf("arguments of %d bytes, want the input (%d)", len(got), len(deep))
		}
	})
	t.Run("a huge content array", func(t *testing.T) {
		const n = 100_000
		var b strings.Builder
		b.WriteString(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"type":"text","text":"t%d"}`, i)
		}
		b.WriteString(`]}]}`)
		req, err := Translate([]byte(b.String()), Create, 0)
		if err != nil {
			t.Fatal(err)
		}
		var chat struct {
			Messages []struct {
				Content []struct{ Text string } `json:"content"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(req.Chat.Bytes(), &chat); err != nil {
			t.Fatal(err)
		}
		if c := chat.Messages[0].Content; len(c) != n || c[n-1].Text != fmt.Sprintf("t%d", n-1) {
			t.Errorf("%d parts", len(c))
		}
	})
	t.Run("wrong types everywhere", func(t *testing.T) {
		// Each member of a valid request replaced by a value of every other kind: a 400 naming
		// that member (or a member inside it), or a valid translation.
		base := map[string]string{
			"model": `"m"`, "max_tokens": `5`, "system": `"s"`, "stop_sequences": `["x"]`, "temperature": `1`, "top_p": `1`, "top_k": `1`,
			"stream": `true`, "metadata": `{"user_id":"u"}`, "tools": `[{"name":"t","input_schema":{}}]`, "tool_choice": `{"type":"auto"}`,
			"thinking": `{"type":"disabled"}`, "messages": `[{"role":"user","content":[{"type":"text","text":"x"}]}]`,
		}
		kinds := []string{`null`, `true`, `7`, `-1.5`, `"str"`, `[]`, `{}`, `[1]`, `{"a":1}`}
		for key := range base {
			for _, v := range kinds {
				var b strings.Builder
				b.WriteString("{")
				first := true
				for k, bv := range base {
					if !first {
						b.WriteString(",")
					}
					first = false
					if k == key {
						bv = v
					}
					fmt.Fprintf(&b, "%q:%s", k, bv)
				}
				b.WriteString("}")
				req, err := Translate([]byte(b.String()), Create, 0)
				if err == nil {
					if !json.Valid(req.Chat.Bytes()) {
						t.Errorf("%s=%s: invalid chat body %s", key, v, req.Chat.Bytes())
					}
					continue
				}
				var e *apierror.Error
				if !errors.As(err, &e) || e.Status != http.StatusBadRequest || !strings.HasPrefix(e.Param, key) {
					t.Errorf("%s=%s: %v (param %q), want a 400 naming it", key, v, err, e.Param)
				}
			}
		}
	})
}

// FuzzTranslate: any body is a 400 *apierror.Error naming a field, or a valid JSON chat body.
func FuzzTranslate(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","max_tokens":5,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"a\/b"}}]}]}`,
		`{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"i","name":"n","input":{"q":"\u0000\"\\"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"i","content":[{"type":"text","text":"r"}]}]}],"tools":[{"name":"n","input_schema":{}}],"tool_choice":{"type":"tool","name":"n"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, kind := range []Kind{Create, CountTokens} {
			req, err := Translate(raw, kind, 0)
			if err != nil {
				var e *apierror.Error
				if !errors.As(err, &e) || e.Status != http.StatusBadRequest {
					t.Fatalf("%v: not a 400", err)
				}
				continue
			}
			if out := req.Chat.Bytes(); !json.Valid(out) {
				t.Fatalf("invalid chat body %q from %q", out, raw)
			}
		}
	})
}

package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// event is one Anthropic stream event: its name and its data.
type event struct {
	name string
	data string
}

// parseEvents splits an Anthropic event stream, checking that each event's name is its data's
// type.
func parseEvents(t *testing.T, raw string) []event {
	t.Helper()
	var out []event
	if raw != "" && !strings.HasSuffix(raw, "\n\n") {
		t.Fatalf("the stream does not end with a whole event: %q", raw)
	}
	for _, ev := range strings.Split(strings.TrimSuffix(raw, "\n\n"), "\n\n") {
		if ev == "" {
			continue
		}
		name, data, ok := strings.Cut(ev, "\n")
		name, ok1 := strings.CutPrefix(name, "event: ")
		data, ok2 := strings.CutPrefix(data, "data: ")
		if !ok || !ok1 || !ok2 {
			t.Fatalf("malformed event %q", ev)
		}
		var typed struct{ Type string }
		if err := json.Unmarshal([]byte(data), &typed); err != nil || typed.Type != name {
			t.Fatalf("event %s with data %s", name, data)
		}
		out = append(out, event{name, data})
	}
	return out
}

// sse renders chat chunks as server-sent events.
func chatSSE(chunks ...string) string {
	var b strings.Builder
	for _, c := range chunks {
		b.WriteString("data: " + c + "\n\n")
	}
	return b.String()
}

const (
	roleChunk  = `{"id":"chatcmpl-s1","object":"chat.completion.chunk","model":"served","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`
	usageChunk = `{"id":"chatcmpl-s1","object":"chat.completion.chunk","model":"served","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":2}}}`
)

func textChunk(s string, finish string) string {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	q, _ := json.Marshal(s)
	return `{"id":"chatcmpl-s1","model":"served","choices":[{"index":0,"delta":{"content":` + string(q) + `},"finish_reason":` + f + `}]}`
}

const start = `{"type":"message_start","message":{"id":"msg_s1","type":"message","role":"assistant","model":"served","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}}`

func TestStream(t *testing.T) {
	o := Options{RequestID: "rid", Model: "asked", StopSequences: []string{"STOP"}}
	tests := []struct {
		name string
		in   string
		want []string // the events' data, in order
	}{
		{
			name: "text",
			in:   chatSSE(roleChunk, textChunk("Hello", ""), textChunk(" world", ""), textChunk("!", "length"), usageChunk, "[DONE]"),
			want: []string{start, `{"type":"ping"}`,
				`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" world"}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"!"}}`,
				`{"type":"content_block_stop","index":0}`,
				`{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"input_tokens":10,"cache_creation_input_tokens":0,"cache_read_input_tokens":2,"output_tokens":3}}`,
				`{"type":"message_stop"}`},
		},
		{
			name: "text then two tool calls, arguments in pieces",
			in: chatSSE(roleChunk, textChunk("Let me check.", ""),
				`{"id":"chatcmpl-s1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}`,
				`{"id":"chatcmpl-s1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}`,
				`{"id":"chatcmpl-s1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}}]}`,
				`{"id":"chatcmpl-s1","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{}"}}]}}]}`,
				`{"id":"chatcmpl-s1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`, usageChunk, "[DONE]"),
			want: []string{start, `{"type":"ping"}`,
				`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Let me check."}}`,
				`{"type":"content_block_stop","index":0}`,
				`{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"call_a","name":"get_weather","input":{}}}`,
				`{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\":"}}`,
				`{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"\"Paris\"}"}}`,
				`{"type":"content_block_stop","index":1}`,
				`{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"call_b","name":"get_time","input":{}}}`,
				`{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{}"}}`,
				`{"type":"content_block_stop","index":2}`,
				`{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"input_tokens":10,"cache_creation_input_tokens":0,"cache_read_input_tokens":2,"output_tokens":3}}`,
				`{"type":"message_stop"}`},
		},
		{
			name: "a stop sequence, comments, CRLF lines, a multi-line data event, no usage",
			in: ": keep-alive\r\n\r\ndata: " + roleChunk + "\r\n\r\n" +
				"data: {\"id\":\"chatcmpl-s1\",\"model\":\"served\",\ndata: \"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\",\"stop_reason\":\"STOP\"}]}\n\n" +
				"event: whatever\nid: 3\ndata: [DONE]\n\n",
			want: []string{start, `{"type":"ping"}`,
				`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}`,
				`{"type":"content_block_stop","index":0}`,
				`{"type":"message_delta","delta":{"stop_reason":"stop_sequence","stop_sequence":"STOP"},"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}`,
				`{"type":"message_stop"}`},
		},
		{
			name: "[DONE] alone",
			in:   chatSSE("[DONE]"),
			want: []string{strings.Replace(strings.Replace(start, "msg_s1", "msg_rid", 1), "served", "asked", 1), `{"type":"ping"}`,
				`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}`,
				`{"type":"message_stop"}`},
		},
		{
			name: "an error event of the chat stream (the resume relay's, or the worker's)",
			in: chatSSE(roleChunk, textChunk("a", ""), `{"error":{"message":"the answer broke off and could not be resumed: worker 10.0.0.7:8000 died","type":"api_error","code":"stream_interrupted"}}`) +
				chatSSE(textChunk("ignored", "")),
			want: []string{start, `{"type":"ping"}`,
				`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}`,
				`{"type":"error","error":{"type":"api_error","message":"the answer broke off and could not be resumed: worker <redacted> died"},"request_id":"rid"}`},
		},
		{
			name: "an event that is not JSON",
			in:   chatSSE(roleChunk, "{oops"),
			want: []string{start, `{"type":"ping"}`, `{"type":"error","error":{"type":"api_error","message":"the answer held an event that is not JSON"},"request_id":"rid"}`},
		},
		{
			name: "interleaved tool calls",
			in: chatSSE(roleChunk,
				`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{"}}]}}]}`,
				`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"g","arguments":"{"}}]}}]}`,
				`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"}"}}]}}]}`),
			want: []string{start, `{"type":"ping"}`,
				`{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"a","name":"f","input":{}}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{"}}`,
				`{"type":"content_block_stop","index":0}`,
				`{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"b","name":"g","input":{}}}`,
				`{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{"}}`,
				`{"type":"error","error":{"type":"api_error","message":"the answer interleaved its tool calls, which cannot be streamed as Anthropic blocks"},"request_id":"rid"}`},
		},
	}
	for _, tc := range tests {
		for _, step := range []int{len(tc.in), 1, 7} { // whole, byte by byte, in odd pieces
			var out bytes.Buffer
			s := NewStream(&out, o)
			for in := tc.in; len(in) > 0; {
				n := min(step, len(in))
				_, _ = s.Write([]byte(in[:n]))
				in = in[n:]
			}
			if err := s.Close(false); err != nil {
				t.Fatal(err)
			}
			evs := parseEvents(t, out.String())
			if len(evs) != len(tc.want) {
				t.Fatalf("%s (writes of %d): %d events, want %d:\n%s", tc.name, step, len(evs), len(tc.want), out.String())
			}
			for i, ev := range evs {
				var g, w any
				_ = json.Unmarshal([]byte(ev.data), &g)
				if err := json.Unmarshal([]byte(tc.want[i]), &w); err != nil {
					t.Fatalf("bad want %s", tc.want[i])
				}
				if !jsonEqual(g, w) {
					t.Errorf("%s (writes of %d): event %d\n got  %s\n want %s", tc.name, step, i, ev.data, tc.want[i])
				}
			}
			if !s.Done() {
				t.Errorf("%s: not done", tc.name)
			}
		}
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// TestStreamCut: a chat stream that ends before [DONE] ends with an error event; one whose
// client went away gets nothing more.
func TestStreamCut(t *testing.T) {
	var out bytes.Buffer
	s := NewStream(&out, Options{RequestID: "rid"})
	_, _ = s.Write([]byte(chatSSE(roleChunk, textChunk("a", "")) + "data: {\"choi"))
	if err := s.Close(false); err != nil {
		t.Fatal(err)
	}
	evs := parseEvents(t, out.String())
	last := evs[len(evs)-1]
	if len(evs) != 5 || last.data != `{"type":"error","error":{"type":"api_error","message":"the answer broke off before its end"},"request_id":"rid"}` {
		t.Errorf("%d events, last %s", len(evs), last.data)
	}

	out.Reset()
	s = NewStream(&out, Options{})
	_, _ = s.Write([]byte(chatSSE(roleChunk)))
	n := out.Len()
	if err := s.Close(true); err != nil || out.Len() != n {
		t.Errorf("wrote %q after the client left", out.String()[n:])
	}
}

// TestStreamEventTooLarge: a line (or an event) over Options.MaxEvent ends the stream with an
// error event naming gateway.max_event_size, and Write tells the relay to stop reading.
func TestStreamEventTooLarge(t *testing.T) {
	const MaxEventBytes = 1 << 20
	huge := textChunk(strings.Repeat("x", MaxEventBytes), "")
	for name, in := range map[string]string{
		"one line":                "data: " + huge + "\n\n",
		"a line without its end":  "data: " + huge,
		"many lines of one event": strings.Repeat("data: "+strings.Repeat("y", 1000)+"\n", MaxEventBytes/1000+2) + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			s := NewStream(&out, Options{RequestID: "rid", MaxEvent: MaxEventBytes})
			_, _ = s.Write([]byte(chatSSE(roleChunk)))
			var err error
			for in := in; len(in) > 0 && err == nil; {
				n := min(32<<10, len(in))
				_, err = s.Write([]byte(in[:n]))
				in = in[n:]
			}
			if !errors.Is(err, ErrEventTooLarge) {
				t.Fatalf("Write: %v, want ErrEventTooLarge", err)
			}
			_ = s.Close(false)
			evs := parseEvents(t, out.String())
			if last := evs[len(evs)-1]; !strings.Contains(last.data, `"type":"error"`) || !strings.Contains(last.data, "exceeds gateway.max_event_size (1048576 bytes)") || len(evs) != 3 {
				t.Errorf("%d events, last %s", len(evs), last.data)
			}
			if out.Len() > 4096 {
				t.Errorf("%d bytes written", out.Len())
			}
		})
	}
}

// FuzzStream: whatever a chat stream holds and however it is cut, the client gets whole
// Anthropic events (each with its type as its name), ending with message_stop or one error event.
func FuzzStream(f *testing.F) {
	f.Add([]byte(chatSSE(roleChunk, textChunk("a", "length"), usageChunk, "[DONE]")), uint8(7))
	f.Add([]byte(chatSSE(roleChunk, `{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{\"x\":1}"}}]},"finish_reason":"tool_calls"}]}`, "[DONE]")), uint8(3))
	f.Add([]byte("data: {\"error\":{\"message\":\"x\"}}\n\n"), uint8(1))
	f.Fuzz(func(t *testing.T, in []byte, step uint8) {
		var out bytes.Buffer
		s := NewStream(&out, Options{RequestID: "rid", MaxEvent: 1 << 20})
		n := int(step)%64 + 1
		for len(in) > 0 {
			k := min(n, len(in))
			if _, err := s.Write(in[:k]); err != nil && !errors.Is(err, ErrEventTooLarge) && !errors.Is(err, ErrUntranslatable) {
				t.Fatal(err)
			}
			in = in[k:]
		}
		_ = s.Close(false)
		evs := parseEvents(t, out.String())
		if len(evs) == 0 {
			t.Fatal("no event")
		}
		last := evs[len(evs)-1].name
		if last != "message_stop" && last != "error" {
			t.Fatalf("the stream ends with %s", last)
		}
		for _, ev := range evs[:len(evs)-1] {
			if ev.name == "error" || ev.name == "message_stop" {
				t.Fatalf("%s before the end", ev.name)
			}
		}
	})
}

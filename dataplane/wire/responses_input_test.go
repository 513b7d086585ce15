package wire

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/state/body"
)

func parse(t *testing.T, s string) *body.Object {
	t.Helper()
	o, err := body.Parse([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func TestCheck(t *testing.T) {
	many := `[` + strings.Repeat(`"x",`, MaxInputItems) + `"x"]`
	tests := map[string]struct {
		body      string
		wantParam string // "" when accepted
		wantMsg   string
	}{
		"a string input":                    {body: `{"model":"m","input":"hi"}`},
		"message items, calls and outputs":  {body: `{"input":[{"role":"user","content":"hi"},{"type":"message","role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"42"},{"type":"reasoning","summary":[]}]}`},
		"store and background false":        {body: `{"input":"hi","store":false,"background":false,"previous_response_id":null}`},
		"function tools":                    {body: `{"input":"hi","tools":[{"type":"function","name":"f","parameters":{}}]}`},
		"previous_response_id":              {body: `{"input":"hi","previous_response_id":"resp_1"}`, wantParam: "previous_response_id", wantMsg: "stateless"},
		"conversation":                      {body: `{"input":"hi","conversation":"conv_1"}`, wantParam: "conversation", wantMsg: "stored conversation"},
		"a stored prompt":                   {body: `{"input":"hi","prompt":{"id":"p"}}`, wantParam: "prompt"},
		"store true":                        {body: `{"input":"hi","store":true}`, wantParam: "store", wantMsg: "GET /v1/responses/{id}"},
		"background true":                   {body: `{"input":"hi","background":true}`, wantParam: "background", wantMsg: "background"},
		"store not a boolean":               {body: `{"input":"hi","store":"yes"}`, wantParam: "store"},
		"no input":                          {body: `{"model":"m"}`, wantParam: "input", wantMsg: "required"},
		"input a number":                    {body: `{"input":7}`, wantParam: "input"},
		"too many items":                    {body: `{"input":` + many + `}`, wantParam: "input", wantMsg: "too many input items"},
		"an item_reference":                 {body: `{"input":[{"type":"item_reference","id":"msg_1"}]}`, wantParam: "input", wantMsg: "stored item"},
		"a built-in tool's call":            {body: `{"input":[{"type":"web_search_call","id":"ws"}]}`, wantParam: "input", wantMsg: "not served"},
		"an item that is not an object":     {body: `{"input":["hi"]}`, wantParam: "input", wantMsg: "input[0] must be an object"},
		"message content a number":          {body: `{"input":[{"role":"user","content":1}]}`, wantParam: "input", wantMsg: "input[0].content"},
		"function call without name":        {body: `{"input":[{"type":"function_call","call_id":"c","arguments":"{}"}]}`, wantParam: "input", wantMsg: "input[0].name"},
		"function output with parts":        {body: `{"input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"x"}]}]}`, wantParam: "input", wantMsg: "must be a string"},
		"a server-side tool":                {body: `{"input":"hi","tools":[{"type":"web_search"}]}`, wantParam: "tools", wantMsg: "server-side"},
		"a function tool without name":      {body: `{"input":"hi","tools":[{"type":"function"}]}`, wantParam: "tools", wantMsg: "name"},
		"max_output_tokens not an integer":  {body: `{"input":"hi","max_output_tokens":"9"}`, wantParam: "max_output_tokens"},
		"instructions not a string":         {body: `{"input":"hi","instructions":{}}`, wantParam: "instructions"},
		"tools not an array":                {body: `{"input":"hi","tools":{}}`, wantParam: "tools"},
		"the type of an item not a string":  {body: `{"input":[{"type":1}]}`, wantParam: "input", wantMsg: "type must be a string"},
		"a role that is not a string":       {body: `{"input":[{"role":1,"content":"x"}]}`, wantParam: "input", wantMsg: "role"},
		"encrypted reasoning":               {body: `{"input":[{"type":"reasoning","summary":[],"encrypted_content":"gAAA"}]}`, wantParam: "input", wantMsg: "encrypted reasoning"},
		"function_call_output with no call": {body: `{"input":[{"type":"function_call_output","output":"x"}]}`, wantParam: "input", wantMsg: "call_id"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := checkResponses(parse(t, tc.body))
			if tc.wantParam == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var e *apierror.Error
			if !errors.As(err, &e) || e.Status != 400 || e.Param != tc.wantParam || !strings.Contains(e.Message, tc.wantMsg) {
				t.Fatalf("got %#v, want a 400 on %s saying %q", err, tc.wantParam, tc.wantMsg)
			}
		})
	}
}

func TestStateless(t *testing.T) {
	o := parse(t, `{"input":"hi"}`)
	stateless(o)
	if raw, _ := o.Get("store"); string(raw) != "false" {
		t.Fatalf("store %s, want false", raw)
	}
	o = parse(t, `{"input":"hi","store":false}`)
	stateless(o)
	if string(o.Bytes()) != `{"input":"hi","store":false}` {
		t.Fatalf("a stateless body was changed: %s", o.Bytes())
	}
}

func TestChat(t *testing.T) {
	img := "data:image/png;base64," + strings.Repeat("A", 4096)
	tests := map[string]struct {
		body, want string
	}{
		"a string input with instructions": {body: `{"model":"m","instructions":"be brief","input":"hi"}`,
			want: `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`},
		"message items and their parts": {body: `{"input":[{"role":"user","content":[{"type":"input_text","text":"look"},{"type":"input_image","image_url":"` + img + `","detail":"auto"}]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok","annotations":[]}]}]}`,
			want: `{"messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"` + img + `"}}]},{"role":"assistant","content":[{"type":"text","text":"ok"}]}]}`},
		"function calls, outputs, reasoning": {body: `{"input":[{"role":"user","content":"weather?"},{"type":"reasoning","summary":[{"type":"summary_text","text":"look it up"}]},{"type":"function_call","call_id":"c1","name":"get","arguments":"{\"city\":\"x\"}"},{"type":"function_call_output","call_id":"c1","output":"sunny"}]}`,
			want: `{"messages":[{"role":"user","content":"weather?"},{"role":"assistant","reasoning":"look it up"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get","arguments":"{\"city\":\"x\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"}]}`},
		"function tools become chat tools": {body: `{"input":"hi","tools":[{"type":"function","name":"get","description":"d","parameters":{"type":"object"},"strict":true}]}`,
			want: `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"get","description":"d","parameters":{"type":"object"},"strict":true}}]}`},
		"reasoning without one summary: its content, else empty": {body: `{"input":[{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"think"}]},{"type":"reasoning","summary":[]}]}`,
			want: `{"messages":[{"role":"assistant","reasoning":"think"},{"role":"assistant","reasoning":""}]}`},
		"tool_choice none: no tools in the prompt": {body: `{"input":"hi","tool_choice":"none","tools":[{"type":"function","name":"get"}]}`,
			want: `{"messages":[{"role":"user","content":"hi"}]}`},
		"input_audio keeps its shape": {body: `{"input":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}]}`,
			want: `{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}]}`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o := parse(t, tc.body)
			if err := checkResponses(o); err != nil {
				t.Fatal(err)
			}
			chat, err := responsesChat(o)
			if err != nil {
				t.Fatal(err)
			}
			got := chat.Bytes()
			if !json.Valid(got) || string(got) != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

// TestChatSharesTheMedia checks that a megabyte image is referenced, not copied, by the chat body.
func TestChatSharesTheMedia(t *testing.T) {
	img := "data:image/png;base64," + strings.Repeat("A", 1<<20)
	o := parse(t, `{"input":[{"role":"user","content":[{"type":"input_image","image_url":"`+img+`"}]}]}`)
	raw, _ := o.Get("input")
	chat, err := responsesChat(o)
	if err != nil {
		t.Fatal(err)
	}
	bufs, n := chat.Buffers()
	shared := false
	for _, b := range bufs {
		if len(b) > 1<<19 && body.Offset(raw, b) >= 0 {
			shared = true
		}
	}
	if !shared || n < 1<<20 {
		t.Fatalf("the image is not a segment of the request's input (%d segments, %d bytes)", len(bufs), n)
	}
}

func TestChatRefusesBadParts(t *testing.T) {
	for name, b := range map[string]string{
		"text not a string":     `{"input":[{"role":"user","content":[{"type":"input_text","text":1}]}]}`,
		"file_id image":         `{"input":[{"role":"user","content":[{"type":"input_image","file_id":"f"}]}]}`,
		"a part not an object":  `{"input":[{"role":"user","content":["x"]}]}`,
		"refusal without value": `{"input":[{"role":"assistant","content":[{"type":"refusal"}]}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := responsesChat(parse(t, b))
			var e *apierror.Error
			if !errors.As(err, &e) || e.Status != 400 || e.Param != "input" {
				t.Fatalf("got %v, want a 400 on input", err)
			}
		})
	}
}

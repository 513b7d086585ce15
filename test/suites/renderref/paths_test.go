package renderref_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/render/chattemplate"
	"github.com/epd-dev/coordinator/dataplane/render/tokenizer"
)

// TestQwen3Tools renders Qwen3's tools path: definitions and call arguments keep the client's key
// order and come out as Python's json.dumps writes them, a string argument is copied verbatim,
// and the tool-call markers tokenize as Qwen3's special tokens.
func TestQwen3Tools(t *testing.T) {
	dir := modelDirs(t)[0]
	tmpl, err := chattemplate.Load(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	tools := `[{"function": {"name": "get_w", "description": "Météo <now> & \"later\"\u2028",
		"parameters": {"required": ["city"], "type": "object", "properties": {"city": {"type": "string"}, "days": {"minimum": 0.5, "type": "integer"}}}},
		"type": "function"}]`
	messages := `[{"role": "user", "content": "Weather?"},
		{"role": "assistant", "content": "", "tool_calls": [
			{"type": "function", "function": {"name": "get_w", "arguments": {"zeta": 1, "alpha": {"y": [1, 2.5, null, true], "b": "ü\n"}}}},
			{"type": "function", "function": {"name": "get_w", "arguments": "{\"raw\":  true}"}}]},
		{"role": "tool", "content": "{\"t\": 21}"}]`
	got, err := tmpl.Render(json.RawMessage(messages), chattemplate.Options{Tools: json.RawMessage(tools), AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	want := "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
		"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" +
		`{"function": {"name": "get_w", "description": "Météo <now> & \"later\"` + "\u2028" + `", "parameters": {"required": ["city"], "type": "object", "properties": {"city": {"type": "string"}, "days": {"minimum": 0.5, "type": "integer"}}}}, "type": "function"}` +
		"\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n" +
		"<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" +
		"<|im_start|>user\nWeather?<|im_end|>\n" +
		"<|im_start|>assistant\n" +
		"<tool_call>\n{\"name\": \"get_w\", \"arguments\": {\"zeta\": 1, \"alpha\": {\"y\": [1, 2.5, null, true], \"b\": \"ü\\n\"}}}\n</tool_call>\n" +
		"<tool_call>\n{\"name\": \"get_w\", \"arguments\": {\"raw\":  true}}\n</tool_call><|im_end|>\n" +
		"<|im_start|>user\n<tool_response>\n{\"t\": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
	if got != want {
		t.Fatalf("rendered %s", textDiff(want, got))
	}

	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode(nil, got, false)
	for _, special := range []string{"<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>"} {
		id, ok := tok.TokenID(special)
		if !ok {
			t.Fatalf("TokenID(%q): not found", special)
		}
		n := 0
		for _, x := range ids {
			if x == id {
				n++
			}
		}
		if want := strings.Count(got, special); n != want {
			t.Errorf("%s (id %d) occurs %d times in the ids, %d times in the text", special, id, n, want)
		}
	}
}

// TestLlamaBOS renders Llama 3's bos_token path: the template writes the BOS itself, so the chat
// text is tokenized without special tokens and starts with exactly one BOS, while a completion
// prompt gets its BOS from the tokenizer.
func TestLlamaBOS(t *testing.T) {
	dir := modelDirs(t)[1]
	tmpl, err := chattemplate.Load(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := tmpl.BOSToken(); got != "<|begin_of_text|>" {
		t.Fatalf("BOSToken() = %q", got)
	}
	got, err := tmpl.Render(json.RawMessage(`[{"role": "system", "content": "  Be brief.\n"}, {"role": "user", "content": "Hi\t"}]`),
		chattemplate.Options{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	want := "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>" +
		"<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
	if got != want {
		t.Fatalf("rendered %s", textDiff(want, got))
	}

	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	bos, ok := tok.TokenID(tmpl.BOSToken())
	if !ok {
		t.Fatal("TokenID(bos): not found")
	}
	countBOS := func(ids []int) int {
		n := 0
		for _, id := range ids {
			if id == bos {
				n++
			}
		}
		return n
	}
	chat := tok.Encode(nil, got, false)
	if len(chat) == 0 || chat[0] != bos || countBOS(chat) != 1 {
		t.Errorf("chat ids %v: want exactly one BOS (%d), first", chat, bos)
	}
	prompt := tok.Encode(nil, "Hi", true)
	if len(prompt) < 2 || prompt[0] != bos || countBOS(prompt) != 1 {
		t.Errorf("prompt ids %v: want the tokenizer's BOS (%d) first, once", prompt, bos)
	}
}

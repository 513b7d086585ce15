package chattemplate

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// The engine reports an unknown filter, test or method only when a render reaches it. Load
// therefore renders these conversations, with and without tools and a generation prompt, so that
// every branch they reach is known to work before a request arrives.
var probeConversations = []struct {
	name     string
	messages string
}{
	{"user", `[{"role": "user", "content": "Hello"}]`},
	{"system+user", `[{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hello"}]`},
	{"multi-turn", `[{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi"},
		{"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke."}]`},
	{"assistant-last", `[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]`},
	{"tool-call", `[{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Weather in Paris?"},
		{"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
			"function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
		{"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21}"},
		{"role": "assistant", "content": "It is 21 °C."}, {"role": "user", "content": "Thanks"}]`},
	{"reasoning", `[{"role": "user", "content": "2+2?"},
		{"role": "assistant", "content": "4", "reasoning_content": "Simple addition."},
		{"role": "user", "content": "3+3?"}]`},
}

const probeTools = `[{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
	"parameters": {"type": "object", "properties": {"city": {"type": "string"},
	"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]`

// probe renders the probe conversations with c. A template's own raise_exception, or a TypeError
// Jinja2 would raise too (strict.go), is an accepted answer (templates legitimately reject some
// shapes) unless every probe is refused; any other error fails the load.
func (t *Template) probe(c *compiled) error {
	probeT := *t
	probeT.main, probeT.toolUse = c, nil
	clock := func() time.Time { return time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC) }
	var raised *TemplateError
	var typeErr *typeError
	refusal := "" // why the last probe the template refused was
	ok := 0
	for _, conv := range probeConversations {
		for _, tools := range []json.RawMessage{nil, json.RawMessage(probeTools)} {
			for _, agp := range []bool{false, true} {
				_, err := probeT.Render(json.RawMessage(conv.messages), Options{Tools: tools, AddGenerationPrompt: agp, Now: clock})
				switch {
				case err == nil:
					ok++
				case errors.As(err, &raised):
					refusal = raised.Message
				case errors.As(err, &typeErr):
					refusal = typeErr.Error()
				default:
					return fmt.Errorf("%w (probe %q, tools=%t, add_generation_prompt=%t)", err, conv.name, tools != nil, agp)
				}
			}
		}
	}
	if ok == 0 {
		return fmt.Errorf("chattemplate: %s: the template rejects every probe conversation: %s", c.file, refusal)
	}
	return nil
}

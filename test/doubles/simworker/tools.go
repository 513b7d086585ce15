package simworker

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
)

// Tool calls. A chat request with tools whose tool_choice is "required" or names a function is
// answered with one call of that function (the first tool for "required"), deterministic as
// the text is: its arguments object has one member per property of the tool's parameters
// schema, in key order, a string property holding the next echo word, an integer or number
// property its position (1, 2, ...), a boolean true, an array [] and an object {}; anything else
// null. The arguments are streamed in pieces, one token each: `{"a":"x"`, `,"b":2`, ..., `}`
// ({} alone without properties), and finish_reason is tool_calls (length when max tokens cut the
// pieces). tool_choice auto, none or absent answers text, as before. As vLLM does, tool_choice
// required or named without tools, or naming a function not in tools, is a 400.

// toolCall is the call a request is answered with.
type toolCall struct {
	name   string
	pieces []string // the arguments JSON, one piece per token
	// named is set when tool_choice named the function: vLLM then finishes with "stop".
	named bool
}

// chatTool is the part of a chat tool definition the worker reads.
type chatTool struct {
	Type     string `json:"type"`
	Function struct {
		Name       string `json:"name"`
		Parameters struct {
			Properties map[string]struct {
				Type json.RawMessage `json:"type"`
			} `json:"properties"`
		} `json:"parameters"`
	} `json:"function"`
}

// toolCallOf returns the call a chat request with tools and toolChoice (raw members, nil when
// absent) is answered with, nil for a text answer.
func (in *inference) toolCallOf(tools, toolChoice []byte) (*toolCall, *apiError) {
	var name string
	switch {
	case absent(toolChoice):
		return nil, nil
	case toolChoice[0] == '"':
		var choice string
		if err := json.Unmarshal(toolChoice, &choice); err != nil {
			return nil, badRequest("tool_choice must be a string or an object: %v", err)
		}
		if choice != "required" {
			return nil, nil // auto, none
		}
	default:
		var named struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if err := json.Unmarshal(toolChoice, &named); err != nil || named.Function.Name == "" {
			return nil, badRequest("tool_choice must be auto, none, required or {\"type\":\"function\",\"function\":{\"name\":...}}")
		}
		name = named.Function.Name
	}
	var list []chatTool
	if !absent(tools) {
		if err := json.Unmarshal(tools, &list); err != nil {
			return nil, badRequest("tools must be an array of function tools: %v", err)
		}
	}
	if len(list) == 0 {
		return nil, badRequest("When using `tool_choice`, `tools` must be set.")
	}
	i := 0
	if name != "" {
		i = slices.IndexFunc(list, func(t chatTool) bool { return t.Function.Name == name })
		if i < 0 {
			return nil, badRequest("Tool '%s' has not been passed in `tools`.", name)
		}
	}
	call := in.argumentsFor(list[i])
	call.named = name != ""
	return call, nil
}

// argumentsFor builds the call of t (see the package's tool calls).
func (in *inference) argumentsFor(t chatTool) *toolCall {
	props := t.Function.Parameters.Properties
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	words := in.outputWords(len(keys))
	call := &toolCall{name: t.Function.Name}
	for i, k := range keys {
		key, _ := json.Marshal(k)
		sep := ","
		if i == 0 {
			sep = "{"
		}
		call.pieces = append(call.pieces, sep+string(key)+":"+argumentValue(props[k].Type, words[i], i+1))
	}
	if len(call.pieces) == 0 {
		call.pieces = []string{"{}"}
	} else {
		call.pieces = append(call.pieces, "}")
	}
	return call
}

// argumentValue is the value of a property of schema type typ (a string or a list of them).
func argumentValue(typ json.RawMessage, word string, pos int) string {
	var name string
	if json.Unmarshal(typ, &name) != nil {
		var names []string
		if json.Unmarshal(typ, &names) == nil && len(names) > 0 {
			name = names[0]
		}
	}
	switch name {
	case "string":
		w, _ := json.Marshal(word)
		return string(w)
	case "integer", "number":
		return strconv.Itoa(pos)
	case "boolean":
		return "true"
	case "array":
		return "[]"
	case "object":
		return "{}"
	}
	return "null"
}

// tokens is the number of tokens of the call's answer under a limit of n.
func (c *toolCall) tokens(n int) int { return min(n, len(c.pieces)) }

// ToolCall is a tool call of a chat answer or stream chunk.
type ToolCall struct {
	Index    int              `json:"index"`
	ID       string           `json:"id,omitempty"`
	Type     string           `json:"type,omitempty"`
	Function ToolCallFunction `json:"function"`
}

// ToolCallFunction is the function of a ToolCall.
type ToolCallFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// toolCompletion is a non-streamed chat completion with a tool call.
type toolCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []toolChoice `json:"choices"`
	Usage   Usage        `json:"usage"`
	// KVTransferParams are a prefill leg's.
	KVTransferParams any `json:"kv_transfer_params,omitempty"`
}

type toolChoice struct {
	Index   int `json:"index"`
	Message struct {
		Role      string     `json:"role"`
		Content   *string    `json:"content"`
		ToolCalls []ToolCall `json:"tool_calls"`
	} `json:"message"`
	FinishReason string `json:"finish_reason"`
}

// toolChunk is a streamed chat event with a tool call delta.
type toolChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []toolChunkChoice `json:"choices"`
}

type toolChunkChoice struct {
	Index int `json:"index"`
	Delta struct {
		ToolCalls []ToolCall `json:"tool_calls"`
	} `json:"delta"`
	FinishReason *string `json:"finish_reason"`
}

// toolCallID is the id of the call of generation g.
func (g *generation) toolCallID() string { return "call_" + strings.TrimPrefix(g.id, "chatcmpl-") }

// toolFinish is the finish_reason of the call's answer.
func (g *generation) toolFinish() string {
	switch {
	case g.usage.CompletionTokens < len(g.in.tool.pieces):
		return finishLength
	case g.in.tool.named:
		return "stop" // vLLM's finish_reason of a named tool call
	}
	return "tool_calls"
}

// toolFull is the non-streamed answer with the call.
func (g *generation) toolFull() any {
	c := toolCompletion{ID: g.id, Object: "chat.completion", Created: g.created, Model: g.model, Usage: g.usage, KVTransferParams: g.kv}
	ch := toolChoice{FinishReason: g.toolFinish()}
	ch.Message.Role = "assistant"
	ch.Message.ToolCalls = []ToolCall{{ID: g.toolCallID(), Type: "function", Function: ToolCallFunction{
		Name: g.in.tool.name, Arguments: strings.Join(g.in.tool.pieces[:g.usage.CompletionTokens], "")}}}
	c.Choices = []toolChoice{ch}
	return c
}

// toolTokenChunk is the event carrying piece i of the call's arguments (the first names the call).
func (g *generation) toolTokenChunk(i int, last bool) any {
	ch := toolChunkChoice{}
	tc := ToolCall{Function: ToolCallFunction{Arguments: g.in.tool.pieces[i]}}
	if i == 0 {
		tc.ID, tc.Type, tc.Function.Name = g.toolCallID(), "function", g.in.tool.name
	}
	ch.Delta.ToolCalls = []ToolCall{tc}
	if last {
		ch.FinishReason = ptr(g.toolFinish())
	}
	return toolChunk{ID: g.id, Object: "chat.completion.chunk", Created: g.created, Model: g.model, Choices: []toolChunkChoice{ch}}
}

package anthropic

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/epd-dev/coordinator/dataplane/state/body"
)

// Options describe the request an answer is translated for.
type Options struct {
	// RequestID is the coordinator's request id: the message id when the worker gave none, and
	// the request_id of errors.
	RequestID string
	// Model is the requested model, the answer's when the worker names none.
	Model string
	// StopSequences are the request's stop_sequences (see Request).
	StopSequences []string
	// MaxEvent bounds one event of a streamed chat answer, in bytes (gateway.max_event_size: the
	// relay has held the worker's events to it already; 0: no bound).
	MaxEvent int64
}

// chatUsage is OpenAI's usage object.
type chatUsage struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// usage is Anthropic's usage object. input_tokens excludes the prompt tokens the prefix cache
// served, which are cache_read_input_tokens (Anthropic's total input is their sum); the
// coordinator never writes a cache, so cache_creation_input_tokens is 0.
type usage struct {
	InputTokens              int64 `json:"input_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
}

func usageOf(u *chatUsage) usage {
	if u == nil {
		return usage{}
	}
	var cached int64
	if u.PromptTokensDetails != nil {
		cached = min(max(u.PromptTokensDetails.CachedTokens, 0), max(u.PromptTokens, 0))
	}
	return usage{InputTokens: max(u.PromptTokens, 0) - cached, CacheReadInputTokens: cached, OutputTokens: max(u.CompletionTokens, 0)}
}

// chatToolCall is one tool call of a chat message (or of a stream delta).
type chatToolCall struct {
	Index    *int   `json:"index"`
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// chatCompletion is the part of a chat completion the translation reads.
type chatCompletion struct {
	ID      string `json:"id"`
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Content   *string        `json:"content"`
			ToolCalls []chatToolCall `json:"tool_calls"`
		} `json:"message"`
		FinishReason *string `json:"finish_reason"`
		// StopReason is vLLM's: the stop string (or token id) that ended the answer.
		StopReason json.RawMessage `json:"stop_reason"`
	} `json:"choices"`
	Usage *chatUsage `json:"usage"`
}

// contentBlock is a text or tool_use block of a message.
type contentBlock struct {
	Type  string          `json:"type"`
	Text  *string         `json:"text,omitempty"`
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
}

// message is an Anthropic message answer.
type message struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []contentBlock `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        usage          `json:"usage"`
}

// errNoChoice reports a chat answer without a choice.
var errNoChoice = errors.New("the chat answer has no choice")

// Answer translates a chat completion (JSON) into an Anthropic message (JSON). Text content
// becomes one text block, each tool call a tool_use block whose input is the call's arguments
// (which must be a JSON object); reasoning content is dropped (see docs/messages.md).
func Answer(chat []byte, o Options) ([]byte, error) {
	var c chatCompletion
	if err := json.Unmarshal(chat, &c); err != nil {
		return nil, fmt.Errorf("decoding the chat answer: %w", err)
	}
	if len(c.Choices) == 0 {
		return nil, errNoChoice
	}
	ch := c.Choices[0]
	m := message{ID: messageID(c.ID, o.RequestID), Type: "message", Role: "assistant", Model: c.Model, Content: []contentBlock{}, Usage: usageOf(c.Usage)}
	if m.Model == "" {
		m.Model = o.Model
	}
	if t := ch.Message.Content; t != nil && *t != "" {
		m.Content = append(m.Content, contentBlock{Type: "text", Text: t})
	}
	for i, tc := range ch.Message.ToolCalls {
		input, err := toolInput(tc.Function.Arguments)
		if err != nil {
			return nil, fmt.Errorf("tool call %d (%s): %w", i, truncate(tc.Function.Name), err)
		}
		m.Content = append(m.Content, contentBlock{Type: "tool_use", ID: toolUseID(tc.ID, o.RequestID, i), Name: tc.Function.Name, Input: input})
	}
	reason, seq := stopReason(ch.FinishReason, ch.StopReason, o.StopSequences, len(ch.Message.ToolCalls) > 0)
	m.StopReason, m.StopSequence = &reason, seq
	return json.Marshal(m)
}

// toolInput is a tool call's arguments as a tool_use input: a JSON object ("" is {}).
func toolInput(args string) (json.RawMessage, error) {
	a := strings.TrimSpace(args)
	if a == "" {
		return json.RawMessage("{}"), nil
	}
	if !json.Valid([]byte(a)) || a[0] != '{' {
		return nil, errors.New("its arguments are not a JSON object")
	}
	return json.RawMessage(a), nil
}

// stopReason maps a chat finish_reason to an Anthropic stop_reason: stop is end_turn, or
// stop_sequence when the worker reported (vLLM's stop_reason) one of the request's
// stop_sequences as the cause; length is max_tokens, tool_calls (and function_call) tool_use,
// content_filter refusal; anything else, or none, is end_turn. An answer with tool calls
// (toolCalls) is tool_use unless it was cut at the limit: vLLM finishes a named call with stop.
func stopReason(finish *string, workerStop json.RawMessage, stops []string, toolCalls bool) (string, *string) {
	if toolCalls && (finish == nil || *finish != "length") {
		return "tool_use", nil // vLLM finishes a named tool call with "stop"
	}
	if finish == nil {
		return "end_turn", nil
	}
	switch *finish {
	case "stop":
		if body.KindOf(workerStop) == body.KindString {
			var s string
			if json.Unmarshal(workerStop, &s) == nil && slices.Contains(stops, s) {
				return "stop_sequence", &s
			}
		}
		return "end_turn", nil
	case "length":
		return "max_tokens", nil
	case "tool_calls", "function_call":
		return "tool_use", nil
	case "content_filter":
		return "refusal", nil
	}
	return "end_turn", nil
}

// messageID is the message id of a chat answer id: msg_ and the worker's id without its
// chatcmpl- prefix, or msg_ and the request id when the worker gave none.
func messageID(chatID, requestID string) string {
	id := strings.TrimPrefix(chatID, "chatcmpl-")
	if id == "" {
		id = requestID
	}
	return "msg_" + id
}

// toolUseID is a tool call's id, or one made of the request id and the call's place when the
// worker gave none.
func toolUseID(id, requestID string, i int) string {
	if id != "" {
		return id
	}
	return fmt.Sprintf("toolu_%s_%d", requestID, i)
}

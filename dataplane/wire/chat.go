package wire

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/media"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// chat is OpenAI's chat completions: a conversation of messages with content parts; its legs
// carry the rendered prompt as tokens{token_ids, features}.
type chat struct{ conversation }

func (chat) API() request.API { return request.APIChat }
func (chat) Path() string     { return "/v1/chat/completions" }

func (chat) Check(obj *body.Object) error {
	return expectKind(obj, "messages", body.KindArray, "an array", true)
}

func (chat) Legs(useOpenAI bool) Format {
	if !useOpenAI {
		return Generate
	}
	return Chat
}

func (chat) Render(ctx context.Context, rc *request.Context, r Renderer) error {
	return r.Conversation(ctx, rc, rc.Body)
}

func (chat) Conditional(rc *request.Context) *body.Object {
	return conditional(rc, "tokens", tokensSegments)
}

func (c chat) Decode(rc *request.Context, base *body.Object, kv json.RawMessage) (*body.Object, error) {
	return c.decode(rc, base, kv)
}

func (c chat) Prefill(rc *request.Context, t Transfer) (*body.Object, error) {
	obj := c.prefill(rc, t)
	capOneToken(obj, capTokens)
	return obj, nil
}

func (c chat) Encoder(rc *request.Context) (string, func(int) (*body.Object, error), error) {
	return c.encoder(rc, c.Path())
}

func (chat) Continue(cont *body.Object, ec json.RawMessage) (*body.Object, error) {
	obj := cont.Clone()
	if ec != nil {
		obj.Set("ec_transfer_params", ec)
	}
	capOneToken(obj, capTokens)
	return obj, nil
}

func (chat) AskUsage(rc *request.Context) { askUsage(rc) }

func (chat) Events() Events { return chatEvents }

// conversation is what chat and the Responses API share: a conversation whose media items are
// laid out as layout, whose legs carry the rendered prompt as tokens{token_ids, features}.
type conversation struct{ layout *media.Layout }

func (c conversation) Media() *media.Layout { return c.layout }

// decode is the decode leg of a conversation: the rendered tokens, each media part's uuid,
// kv_transfer_params.
func (c conversation) decode(rc *request.Context, base *body.Object, kv json.RawMessage) (*body.Object, error) {
	obj := base.Clone()
	if rc.Rendered {
		if err := media.SetUUIDs(obj, *c.layout, rc.Media); err != nil {
			return nil, err
		}
		obj.SetSegments("tokens", tokensSegments(rc)...)
	}
	if kv != nil {
		obj.Set("kv_transfer_params", kv)
	}
	return obj, nil
}

// prefill is the prefill leg of a conversation before its cap: the client's body with the
// rendered tokens and the transfer parameters.
func (conversation) prefill(rc *request.Context, t Transfer) *body.Object {
	obj := rc.Body.Clone()
	if rc.Rendered {
		obj.SetSegments("tokens", tokensSegments(rc)...)
	}
	if t.KV != nil {
		obj.Set("kv_transfer_params", t.KV)
	}
	if t.EC != nil {
		obj.Set("ec_transfer_params", t.EC)
	}
	return obj
}

// encoder builds a conversation's encode legs in chat shape on path: each item's own media part
// with its placeholder tokens.
func (c conversation) encoder(rc *request.Context, path string) (string, func(int) (*body.Object, error), error) {
	raw, _ := rc.Body.Get(c.layout.Messages)
	msgs, _ := body.Array(raw)
	return path, func(i int) (*body.Object, error) { return encodeItem(rc, msgs, i, false), nil }, nil
}

// conditional is the conditional-decode leg: the client's body, with the rendered prompt as its
// member key (encoded by prompt) when render ran.
func conditional(rc *request.Context, key string, prompt func(*request.Context) [][]byte) *body.Object {
	if !rc.Rendered || rc.TokenCount() == 0 {
		return rc.Body
	}
	obj := rc.Body.Clone()
	obj.SetSegments(key, prompt(rc)...)
	return obj
}

// expectKind checks that member key of obj, when present (or required), is of kind (what names
// it for the message).
func expectKind(obj *body.Object, key string, kind body.Kind, what string, required bool) error {
	k := obj.Kind(key)
	if k == body.KindNone || k == body.KindNull {
		if required {
			return apierror.InvalidField(key, "%q is required", key)
		}
		return nil
	}
	if k != kind {
		return apierror.InvalidField(key, "%q must be %s", key, what)
	}
	return nil
}

// errNoMedia is the encoder of a format that carries no media (never asked: it has no items).
var errNoMedia = errors.New("this format carries no media")

// noEncoder is the Encoder of a format without media.
func noEncoder(f Format) (string, func(int) (*body.Object, error), error) {
	return "", nil, fmt.Errorf("%s: %w", f.Path(), errNoMedia)
}

// A chat stream is continued as the assistant message so far, with continue_final_message.

func (chat) idKey() string { return "id" }
func (chat) created() bool { return true }

func (chat) output(g *Got, content, _ []byte) error {
	if body.KindOf(content) != body.KindString || len(content) <= 2 {
		return nil
	}
	var err error
	if g.text, err = body.AppendString(g.text, content); err != nil {
		return err
	}
	g.tokens++
	return nil
}

func (chat) exotic(toolCalls, reasoning []byte) string {
	switch {
	case present(toolCalls):
		return "a tool call was being streamed"
	case reasoning != nil:
		return "reasoning was being streamed"
	}
	return ""
}

func (chat) sampling(obj *body.Object) *body.Object { return obj }

// continueBody appends the output so far as the assistant message to continue and lowers the
// token limits.
func (chat) continueBody(base, obj *body.Object, g *Got) error {
	if len(g.text) > 0 {
		raw, _ := base.Get("messages")
		raw = bytes.TrimRight(raw, " \t\r\n")
		if len(raw) < 2 || raw[len(raw)-1] != ']' {
			return errors.New("messages is not an array")
		}
		tail := make([]byte, 0, len(g.text)+48)
		tail = append(tail, `,{"role":"assistant","content":`...)
		tail = body.AppendQuote(tail, string(g.text))
		tail = append(tail, "}]"...)
		obj.SetSegments("messages", raw[:len(raw)-1], tail)
		obj.Set("continue_final_message", json.RawMessage("true"))
		obj.Set("add_generation_prompt", json.RawMessage("false"))
	}
	return lowerLimits(obj, g.tokens, "max_tokens", "max_completion_tokens")
}

// opening is a chat stream's opening event: a role with empty content, nothing else.
func (chat) opening(o *body.Object) bool {
	raw, ok := o.Get("choices")
	if !ok {
		return false
	}
	var choices []struct {
		Delta        map[string]json.RawMessage `json:"delta"`
		FinishReason *string                    `json:"finish_reason"`
	}
	if json.Unmarshal(raw, &choices) != nil || len(choices) != 1 || choices[0].FinishReason != nil {
		return false
	}
	d := choices[0].Delta
	if _, hasRole := d["role"]; !hasRole {
		return false
	}
	for k, v := range d {
		if k != "role" && k != "content" || k == "content" && string(v) != `""` && string(v) != "null" {
			return false
		}
	}
	return true
}

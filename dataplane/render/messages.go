package render

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/epd-dev/coordinator/dataplane/render/chattemplate"
	"github.com/epd-dev/coordinator/dataplane/state/body"
)

// usableSplit reports whether split, a caller's split of the messages array raw, is its
// elements (slices of it): convertMessages then iterates split, not raw.
func usableSplit(raw json.RawMessage, split []json.RawMessage) bool {
	return len(split) > 0 && body.Offset(raw, split[0]) >= 0 && body.Offset(raw, split[len(split)-1]) >= 0
}

// convertMessages converts OpenAI chat messages into what vLLM hands a chat template: a content
// list of text parts becomes their texts joined by newlines when the template reads content as a
// string, an absent or null content an empty string, and an assistant's tool call arguments (a
// JSON string) the value they encode ({} when empty). Each message keeps its members in the
// client's order; when no message needs converting, raw itself is returned. With items, the
// converted array's elements are returned too. known (when not nil) is called with each
// message's bytes as the client sent them, in order: a message it reports to be one a
// conversion left as it is, is neither parsed nor converted (a converted message converts to
// itself, so the messages a MessageCache holds, converted ones, are known). split, when not nil,
// is raw's elements as a caller split them already (slices of raw: else raw is split again).
func convertMessages(raw json.RawMessage, split []json.RawMessage, format string, items bool, known func([]byte) bool) (json.RawMessage, []json.RawMessage, error) {
	if body.KindOf(raw) != body.KindArray {
		return nil, nil, inputErr("messages must be an array")
	}
	var out []byte              // nil until a message changes: then raw up to it, and every message after it
	var elems []json.RawMessage // with items: the elements before the first change
	var spans []int             // with items: where each element after it starts and ends in out
	elements := body.Elements(raw)
	if usableSplit(raw, split) {
		if items {
			elems = make([]json.RawMessage, 0, len(split))
		}
		elements = func(yield func([]byte) bool) {
			for _, m := range split {
				if !yield(m) {
					return
				}
			}
		}
	}
	i := 0
	for m := range elements {
		var obj *body.Object
		changed := false
		if known == nil || !known(m) {
			var err error
			if obj, err = body.ParseNested(m); err != nil {
				return nil, nil, inputErr("messages[%d] must be an object", i)
			}
			if changed, err = convertMessage(obj, format); err != nil {
				return nil, nil, inputErr("messages[%d].%v", i, err)
			}
		}
		start := len(out) + 1 // after the comma
		switch {
		case changed && out == nil:
			out = append(make([]byte, 0, len(raw)+64), raw[:body.Offset(raw, m)]...) // "[" and the messages before
			start = len(out)
			out = obj.AppendTo(out)
		case changed:
			out = obj.AppendTo(append(out, ','))
		case out != nil:
			out = append(append(out, ','), m...)
		default:
			if items {
				elems = append(elems, m)
			}
			i++
			continue
		}
		if items {
			spans = append(spans, start, len(out))
		}
		i++
	}
	for k := 0; k < len(spans); k += 2 {
		elems = append(elems, out[spans[k]:spans[k+1]])
	}
	if out == nil {
		return raw, elems, nil
	}
	return append(out, ']'), elems, nil
}

// inputErr is a conversation the renderer refuses, in the client's terms.
func inputErr(format string, args ...any) error {
	return &chattemplate.InputError{Message: fmt.Sprintf(format, args...)}
}

// convertMessage converts one message in place and reports whether it changed.
func convertMessage(obj *body.Object, format string) (bool, error) {
	changed := false
	content, _ := obj.Get("content")
	switch body.KindOf(content) {
	case body.KindNone, body.KindNull:
		obj.Set("content", json.RawMessage(`""`))
		changed = true
	case body.KindArray:
		if format == "string" {
			joined, err := joinText(content)
			if err != nil {
				return false, err
			}
			obj.Set("content", joined)
			changed = true
		}
	}
	if role, _, _ := obj.String("role"); role == "assistant" {
		calls, _ := obj.Get("tool_calls")
		if body.KindOf(calls) == body.KindArray {
			conv, ok, err := decodeArguments(calls)
			if err != nil {
				return false, err
			}
			if ok {
				obj.Set("tool_calls", conv)
				changed = true
			}
		}
	}
	return changed, nil
}

// joinText joins the texts of a content list of text parts with newlines, as a JSON string: the
// parts' string bodies, still escaped, with a "\n" escape between them (they are not decoded
// here: the template's input is decoded once, when it is rendered).
func joinText(parts []byte) (json.RawMessage, error) {
	text := []byte{'"'}
	j := 0
	for p := range body.Objects(parts) {
		if p == nil {
			return nil, fmt.Errorf("content[%d] must be an object", j)
		}
		if t, _, _ := p.String("type"); t != "text" {
			return nil, fmt.Errorf("content[%d]: a %q part cannot be rendered in process (text only)", j, t)
		}
		raw, _ := p.Get("text")
		if body.KindOf(raw) != body.KindString {
			return nil, fmt.Errorf("content[%d].text must be a string", j)
		}
		if j > 0 {
			text = append(text, `\n`...)
		}
		text = append(text, raw[1:len(raw)-1]...)
		j++
	}
	return append(text, '"'), nil
}

// decodeArguments replaces each tool call's function.arguments that is a string (or absent) by
// the JSON value it encodes ({} when empty), and reports whether any changed.
func decodeArguments(calls []byte) (json.RawMessage, bool, error) {
	var out []json.RawMessage
	changed := false
	j := 0
	for call := range body.Elements(calls) {
		c, err := body.ParseNested(call)
		if err != nil {
			return nil, false, fmt.Errorf("tool_calls[%d] must be an object", j)
		}
		fn, _, err := c.Object("function")
		if err != nil || fn == nil {
			return nil, false, fmt.Errorf("tool_calls[%d].function must be an object", j)
		}
		args, _ := fn.Get("arguments")
		var value json.RawMessage
		switch body.KindOf(args) {
		case body.KindNone, body.KindNull:
			value = json.RawMessage(`{}`)
		case body.KindString:
			text, err := body.AppendString(nil, args)
			if err != nil || len(bytes.TrimSpace(text)) == 0 {
				value = json.RawMessage(`{}`)
				break
			}
			if !body.Valid(text) {
				return nil, false, fmt.Errorf("tool_calls[%d].function.arguments is not JSON", j)
			}
			value = text
		}
		if value != nil {
			fn.Set("arguments", value)
			c.Set("function", fn.Bytes())
			changed = true
		}
		out = append(out, c.Bytes())
		j++
	}
	if !changed {
		return nil, false, nil
	}
	return body.AppendArray(nil, out), true, nil
}

package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/epd-dev/coordinator/dataplane/render/jinja"
)

// InputError is a request Render refuses before rendering: input past the limits or of the wrong
// shape. Its message names what is wrong in the client's terms (no file, no engine detail).
type InputError struct {
	Message string
	// Limit names the Limits field the input is past ("MaxInputBytes", "MaxValues",
	// "MaxMessages", "MaxDepth"), or is empty for a wrong shape.
	Limit string
}

// Error implements error.
func (e *InputError) Error() string { return "chattemplate: " + e.Message }

func inputErr(format string, args ...any) error {
	return &InputError{Message: fmt.Sprintf(format, args...)}
}

// limitErr is input past the Limits field limit.
func limitErr(limit, format string, args ...any) error {
	return &InputError{Message: fmt.Sprintf(format, args...), Limit: limit}
}

// reservedVars are the variables Render sets that a kwarg may not replace.
var reservedVars = []string{"messages", "tools", "documents", "add_generation_prompt", "raise_exception", "strftime_now"}

// Render renders messages (a JSON array in HF chat format: role, content (a string or a list of
// parts), tool_calls, tool_call_id, name, reasoning_content, ...) with opts, passing the template
// what transformers' apply_chat_template passes: messages, tools, documents (None),
// add_generation_prompt, the special tokens that are set, the kwargs, and the functions
// raise_exception and strftime_now. An error from raise_exception is a *TemplateError.
func (t *Template) Render(messages json.RawMessage, opts Options) (string, error) {
	_, out, err := t.RenderAfter(messages, opts, nil)
	return out, err
}

// RenderAfter is Render for a rendering expected to begin with the text expect (in pieces: a
// conversation's rendering the turn before): the bytes it begins with that match expect are
// compared, never copied (matched counts them), and rest is the rendering after them. With
// ContinueFinalMessage nothing is expected (matched is 0).
func (t *Template) RenderAfter(messages json.RawMessage, opts Options, expect []string) (matched int, rest string, err error) {
	if opts.ContinueFinalMessage && opts.AddGenerationPrompt {
		return 0, "", inputErr("continue_final_message and add_generation_prompt are not compatible")
	}
	if opts.ContinueFinalMessage {
		expect = nil
	}
	in := &inputs{t: t, validated: opts.Validated, left: t.limits.MaxValues, strs: opts.Strings}
	if in.left == 0 {
		in.left = int(^uint(0) >> 1)
	}
	msgs, tools, err := t.decodeInputs(in, messages, opts)
	if err != nil {
		return 0, "", err
	}
	c := t.main
	if t.toolUse != nil && !tools.IsNone() {
		c = t.toolUse
	}
	vars, err := t.variables(in, c, msgs, tools, opts)
	if err != nil {
		return 0, "", err
	}
	ro := jinja.RenderOptions{SizeHint: len(messages) + len(opts.Tools)}
	var stats jinja.MemoStats
	if in.shared && opts.Iterations != nil {
		ro.Memo, ro.Stats, ro.Spans = opts.Iterations, &stats, opts.Spans
	}
	matched, out, err := c.tmpl.RenderAfter(vars, ro, expect)
	if ro.Memo != nil {
		opts.Iterations.count(&stats)
	}
	if err != nil {
		var te *TemplateError
		if errors.As(err, &te) {
			return 0, "", te
		}
		return 0, "", fmt.Errorf("chattemplate: %s: render: %w", c.file, err)
	}
	if n := matched + len(out); n > t.limits.MaxOutputBytes {
		return 0, "", fmt.Errorf("chattemplate: %s: output of %d bytes exceeds the limit of %d", c.file, n, t.limits.MaxOutputBytes)
	}
	if opts.ContinueFinalMessage {
		out, err = continueFinal(out, msgs.AsList())
		if opts.Spans != nil { // continueFinal keeps a prefix of out: the spans within it
			spans := *opts.Spans
			for len(spans) > 0 && spans[len(spans)-1].At+len(spans[len(spans)-1].Text) > len(out) {
				spans = spans[:len(spans)-1]
			}
			*opts.Spans = spans
		}
	}
	return matched, out, err
}

// inputs decodes one render's inputs (messages, tools, kwargs) against one count of values.
type inputs struct {
	t         *Template
	validated bool
	left      int          // values that may still be decoded
	strs      *StringCache // nil: none
	shared    bool         // the messages are a MessageCache's, shared between renders
}

// decode decodes raw, what the client calls what.
func (in *inputs) decode(what string, raw json.RawMessage) (jinja.Value, error) {
	v, err := decodeValue(raw, in.t.limits.MaxDepth, in.validated, &in.left, in.strs)
	return v, in.check(what, err)
}

// decodeMessages decodes the messages array from items, its elements in order, each found in c
// (or in found, looked up there already) or decoded and kept there: the values the array decodes
// to, counted against the same limits.
func (in *inputs) decodeMessages(c *MessageCache, items []json.RawMessage, found []FoundMessage) (jinja.Value, error) {
	l := &in.t.limits
	if in.left--; in.left < 0 {
		return jinja.Undefined(), in.check("messages", errTooManyValues)
	}
	if l.MaxDepth <= 0 {
		return jinja.Undefined(), in.check("messages", tooDeep(l.MaxDepth))
	}
	vals := make([]jinja.Value, len(items))
	var puts []textPut[decodedMessage] // the messages decoded to be kept, kept together
	defer func() {
		if len(puts) > 0 {
			c.putAll(puts)
		}
	}()
	for i, raw := range items {
		// A message past a limit is decoded again, to fail where the walk would.
		var d decodedMessage
		var key uint64
		var ok bool
		if i < len(found) && found[i].of(raw) { // looked up as it is (not converted since)
			d, key, ok = found[i].d, found[i].key, found[i].ok
			c.count(ok)
		} else {
			d, key, ok = c.get(raw)
		}
		if ok && d.values <= in.left && d.deepest < l.MaxDepth {
			in.left -= d.values
			vals[i] = d.val
			continue
		}
		// A message too large to keep is decoded as the array's others would be (its strings
		// may share the request's bytes, its long ones with escapes found in the string
		// cache); one kept is copied first, and decoded from the copy the cache keeps: its
		// strings share the copy, never the request, and those with escapes are its own (the
		// message is found whole next turn: its strings need no cache of their own).
		data, strs := raw, in.strs
		keep := c.fits(int64(len(raw)) + messageOverhead)
		if keep {
			data, strs = bytes.Clone(raw), nil
		}
		left := in.left
		w := walker{data: data, maxDepth: l.MaxDepth, left: &in.left, strs: strs}
		v, err := w.value(1)
		if err != nil {
			return jinja.Undefined(), in.check("messages", err)
		}
		if n := left - in.left; keep {
			if puts == nil {
				puts = make([]textPut[decodedMessage], 0, len(items)-i) // a first turn keeps each message
			}
			puts = append(puts, textPut[decodedMessage]{key, unsafe.String(unsafe.SliceData(data), len(data)),
				decodedMessage{v, n, w.deepest}, int64(w.copied) + valueOverhead*int64(n) + messageOverhead})
		}
		vals[i] = v
	}
	return jinja.NewList(vals), nil
}

// check returns err, a decoding's of what the client calls what, as the error Render returns.
func (in *inputs) check(what string, err error) error {
	l := &in.t.limits
	switch {
	case errors.Is(err, errTooManyValues):
		return limitErr("MaxValues", "more than %d JSON values in messages, tools and kwargs", l.MaxValues)
	case errors.As(err, new(tooDeep)):
		return limitErr("MaxDepth", "%s: %v", what, err)
	case err != nil:
		return inputErr("%s: %v", what, err)
	}
	return nil
}

// decodeInputs converts and checks the client's messages and tools (tools is None when absent).
func (t *Template) decodeInputs(in *inputs, messages json.RawMessage, opts Options) (msgs, tools jinja.Value, err error) {
	size := len(messages) + len(opts.Tools)
	for _, v := range opts.Kwargs {
		size += len(v)
	}
	if size > t.limits.MaxInputBytes {
		return msgs, tools, limitErr("MaxInputBytes", "input of %d bytes exceeds the limit of %d", size, t.limits.MaxInputBytes)
	}
	if opts.MessageCache != nil && opts.Validated && t.readsInputsOnly && len(opts.MessageItems) > 0 {
		in.shared = true
		msgs, err = in.decodeMessages(opts.MessageCache, opts.MessageItems, opts.MessageFound)
	} else {
		msgs, err = in.decode("messages", messages)
	}
	if err != nil {
		return msgs, tools, err
	}
	if !msgs.IsList() {
		return msgs, tools, inputErr("messages must be a JSON array")
	}
	if n := msgs.AsList().Len(); n > t.limits.MaxMessages {
		return msgs, tools, limitErr("MaxMessages", "%d messages exceed the limit of %d", n, t.limits.MaxMessages)
	}
	for i, m := range msgs.AsList().Items {
		if !m.IsDict() {
			return msgs, tools, inputErr("messages[%d] must be an object", i)
		}
	}
	tools = jinja.None()
	if len(opts.Tools) > 0 && string(opts.Tools) != "null" {
		if tools, err = in.decode("tools", opts.Tools); err != nil {
			return msgs, tools, err
		}
		if !tools.IsList() {
			return msgs, tools, inputErr("tools must be a JSON array")
		}
	}
	return msgs, tools, nil
}

// variables are the template's variables for one render of c.
func (t *Template) variables(in *inputs, c *compiled, msgs, tools jinja.Value, opts Options) (map[string]jinja.Value, error) {
	vars := make(map[string]jinja.Value, 16+len(opts.Kwargs))
	for k, v := range t.tokens {
		vars[k] = jinja.NewString(v)
	}
	if t.extra != nil {
		items := make([]jinja.Value, len(t.extra))
		for i, s := range t.extra {
			items[i] = jinja.NewString(s)
		}
		vars[additionalSpecialTokens] = jinja.NewList(items)
	}
	for k, raw := range opts.Kwargs {
		if strings.HasPrefix(k, "__hf_") || slices.Contains(reservedVars, k) {
			return nil, inputErr("chat template kwarg %q is reserved", k)
		}
		v, err := in.decode(fmt.Sprintf("chat template kwarg %q", k), raw)
		if err != nil {
			return nil, err
		}
		vars[k] = v
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	vars["messages"] = msgs
	vars["tools"] = tools
	vars["documents"] = jinja.None()
	vars["add_generation_prompt"] = jinja.NewBool(opts.AddGenerationPrompt)
	vars["raise_exception"] = jinja.NewCallable("raise_exception", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		msg := ""
		if len(args) > 0 {
			msg = pyStr(args[0])
		}
		return jinja.Undefined(), &TemplateError{File: c.file, Message: msg}
	})
	vars["strftime_now"] = jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 || !args[0].IsString() {
			return jinja.Undefined(), errors.New("strftime_now: want one format string")
		}
		return jinja.NewString(strftime(now(), args[0].AsString())), nil
	})
	return vars, nil
}

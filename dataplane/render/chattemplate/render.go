package chattemplate

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// InputError is a request Render refuses before rendering: input past the limits or of the wrong
// shape. Its message names what is wrong in the client's terms (no file, no engine detail).
type InputError struct{ Message string }

// Error implements error.
func (e *InputError) Error() string { return "chattemplate: " + e.Message }

func inputErr(format string, args ...any) error {
	return &InputError{Message: fmt.Sprintf(format, args...)}
}

// reservedVars are the variables Render sets that a kwarg may not replace.
var reservedVars = []string{"messages", "tools", "documents", "add_generation_prompt", "raise_exception", "strftime_now"}

// Render renders messages (a JSON array in HF chat format: role, content (a string or a list of
// parts), tool_calls, tool_call_id, name, reasoning_content, ...) with opts, passing the template
// what transformers' apply_chat_template passes: messages, tools, documents (None),
// add_generation_prompt, the special tokens that are set, the kwargs, and the functions
// raise_exception and strftime_now. An error from raise_exception is a *TemplateError.
func (t *Template) Render(messages json.RawMessage, opts Options) (string, error) {
	if opts.ContinueFinalMessage && opts.AddGenerationPrompt {
		return "", inputErr("continue_final_message and add_generation_prompt are not compatible")
	}
	msgs, tools, err := t.decodeInputs(messages, opts)
	if err != nil {
		return "", err
	}
	c := t.main
	if t.toolUse != nil && !tools.IsNone() {
		c = t.toolUse
	}
	vars, err := t.variables(c, msgs, tools, opts)
	if err != nil {
		return "", err
	}
	out, err := c.tmpl.RenderValues(vars)
	if err != nil {
		var te *TemplateError
		if errors.As(err, &te) {
			return "", te
		}
		return "", fmt.Errorf("chattemplate: %s: render: %w", c.file, err)
	}
	if len(out) > t.limits.MaxOutputBytes {
		return "", fmt.Errorf("chattemplate: %s: output of %d bytes exceeds the limit of %d", c.file, len(out), t.limits.MaxOutputBytes)
	}
	if opts.ContinueFinalMessage {
		return continueFinal(out, msgs.AsList())
	}
	return out, nil
}

// decodeInputs converts and checks the client's messages and tools (tools is None when absent).
func (t *Template) decodeInputs(messages json.RawMessage, opts Options) (msgs, tools jinja.Value, err error) {
	size := len(messages) + len(opts.Tools)
	for _, v := range opts.Kwargs {
		size += len(v)
	}
	if size > t.limits.MaxInputBytes {
		return msgs, tools, inputErr("input of %d bytes exceeds the limit of %d", size, t.limits.MaxInputBytes)
	}
	if msgs, err = decodeValue(messages, t.limits.MaxDepth, opts.Validated); err != nil {
		return msgs, tools, inputErr("messages: %v", err)
	}
	if !msgs.IsList() {
		return msgs, tools, inputErr("messages must be a JSON array")
	}
	if n := msgs.AsList().Len(); n > t.limits.MaxMessages {
		return msgs, tools, inputErr("%d messages exceed the limit of %d", n, t.limits.MaxMessages)
	}
	for i, m := range msgs.AsList().Items {
		if !m.IsDict() {
			return msgs, tools, inputErr("messages[%d] must be an object", i)
		}
	}
	tools = jinja.None()
	if len(opts.Tools) > 0 && string(opts.Tools) != "null" {
		if tools, err = decodeValue(opts.Tools, t.limits.MaxDepth, opts.Validated); err != nil {
			return msgs, tools, inputErr("tools: %v", err)
		}
		if !tools.IsList() {
			return msgs, tools, inputErr("tools must be a JSON array")
		}
	}
	return msgs, tools, nil
}

// variables are the template's variables for one render of c.
func (t *Template) variables(c *compiled, msgs, tools jinja.Value, opts Options) (map[string]jinja.Value, error) {
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
		v, err := decodeValue(raw, t.limits.MaxDepth, opts.Validated)
		if err != nil {
			return nil, inputErr("chat template kwarg %q: %v", k, err)
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
	for name, repl := range filterOverrides {
		vars[repl] = overrideFilters[name]
	}
	return vars, nil
}

// Package anthropic translates Anthropic's Messages API to the OpenAI chat completions format the
// workers speak, and the answers back: a Messages request becomes a chat completions body
// (Translate), and a chat answer written to a Writer reaches the client as a Messages answer (one
// JSON message, an event stream translated event by event, or an error in Anthropic's shape).
// What cannot be translated faithfully is refused with a 400 naming the field (docs/messages.md).
package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/state/body"
)

// Kind is the endpoint a request was sent to.
type Kind int

// Messages endpoints.
const (
	// Create is POST /v1/messages: max_tokens is required.
	Create Kind = iota
	// CountTokens is POST /v1/messages/count_tokens: max_tokens is optional and the request is
	// not streamed.
	CountTokens
)

// Request is a Messages request translated to a chat completions body.
type Request struct {
	// Chat is the chat completions body. Its messages reference the client's bytes (text,
	// base64 image data) as segments: they are copied once, by whoever reads them whole.
	Chat *body.Object
	// Model is the requested model (a copy: it outlives the body).
	Model string
	// Stream is the client's stream flag.
	Stream bool
	// StopSequences are the client's stop_sequences: an answer that stopped on one of them has
	// stop_reason stop_sequence.
	StopSequences []string
	// RemoteImage is the path of the first image given by URL (source.type url), "" when none.
	RemoteImage string
}

// inlineMax is the largest value copied into the glue of the translated messages; larger ones
// (base64 image data, long texts) are referenced where the client sent them.
const inlineMax = 4 << 10

// imageTypes are the media types Anthropic accepts for base64 images.
var imageTypes = []string{"image/jpeg", "image/png", "image/gif", "image/webp"}

// Translate parses raw, an Anthropic Messages request body, once and returns the chat completions
// body it means. Every error is an *apierror.Error: a 400 that names the field at fault.
func Translate(raw []byte, kind Kind) (*Request, error) {
	obj, err := body.Parse(raw)
	switch {
	case errors.Is(err, body.ErrInvalidJSON):
		return nil, apierror.BadRequest("invalid_json", "invalid JSON body")
	case err != nil:
		return nil, apierror.BadRequest("invalid_body", "request body must be a JSON object")
	}
	t := translator{kind: kind, req: &Request{}, out: &body.Object{}}
	if err := t.top(obj); err != nil {
		return nil, err
	}
	t.req.Chat = t.out
	return t.req, nil
}

// translator builds one chat body.
type translator struct {
	kind Kind
	req  *Request
	out  *body.Object
	m    segments // the messages array
	// lastRole and lastToolUse describe the final message: a final assistant message without
	// tool calls is continued (Anthropic's prefill).
	lastRole    string
	lastToolUse bool
	toolCalls   int // tool_use blocks so far, for the ids of tool calls that have none
}

// fieldError is the 400 naming field.
func fieldError(field, format string, args ...any) *apierror.Error {
	return apierror.InvalidField(field, "%s: %s", field, fmt.Sprintf(format, args...))
}

// present reports a member that is there and not null.
func present(raw []byte) bool { return len(raw) > 0 && !(len(raw) == 4 && string(raw) == "null") }

// Top-level members, by what the translation does with them.
var (
	// ignoredFields change nothing a worker could honour (prompt caching is the workers' own
	// prefix cache; tiers, regions and speed are Anthropic's).
	ignoredFields = map[string]bool{"cache_control": true, "service_tier": true, "inference_geo": true, "speed": true, "diagnostics": true}
	// refusedFields need Anthropic's servers.
	refusedFields = map[string]string{
		"container":          "containers belong to Anthropic's code execution tool",
		"mcp_servers":        "remote MCP servers are called by Anthropic's servers; declare the tools instead",
		"context_management": "context management (clearing tool results and thinking) is not translated",
	}
)

// top translates the top-level members.
func (t *translator) top(obj *body.Object) error {
	var messages, system, maxTokens, stop, tools, toolChoice []byte
	sampling := map[string][]byte{}
	for _, f := range obj.Fields() {
		v := f.Value
		switch k := f.Key; {
		case k == "model":
			s, err := str(v, "model")
			if err != nil {
				return err
			}
			t.req.Model = strings.Clone(s)
		case k == "messages":
			messages = v
		case k == "system":
			system = v
		case k == "max_tokens":
			maxTokens = v
		case k == "stop_sequences":
			stop = v
		case k == "temperature" || k == "top_p":
			if present(v) && body.KindOf(v) != body.KindNumber {
				return fieldError(k, "must be a number")
			}
			sampling[k] = v
		case k == "top_k":
			if n, err := body.ParseInt(v); present(v) && (err != nil || n < 0) {
				return fieldError(k, "must be a non-negative integer")
			}
			sampling[k] = v
		case k == "stream":
			b, err := boolean(v, "stream")
			if err != nil {
				return err
			}
			if b && t.kind == CountTokens {
				return fieldError("stream", "count_tokens does not stream")
			}
			t.req.Stream = b
		case k == "metadata":
			if err := t.metadata(v); err != nil {
				return err
			}
		case k == "tools":
			tools = v
		case k == "tool_choice":
			toolChoice = v
		case k == "thinking":
			if err := thinking(v); err != nil {
				return err
			}
		case k == "output_config":
			if err := outputConfig(v); err != nil {
				return err
			}
		case ignoredFields[k]:
		case refusedFields[k] != "":
			if present(v) {
				return fieldError(k, "is not supported: %s", refusedFields[k])
			}
		default:
			return fieldError(k, "unknown field")
		}
	}
	if t.req.Model == "" {
		return fieldError("model", "is required")
	}
	if err := t.messages(system, messages); err != nil {
		return err
	}
	t.out.Set("model", mustString(t.req.Model))
	t.out.SetSegments("messages", t.m.done()...)
	if err := t.maxTokens(maxTokens); err != nil {
		return err
	}
	for _, k := range []string{"temperature", "top_p", "top_k"} {
		if v := sampling[k]; present(v) {
			t.out.Set(k, v)
		}
	}
	if err := t.stop(stop); err != nil {
		return err
	}
	if t.req.Stream {
		t.out.Set("stream", json.RawMessage("true"))
		// The answer's usage is what message_delta reports.
		t.out.Set("stream_options", json.RawMessage(`{"include_usage":true}`))
	}
	if err := t.tools(tools); err != nil {
		return err
	}
	if err := t.toolChoice(toolChoice); err != nil {
		return err
	}
	if t.lastRole == "assistant" && !t.lastToolUse {
		// Anthropic continues a final assistant message (prefill); vLLM does so with these.
		t.out.Set("continue_final_message", json.RawMessage("true"))
		t.out.Set("add_generation_prompt", json.RawMessage("false"))
	}
	return nil
}

func (t *translator) maxTokens(v []byte) error {
	if !present(v) {
		if t.kind == Create {
			return fieldError("max_tokens", "is required")
		}
		return nil
	}
	n, err := body.ParseInt(v)
	if err != nil || n < 1 {
		return fieldError("max_tokens", "must be a positive integer")
	}
	if t.kind == Create {
		t.out.Set("max_tokens", v)
	}
	return nil
}

func (t *translator) stop(v []byte) error {
	if !present(v) {
		return nil
	}
	items, err := array(v, "stop_sequences")
	if err != nil {
		return err
	}
	for i, it := range items {
		s, err := str(it, fmt.Sprintf("stop_sequences[%d]", i))
		if err != nil {
			return err
		}
		t.req.StopSequences = append(t.req.StopSequences, strings.Clone(s))
	}
	if len(items) > 0 && t.kind == Create {
		t.out.Set("stop", v)
	}
	return nil
}

func (t *translator) metadata(v []byte) error {
	if !present(v) {
		return nil
	}
	o, err := object(v, "metadata")
	if err != nil {
		return err
	}
	raw, _ := o.Get("user_id")
	if !present(raw) {
		return nil
	}
	if body.KindOf(raw) != body.KindString {
		return fieldError("metadata.user_id", "must be a string")
	}
	t.out.Set("user", raw)
	return nil
}

// thinking accepts only disabled thinking: the workers' reasoning output has no signature a
// client could send back, and a budget has no chat equivalent.
func thinking(v []byte) error {
	if !present(v) {
		return nil
	}
	o, err := object(v, "thinking")
	if err != nil {
		return err
	}
	typ, _, err := o.String("type")
	if err != nil {
		return fieldError("thinking.type", "must be a string")
	}
	if typ != "disabled" {
		return fieldError("thinking", "extended thinking (type %q) is not supported: the workers' reasoning cannot be returned as signed thinking blocks; use {\"type\":\"disabled\"} or leave it out", truncate(typ))
	}
	return nil
}

// outputConfig accepts effort (a hint without a chat equivalent, ignored) and refuses a
// structured output format.
func outputConfig(v []byte) error {
	if !present(v) {
		return nil
	}
	o, err := object(v, "output_config")
	if err != nil {
		return err
	}
	if raw, _ := o.Get("format"); present(raw) {
		return fieldError("output_config.format", "structured outputs are not supported")
	}
	return nil
}

// messages translates system and messages into the chat messages array.
func (t *translator) messages(system, messages []byte) error {
	if !present(messages) {
		return fieldError("messages", "is required")
	}
	items, err := array(messages, "messages")
	if err != nil {
		return err
	}
	if len(items) == 0 {
		return fieldError("messages", "must not be empty")
	}
	t.m.glue = make([]byte, 0, 64*len(items)+256)
	t.m.add("[")
	first := true
	if err := t.system(system, &first); err != nil {
		return err
	}
	for i, it := range items {
		if err := t.message(it, i, &first); err != nil {
			return err
		}
	}
	t.m.add("]")
	return nil
}

// sep writes the comma between messages.
func (t *translator) sep(first *bool) {
	if !*first {
		t.m.add(",")
	}
	*first = false
}

func (t *translator) system(v []byte, first *bool) error {
	switch body.KindOf(v) {
	case body.KindNone, body.KindNull:
		return nil
	case body.KindString:
		t.sep(first)
		t.m.add(`{"role":"system","content":`)
		t.m.ref(v)
		t.m.add("}")
		return nil
	case body.KindArray:
	default:
		return fieldError("system", "must be a string or an array of text blocks")
	}
	items, _ := body.Array(v)
	if len(items) == 0 {
		return nil
	}
	t.sep(first)
	t.m.add(`{"role":"system","content":[`)
	for i, it := range items {
		path := fmt.Sprintf("system[%d]", i)
		o, err := object(it, path)
		if err != nil {
			return err
		}
		typ, err := blockType(o, path)
		if err != nil {
			return err
		}
		if typ != "text" {
			return fieldError(path+".type", "system blocks must be text blocks, got %q", truncate(typ))
		}
		text, err := textOf(o, path)
		if err != nil {
			return err
		}
		if i > 0 {
			t.m.add(",")
		}
		t.textPart(text)
	}
	t.m.add("]}")
	return nil
}

// block is one content block of a message, reduced to what the chat message needs.
type block struct {
	kind     string // text, image, tool_use, tool_result
	text     []byte // text: the raw JSON string
	image    image
	id, name []byte // tool_use, tool_result: raw JSON strings
	input    []byte // tool_use: the raw input object
	content  []byte // tool_result: the raw content (string or array), nil when absent
	path     string // tool_result: the block's path, for its nested errors
}

// image is an image block's source: a base64 media type and data, or a URL.
type image struct {
	mediaType string
	data      []byte // the raw JSON string of the base64 data
	url       []byte // the raw JSON string of the URL
}

func (t *translator) message(raw []byte, i int, first *bool) error {
	path := fmt.Sprintf("messages[%d]", i)
	o, err := object(raw, path)
	if err != nil {
		return err
	}
	role, _, err := o.String("role")
	switch {
	case err != nil:
		return fieldError(path+".role", "must be a string")
	case role != "user" && role != "assistant":
		return fieldError(path+".role", "must be user or assistant, got %q", truncate(role))
	}
	content, _ := o.Get("content")
	t.lastRole, t.lastToolUse = role, false
	switch body.KindOf(content) {
	case body.KindString:
		t.sep(first)
		t.m.add(`{"role":"` + role + `","content":`)
		t.m.ref(content)
		t.m.add("}")
		return nil
	case body.KindArray:
	case body.KindNone, body.KindNull:
		return fieldError(path+".content", "is required")
	default:
		return fieldError(path+".content", "must be a string or an array of content blocks")
	}
	items, _ := body.Array(content)
	blocks := make([]block, 0, len(items))
	for j, it := range items {
		b, err := t.block(it, role, fmt.Sprintf("%s.content[%d]", path, j))
		if err != nil {
			return err
		}
		blocks = append(blocks, b)
	}
	if role == "assistant" {
		t.assistant(blocks, first)
		return nil
	}
	return t.user(blocks, first)
}

// Content block types that are refused, and why.
var refusedBlocks = map[string]string{
	"document":                               "document blocks (PDF, text and content sources) are not supported: the workers take text and images",
	"search_result":                          "search result blocks are not supported",
	"thinking":                               "thinking blocks are not supported: the workers cannot verify their signatures",
	"redacted_thinking":                      "redacted thinking blocks are not supported: the workers cannot decrypt them",
	"server_tool_use":                        "server tools run on Anthropic's servers",
	"web_search_tool_result":                 "server tools run on Anthropic's servers",
	"web_fetch_tool_result":                  "server tools run on Anthropic's servers",
	"code_execution_tool_result":             "server tools run on Anthropic's servers",
	"bash_code_execution_tool_result":        "server tools run on Anthropic's servers",
	"text_editor_code_execution_tool_result": "server tools run on Anthropic's servers",
	"tool_search_tool_result":                "server tools run on Anthropic's servers",
	"mcp_tool_use":                           "remote MCP servers are called by Anthropic's servers",
	"mcp_tool_result":                        "remote MCP servers are called by Anthropic's servers",
	"container_upload":                       "containers belong to Anthropic's code execution tool",
}

// block reads one content block of a message of role.
func (t *translator) block(raw []byte, role, path string) (block, error) {
	o, err := object(raw, path)
	if err != nil {
		return block{}, err
	}
	typ, err := blockType(o, path)
	if err != nil {
		return block{}, err
	}
	switch typ {
	case "text":
		text, err := textOf(o, path)
		return block{kind: typ, text: text}, err
	case "image":
		if role != "user" {
			return block{}, fieldError(path+".type", "images are only accepted in user messages")
		}
		im, err := t.image(o, path)
		return block{kind: typ, image: im}, err
	case "tool_use":
		if role != "assistant" {
			return block{}, fieldError(path+".type", "tool_use blocks are only accepted in assistant messages")
		}
		return t.toolUse(o, path)
	case "tool_result":
		if role != "user" {
			return block{}, fieldError(path+".type", "tool_result blocks are only accepted in user messages")
		}
		id, err := rawString(o, "tool_use_id", path)
		if err != nil {
			return block{}, err
		}
		content, _ := o.Get("content")
		if !present(content) {
			content = nil
		} else if k := body.KindOf(content); k != body.KindString && k != body.KindArray {
			return block{}, fieldError(path+".content", "must be a string or an array of text and image blocks")
		}
		if raw, _ := o.Get("is_error"); present(raw) && body.KindOf(raw) != body.KindBool {
			return block{}, fieldError(path+".is_error", "must be a boolean")
		}
		return block{kind: typ, id: id, content: content, path: path}, nil
	}
	if why, ok := refusedBlocks[typ]; ok {
		return block{}, fieldError(path+".type", "%s", why)
	}
	return block{}, fieldError(path+".type", "unknown content block type %q", truncate(typ))
}

func (t *translator) image(o *body.Object, path string) (image, error) {
	src, ok := o.Get("source")
	if !ok || !present(src) {
		return image{}, fieldError(path+".source", "is required")
	}
	s, err := object(src, path+".source")
	if err != nil {
		return image{}, err
	}
	typ, _, err := s.String("type")
	if err != nil {
		return image{}, fieldError(path+".source.type", "must be a string")
	}
	switch typ {
	case "base64":
		mt, _, err := s.String("media_type")
		if err != nil {
			return image{}, fieldError(path+".source.media_type", "must be a string")
		}
		var known string
		for _, it := range imageTypes {
			if mt == it {
				known = it
			}
		}
		if known == "" {
			return image{}, fieldError(path+".source.media_type", "must be one of %s, got %q", strings.Join(imageTypes, ", "), truncate(mt))
		}
		data, err := rawString(s, "data", path+".source")
		if err != nil {
			return image{}, err
		}
		if len(data) == 2 {
			return image{}, fieldError(path+".source.data", "must not be empty")
		}
		return image{mediaType: known, data: data}, nil
	case "url":
		u, err := rawString(s, "url", path+".source")
		if err != nil {
			return image{}, err
		}
		if len(u) == 2 {
			return image{}, fieldError(path+".source.url", "must not be empty")
		}
		if t.req.RemoteImage == "" {
			t.req.RemoteImage = path + ".source.url"
		}
		return image{url: u}, nil
	case "file":
		return image{}, fieldError(path+".source.type", "file sources (the Files API) are not supported: send the image as base64 or a URL")
	}
	return image{}, fieldError(path+".source.type", "must be base64 or url, got %q", truncate(typ))
}

func (t *translator) toolUse(o *body.Object, path string) (block, error) {
	id, err := rawString(o, "id", path)
	if err != nil {
		return block{}, err
	}
	name, err := rawString(o, "name", path)
	if err != nil {
		return block{}, err
	}
	input, _ := o.Get("input")
	if body.KindOf(input) != body.KindObject {
		return block{}, fieldError(path+".input", "must be an object")
	}
	t.toolCalls++
	return block{kind: "tool_use", id: id, name: name, input: input}, nil
}

// assistant writes an assistant message: its text blocks as the content (one block as a string),
// its tool_use blocks as tool_calls.
func (t *translator) assistant(blocks []block, first *bool) {
	var texts, calls int
	for _, b := range blocks {
		switch b.kind {
		case "text":
			texts++
		case "tool_use":
			calls++
		}
	}
	t.lastToolUse = calls > 0
	t.sep(first)
	t.m.add(`{"role":"assistant","content":`)
	switch {
	case texts == 0 && calls > 0:
		t.m.add("null")
	case texts == 0:
		t.m.add(`""`)
	case texts == 1:
		for _, b := range blocks {
			if b.kind == "text" {
				t.m.ref(b.text)
			}
		}
	default:
		t.m.add("[")
		n := 0
		for _, b := range blocks {
			if b.kind == "text" {
				if n > 0 {
					t.m.add(",")
				}
				t.textPart(b.text)
				n++
			}
		}
		t.m.add("]")
	}
	if calls > 0 {
		t.m.add(`,"tool_calls":[`)
		n := 0
		for _, b := range blocks {
			if b.kind != "tool_use" {
				continue
			}
			if n > 0 {
				t.m.add(",")
			}
			t.m.add(`{"id":`)
			t.m.ref(b.id)
			t.m.add(`,"type":"function","function":{"name":`)
			t.m.ref(b.name)
			t.m.add(`,"arguments":`)
			t.m.quote(b.input)
			t.m.add("}}")
			n++
		}
		t.m.add("]")
	}
	t.m.add("}")
}

// user writes a user message: its tool_result blocks first, as tool messages (which must follow
// the assistant's tool calls), then one user message with the other blocks and the images the
// tool results held (a tool message carries text only).
func (t *translator) user(blocks []block, first *bool) error {
	var rest []block
	results := 0
	for _, b := range blocks {
		if b.kind != "tool_result" {
			rest = append(rest, b)
			continue
		}
		results++
		images, err := t.toolResult(b, first)
		if err != nil {
			return err
		}
		rest = append(rest, images...)
	}
	if results > 0 && len(rest) == 0 {
		return nil
	}
	t.sep(first)
	t.m.add(`{"role":"user","content":[`)
	for i, b := range rest {
		if i > 0 {
			t.m.add(",")
		}
		if b.kind == "text" {
			t.textPart(b.text)
			continue
		}
		t.imagePart(b.image)
	}
	t.m.add("]}")
	return nil
}

// toolResult writes one tool message and returns the image blocks of its content.
func (t *translator) toolResult(b block, first *bool) ([]block, error) {
	t.sep(first)
	t.m.add(`{"role":"tool","tool_call_id":`)
	t.m.ref(b.id)
	t.m.add(`,"content":`)
	switch body.KindOf(b.content) {
	case body.KindNone:
		t.m.add(`""}`)
		return nil, nil
	case body.KindString:
		t.m.ref(b.content)
		t.m.add("}")
		return nil, nil
	}
	items, _ := body.Array(b.content)
	var texts, images []block
	for k, it := range items {
		path := fmt.Sprintf("%s.content[%d]", b.path, k)
		o, err := object(it, path)
		if err != nil {
			return nil, err
		}
		typ, err := blockType(o, path)
		if err != nil {
			return nil, err
		}
		switch typ {
		case "text":
			text, err := textOf(o, path)
			if err != nil {
				return nil, err
			}
			texts = append(texts, block{kind: typ, text: text})
		case "image":
			im, err := t.image(o, path)
			if err != nil {
				return nil, err
			}
			images = append(images, block{kind: typ, image: im})
		default:
			if why, ok := refusedBlocks[typ]; ok {
				return nil, fieldError(path+".type", "%s", why)
			}
			return nil, fieldError(path+".type", "tool results hold text and image blocks, got %q", truncate(typ))
		}
	}
	if len(texts) == 0 {
		t.m.add(`""}`)
		return images, nil
	}
	t.m.add("[")
	for i, tb := range texts {
		if i > 0 {
			t.m.add(",")
		}
		t.textPart(tb.text)
	}
	t.m.add("]}")
	return images, nil
}

// textPart writes a chat text part of text, a raw JSON string.
func (t *translator) textPart(text []byte) {
	t.m.add(`{"type":"text","text":`)
	t.m.ref(text)
	t.m.add("}")
}

// imagePart writes a chat image_url part: a data: URL for base64 data (the client's bytes,
// referenced), the URL itself otherwise (the media guard downloads it).
func (t *translator) imagePart(im image) {
	t.m.add(`{"type":"image_url","image_url":{"url":`)
	if im.url != nil {
		t.m.ref(im.url)
		t.m.add("}}")
		return
	}
	t.m.add(`"data:` + im.mediaType + `;base64,`)
	inner := im.data[1 : len(im.data)-1]
	if bytes.IndexByte(inner, '\\') >= 0 {
		// Escaped base64 (e.g. \/): decoded once; base64 needs no escapes then.
		var s string
		_ = json.Unmarshal(im.data, &s) // validated JSON
		inner = []byte(s)
		t.m.quoteInner(inner)
	} else {
		t.m.ref(inner)
	}
	t.m.add(`"}}`)
}

// tools translates the client tools into function tools.
func (t *translator) tools(v []byte) error {
	if !present(v) {
		return nil
	}
	items, err := array(v, "tools")
	if err != nil {
		return err
	}
	if len(items) == 0 {
		return nil
	}
	out := make([]byte, 0, len(v)+64*len(items))
	out = append(out, '[')
	for i, it := range items {
		path := fmt.Sprintf("tools[%d]", i)
		o, err := object(it, path)
		if err != nil {
			return err
		}
		typ, _, err := o.String("type")
		if err != nil {
			return fieldError(path+".type", "must be a string")
		}
		if typ != "" && typ != "custom" {
			return fieldError(path+".type", "server tools (%q) run on Anthropic's servers and are not supported; declare client tools with a name and an input_schema", truncate(typ))
		}
		name, err := rawString(o, "name", path)
		if err != nil {
			return err
		}
		schema, _ := o.Get("input_schema")
		if body.KindOf(schema) != body.KindObject {
			return fieldError(path+".input_schema", "must be an object (a JSON Schema)")
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"type":"function","function":{"name":`...)
		out = append(out, name...)
		if d, _ := o.Get("description"); present(d) {
			if body.KindOf(d) != body.KindString {
				return fieldError(path+".description", "must be a string")
			}
			out = append(append(out, `,"description":`...), d...)
		}
		out = append(append(out, `,"parameters":`...), schema...)
		if s, _ := o.Get("strict"); present(s) {
			if body.KindOf(s) != body.KindBool {
				return fieldError(path+".strict", "must be a boolean")
			}
			out = append(append(out, `,"strict":`...), s...)
		}
		out = append(out, "}}"...)
	}
	t.out.Set("tools", append(out, ']'))
	return nil
}

// toolChoice maps auto, any, tool and none to auto, required, the named function and none.
func (t *translator) toolChoice(v []byte) error {
	if !present(v) {
		return nil
	}
	o, err := object(v, "tool_choice")
	if err != nil {
		return err
	}
	typ, _, err := o.String("type")
	if err != nil {
		return fieldError("tool_choice.type", "must be a string")
	}
	switch typ {
	case "auto":
		t.out.Set("tool_choice", json.RawMessage(`"auto"`))
	case "any":
		t.out.Set("tool_choice", json.RawMessage(`"required"`))
	case "none":
		t.out.Set("tool_choice", json.RawMessage(`"none"`))
	case "tool":
		name, err := rawString(o, "name", "tool_choice")
		if err != nil {
			return err
		}
		t.out.Set("tool_choice", json.RawMessage(`{"type":"function","function":{"name":`+string(name)+`}}`))
	default:
		return fieldError("tool_choice.type", "must be auto, any, tool or none, got %q", truncate(typ))
	}
	raw, _ := o.Get("disable_parallel_tool_use")
	if present(raw) {
		b, err := boolean(raw, "tool_choice.disable_parallel_tool_use")
		if err != nil {
			return err
		}
		if b {
			t.out.Set("parallel_tool_calls", json.RawMessage("false"))
		}
	}
	return nil
}

// Typed access with errors naming the field.

func object(raw []byte, path string) (*body.Object, error) {
	if body.KindOf(raw) != body.KindObject {
		return nil, fieldError(path, "must be an object")
	}
	o, err := body.ParseNested(raw)
	if err != nil {
		return nil, fieldError(path, "must be an object")
	}
	return o, nil
}

func array(raw []byte, path string) ([]json.RawMessage, error) {
	if body.KindOf(raw) != body.KindArray {
		return nil, fieldError(path, "must be an array")
	}
	items, err := body.Array(raw)
	if err != nil {
		return nil, fieldError(path, "must be an array")
	}
	return items, nil
}

func str(raw []byte, path string) (string, error) {
	if !present(raw) {
		return "", nil
	}
	if body.KindOf(raw) != body.KindString {
		return "", fieldError(path, "must be a string")
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : len(raw)-1]), nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fieldError(path, "must be a string")
	}
	return s, nil
}

func boolean(raw []byte, path string) (bool, error) {
	switch string(raw) {
	case "", "null", "false":
		return false, nil
	case "true":
		return true, nil
	}
	return false, fieldError(path, "must be a boolean")
}

// rawString returns the raw JSON string of o's required member key.
func rawString(o *body.Object, key, path string) ([]byte, error) {
	raw, _ := o.Get(key)
	switch body.KindOf(raw) {
	case body.KindString:
		return raw, nil
	case body.KindNone, body.KindNull:
		return nil, fieldError(path+"."+key, "is required")
	}
	return nil, fieldError(path+"."+key, "must be a string")
}

func blockType(o *body.Object, path string) (string, error) {
	typ, ok, err := o.String("type")
	switch {
	case err != nil:
		return "", fieldError(path+".type", "must be a string")
	case !ok:
		return "", fieldError(path+".type", "is required")
	}
	return typ, nil
}

func textOf(o *body.Object, path string) ([]byte, error) { return rawString(o, "text", path) }

// mustString is s as a JSON string.
func mustString(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// truncate bounds a client value quoted in a message.
func truncate(s string) string {
	if len(s) <= 64 {
		return s
	}
	cut := 64
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// segments is a JSON value built from small glue bytes and references to large client values,
// which are never copied here.
type segments struct {
	glue  []byte
	out   [][]byte
	start int // where the glue not yet in out starts
}

func (s *segments) add(b string) { s.glue = append(s.glue, b...) }

// ref appends v: copied into the glue when small, referenced otherwise.
func (s *segments) ref(v []byte) {
	if len(v) <= inlineMax {
		s.glue = append(s.glue, v...)
		return
	}
	s.cut()
	s.out = append(s.out, v)
}

// cut ends the current run of glue as a segment. Later appends may move the glue: the segments
// cut before keep the bytes they saw.
func (s *segments) cut() {
	if len(s.glue) > s.start {
		s.out = append(s.out, s.glue[s.start:len(s.glue):len(s.glue)])
	}
	s.start = len(s.glue)
}

// quote appends raw JSON as a JSON string.
func (s *segments) quote(v []byte) {
	s.glue = append(s.glue, '"')
	s.quoteInner(v)
	s.glue = append(s.glue, '"')
}

// quoteInner appends v escaped as the inside of a JSON string.
func (s *segments) quoteInner(v []byte) {
	s.glue = body.AppendEscaped(s.glue, v)
}

func (s *segments) done() [][]byte {
	s.cut()
	return s.out
}

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
// body it means. Every error is an *apierror.Error: a 400 that names the field at fault, or,
// past maxBlocks content blocks (server.max_content_blocks; 0: no bound), the first block over.
func Translate(raw []byte, kind Kind, maxBlocks int) (*Request, error) {
	obj, err := body.Parse(raw)
	switch {
	case errors.Is(err, body.ErrInvalidJSON):
		return nil, apierror.BadRequest("invalid_json", "invalid JSON body")
	case err != nil:
		return nil, apierror.BadRequest("invalid_body", "request body must be a JSON object")
	}
	t := translator{kind: kind, req: &Request{}, out: &body.Object{}, maxBlocks: maxBlocks}
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
	// blocks are the content blocks read so far, at most maxBlocks.
	blocks, maxBlocks int
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
	if body.KindOf(messages) != body.KindArray {
		return fieldError("messages", "must be an array")
	}
	empty := true
	for range body.Elements(messages) {
		empty = false
		break
	}
	if empty {
		return fieldError("messages", "must not be empty")
	}
	t.m.glue = make([]byte, 0, min(len(messages), 64<<10)+256)
	t.m.add("[")
	first := true
	if err := t.system(system, &first); err != nil {
		return err
	}
	i := 0
	for it := range body.Elements(messages) {
		if err := t.message(it, i, &first); err != nil {
			return err
		}
		i++
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

// count counts one more content block, at a, against server.max_content_blocks: the request is
// refused at the first block over it, before any more is read.
func (t *translator) count(a at) error {
	if t.blocks++; t.maxBlocks > 0 && t.blocks > t.maxBlocks {
		return fieldError(a.String(), "more than %d content blocks in the request (server.max_content_blocks)", t.maxBlocks)
	}
	return nil
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
	i := 0
	for it := range body.Elements(v) {
		a := at{top: "system", i: i, blk: -1, sub: -1}
		if err := t.count(a); err != nil {
			return err
		}
		f, err := fieldsOf(it, a)
		if err != nil {
			return err
		}
		typ, err := f.kind(a)
		if err != nil {
			return err
		}
		if typ != "text" {
			return fieldError(a.field("type"), "system blocks must be text blocks, got %q", truncate(typ))
		}
		text, err := need(f.text, a, "text")
		if err != nil {
			return err
		}
		if i == 0 {
			t.sep(first)
			t.m.add(`{"role":"system","content":[`)
		} else {
			t.m.add(",")
		}
		t.textPart(text)
		i++
	}
	if i > 0 {
		t.m.add("]}")
	}
	return nil
}

// at is where a value is in the request: top[i] (system, messages, tools), then .content[blk]
// and, in a tool_result, .content[sub] (-1: none). It is spelled out only for an error, so that
// a block costs no path.
type at struct {
	top         string
	i, blk, sub int
}

func (a at) String() string {
	b := fmt.Appendf(nil, "%s[%d]", a.top, a.i)
	if a.blk >= 0 {
		b = fmt.Appendf(b, ".content[%d]", a.blk)
	}
	if a.sub >= 0 {
		b = fmt.Appendf(b, ".content[%d]", a.sub)
	}
	return string(b)
}

// field is the path of a's member key.
func (a at) field(key string) string { return a.String() + "." + key }

// fields are the members of a content block, or of an image's source, that the translation
// reads: raw values, nil when absent (the last of duplicates, as body.Object keeps).
type fields struct {
	typ, text, source, id, name, input, content, isError, mediaType, data, url []byte
}

// members reads the members of raw, a content block (or a source) already checked.
func members(raw []byte) fields {
	var f fields
	for k, v := range body.Members(raw) {
		switch k {
		case "type":
			f.typ = v
		case "text":
			f.text = v
		case "source":
			f.source = v
		case "id":
			f.id = v
		case "tool_use_id":
			f.id = v
		case "name":
			f.name = v
		case "input":
			f.input = v
		case "content":
			f.content = v
		case "is_error":
			f.isError = v
		case "media_type":
			f.mediaType = v
		case "data":
			f.data = v
		case "url":
			f.url = v
		}
	}
	return f
}

// fieldsOf reads the members of raw, the content block at a: an error when it is not an object.
func fieldsOf(raw []byte, a at) (fields, error) {
	if body.KindOf(raw) != body.KindObject {
		return fields{}, fieldError(a.String(), "must be an object")
	}
	return members(raw), nil
}

// kind is the block's type (required, a string); it shares the body's memory.
func (f *fields) kind(a at) (string, error) {
	typ, ok, err := body.StringOf(f.typ)
	switch {
	case err != nil:
		return "", fieldError(a.field("type"), "must be a string")
	case !ok:
		return "", fieldError(a.field("type"), "is required")
	}
	return typ, nil
}

// is reports a block of type typ (one already checked).
func (f *fields) is(typ string) bool {
	s, _, _ := body.StringOf(f.typ)
	return s == typ
}

// need returns raw, the required member key of the value at a, as a raw JSON string.
func need(raw []byte, a at, key string) ([]byte, error) {
	switch body.KindOf(raw) {
	case body.KindString:
		return raw, nil
	case body.KindNone, body.KindNull:
		return nil, fieldError(a.field(key), "is required")
	}
	return nil, fieldError(a.field(key), "must be a string")
}

// tally is what a message's content blocks hold: text, tool_use and tool_result blocks, and the
// parts of a user message (its text and image blocks, and the images its tool results hold).
type tally struct{ texts, calls, results, parts int }

// image is an image block's source: a base64 media type and data, or a URL.
type image struct {
	mediaType string
	data      []byte // the raw JSON string of the base64 data
	url       []byte // the raw JSON string of the URL
}

// Roles of the messages, as the chat messages carry them.
const (
	roleUser      = "user"
	roleAssistant = "assistant"
)

func (t *translator) message(raw []byte, i int, first *bool) error {
	a := at{top: "messages", i: i, blk: -1, sub: -1}
	if body.KindOf(raw) != body.KindObject {
		return fieldError(a.String(), "must be an object")
	}
	var roleRaw, content []byte
	for k, v := range body.Members(raw) {
		switch k {
		case "role":
			roleRaw = v
		case "content":
			content = v
		}
	}
	role, _, err := body.StringOf(roleRaw)
	switch {
	case err != nil:
		return fieldError(a.field("role"), "must be a string")
	case role == roleUser:
		role = roleUser
	case role == roleAssistant:
		role = roleAssistant
	default:
		return fieldError(a.field("role"), "must be user or assistant, got %q", truncate(role))
	}
	t.lastRole, t.lastToolUse = role, false
	switch body.KindOf(content) {
	case body.KindString:
		t.sep(first)
		t.m.add(`{"role":"`)
		t.m.add(role)
		t.m.add(`","content":`)
		t.m.ref(content)
		t.m.add("}")
		return nil
	case body.KindArray:
	case body.KindNone, body.KindNull:
		return fieldError(a.field("content"), "is required")
	default:
		return fieldError(a.field("content"), "must be a string or an array of content blocks")
	}
	n, err := t.check(content, role, a)
	if err != nil {
		return err
	}
	if role == roleAssistant {
		t.assistant(content, n, first)
		return nil
	}
	t.user(content, n, first)
	return nil
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

// check reads the content blocks of a message of role, at a, counting each against
// server.max_content_blocks, and returns what they hold: the message is written (assistant,
// user) only once all its blocks are known to be right.
func (t *translator) check(content []byte, role string, a at) (tally, error) {
	var n tally
	j := 0
	for it := range body.Elements(content) {
		b := a
		b.blk = j
		j++
		if err := t.count(b); err != nil {
			return n, err
		}
		f, err := fieldsOf(it, b)
		if err != nil {
			return n, err
		}
		typ, err := f.kind(b)
		if err != nil {
			return n, err
		}
		switch typ {
		case "text":
			_, err = need(f.text, b, "text")
			n.texts++
			n.parts++
		case "image":
			if role != roleUser {
				return n, fieldError(b.field("type"), "images are only accepted in user messages")
			}
			_, err = t.image(f.source, b)
			n.parts++
		case "tool_use":
			if role != roleAssistant {
				return n, fieldError(b.field("type"), "tool_use blocks are only accepted in assistant messages")
			}
			err = toolUse(&f, b)
			n.calls++
		case "tool_result":
			if role != roleUser {
				return n, fieldError(b.field("type"), "tool_result blocks are only accepted in user messages")
			}
			var images int
			images, err = t.toolResultImages(&f, b)
			n.results++
			n.parts += images
		default:
			if why, ok := refusedBlocks[typ]; ok {
				return n, fieldError(b.field("type"), "%s", why)
			}
			return n, fieldError(b.field("type"), "unknown content block type %q", truncate(typ))
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// toolResultImages checks a tool_result block, at a, and its content blocks (counted), and
// returns how many images it holds.
func (t *translator) toolResultImages(f *fields, a at) (int, error) {
	if _, err := need(f.id, a, "tool_use_id"); err != nil {
		return 0, err
	}
	switch body.KindOf(f.content) {
	case body.KindNone, body.KindNull, body.KindString, body.KindArray:
	default:
		return 0, fieldError(a.field("content"), "must be a string or an array of text and image blocks")
	}
	if present(f.isError) && body.KindOf(f.isError) != body.KindBool {
		return 0, fieldError(a.field("is_error"), "must be a boolean")
	}
	images, k := 0, 0
	for it := range body.Elements(f.content) {
		s := a
		s.sub = k
		k++
		if err := t.count(s); err != nil {
			return 0, err
		}
		g, err := fieldsOf(it, s)
		if err != nil {
			return 0, err
		}
		typ, err := g.kind(s)
		if err != nil {
			return 0, err
		}
		switch typ {
		case "text":
			_, err = need(g.text, s, "text")
		case "image":
			_, err = t.image(g.source, s)
			images++
		default:
			if why, ok := refusedBlocks[typ]; ok {
				return 0, fieldError(s.field("type"), "%s", why)
			}
			return 0, fieldError(s.field("type"), "tool results hold text and image blocks, got %q", truncate(typ))
		}
		if err != nil {
			return 0, err
		}
	}
	return images, nil
}

// image reads the source of the image block at a.
func (t *translator) image(src []byte, a at) (image, error) {
	if !present(src) {
		return image{}, fieldError(a.field("source"), "is required")
	}
	if body.KindOf(src) != body.KindObject {
		return image{}, fieldError(a.field("source"), "must be an object")
	}
	s := members(src)
	typ, _, err := body.StringOf(s.typ)
	if err != nil {
		return image{}, fieldError(a.field("source.type"), "must be a string")
	}
	switch typ {
	case "base64":
		mt, _, err := body.StringOf(s.mediaType)
		if err != nil {
			return image{}, fieldError(a.field("source.media_type"), "must be a string")
		}
		var known string
		for _, it := range imageTypes {
			if mt == it {
				known = it
			}
		}
		if known == "" {
			return image{}, fieldError(a.field("source.media_type"), "must be one of %s, got %q", strings.Join(imageTypes, ", "), truncate(mt))
		}
		data, err := need(s.data, a, "source.data")
		if err != nil {
			return image{}, err
		}
		if len(data) == 2 {
			return image{}, fieldError(a.field("source.data"), "must not be empty")
		}
		return image{mediaType: known, data: data}, nil
	case "url":
		u, err := need(s.url, a, "source.url")
		if err != nil {
			return image{}, err
		}
		if len(u) == 2 {
			return image{}, fieldError(a.field("source.url"), "must not be empty")
		}
		if t.req.RemoteImage == "" {
			t.req.RemoteImage = a.field("source.url")
		}
		return image{url: u}, nil
	case "file":
		return image{}, fieldError(a.field("source.type"), "file sources (the Files API) are not supported: send the image as base64 or a URL")
	}
	return image{}, fieldError(a.field("source.type"), "must be base64 or url, got %q", truncate(typ))
}

// toolUse checks a tool_use block, at a.
func toolUse(f *fields, a at) error {
	if _, err := need(f.id, a, "id"); err != nil {
		return err
	}
	if _, err := need(f.name, a, "name"); err != nil {
		return err
	}
	if body.KindOf(f.input) != body.KindObject {
		return fieldError(a.field("input"), "must be an object")
	}
	return nil
}

// assistant writes an assistant message of content, blocks n tallied: its text blocks as the
// content (one block as a string), its tool_use blocks as tool_calls.
func (t *translator) assistant(content []byte, n tally, first *bool) {
	t.lastToolUse = n.calls > 0
	t.sep(first)
	t.m.add(`{"role":"assistant","content":`)
	switch {
	case n.texts == 0 && n.calls > 0:
		t.m.add("null")
	case n.texts == 0:
		t.m.add(`""`)
	case n.texts == 1:
		for it := range body.Elements(content) {
			if f := members(it); f.is("text") {
				t.m.ref(f.text)
			}
		}
	default:
		t.m.add("[")
		k := 0
		for it := range body.Elements(content) {
			if f := members(it); f.is("text") {
				if k > 0 {
					t.m.add(",")
				}
				t.textPart(f.text)
				k++
			}
		}
		t.m.add("]")
	}
	if n.calls > 0 {
		t.m.add(`,"tool_calls":[`)
		k := 0
		for it := range body.Elements(content) {
			f := members(it)
			if !f.is("tool_use") {
				continue
			}
			if k > 0 {
				t.m.add(",")
			}
			t.m.add(`{"id":`)
			t.m.ref(f.id)
			t.m.add(`,"type":"function","function":{"name":`)
			t.m.ref(f.name)
			t.m.add(`,"arguments":`)
			t.m.quote(f.input)
			t.m.add("}}")
			k++
		}
		t.m.add("]")
	}
	t.m.add("}")
}

// user writes a user message of content, blocks n tallied: its tool_result blocks first, as
// tool messages (which must follow the assistant's tool calls), then one user message with the
// other blocks and the images the tool results held (a tool message carries text only).
func (t *translator) user(content []byte, n tally, first *bool) {
	if n.results > 0 {
		for it := range body.Elements(content) {
			if f := members(it); f.is("tool_result") {
				t.toolResult(&f, first)
			}
		}
		if n.parts == 0 {
			return
		}
	}
	t.sep(first)
	t.m.add(`{"role":"user","content":[`)
	k := 0
	part := func() {
		if k > 0 {
			t.m.add(",")
		}
		k++
	}
	for it := range body.Elements(content) {
		f := members(it)
		switch {
		case f.is("text"):
			part()
			t.textPart(f.text)
		case f.is("image"):
			im, _ := t.image(f.source, at{}) // checked
			part()
			t.imagePart(im)
		case f.is("tool_result") && body.KindOf(f.content) == body.KindArray:
			for c := range body.Elements(f.content) {
				if g := members(c); g.is("image") {
					im, _ := t.image(g.source, at{})
					part()
					t.imagePart(im)
				}
			}
		}
	}
	t.m.add("]}")
}

// toolResult writes one tool message: the text of a tool_result block (its images go to the
// user message).
func (t *translator) toolResult(f *fields, first *bool) {
	t.sep(first)
	t.m.add(`{"role":"tool","tool_call_id":`)
	t.m.ref(f.id)
	t.m.add(`,"content":`)
	switch body.KindOf(f.content) {
	case body.KindNone, body.KindNull:
		t.m.add(`""}`)
		return
	case body.KindString:
		t.m.ref(f.content)
		t.m.add("}")
		return
	}
	k := 0
	for c := range body.Elements(f.content) {
		g := members(c)
		if !g.is("text") {
			continue
		}
		if k == 0 {
			t.m.add("[")
		} else {
			t.m.add(",")
		}
		t.textPart(g.text)
		k++
	}
	if k == 0 {
		t.m.add(`""}`)
		return
	}
	t.m.add("]}")
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
	if body.KindOf(v) != body.KindArray {
		return fieldError("tools", "must be an array")
	}
	out := make([]byte, 0, len(v)+64)
	out = append(out, '[')
	i := 0
	for it := range body.Elements(v) {
		a := at{top: "tools", i: i, blk: -1, sub: -1}
		if body.KindOf(it) != body.KindObject {
			return fieldError(a.String(), "must be an object")
		}
		var typRaw, name, schema, desc, strict []byte
		for k, v := range body.Members(it) {
			switch k {
			case "type":
				typRaw = v
			case "name":
				name = v
			case "input_schema":
				schema = v
			case "description":
				desc = v
			case "strict":
				strict = v
			}
		}
		typ, _, err := body.StringOf(typRaw)
		if err != nil {
			return fieldError(a.field("type"), "must be a string")
		}
		if typ != "" && typ != "custom" {
			return fieldError(a.field("type"), "server tools (%q) run on Anthropic's servers and are not supported; declare client tools with a name and an input_schema", truncate(typ))
		}
		if name, err = need(name, a, "name"); err != nil {
			return err
		}
		if body.KindOf(schema) != body.KindObject {
			return fieldError(a.field("input_schema"), "must be an object (a JSON Schema)")
		}
		if i > 0 {
			out = append(out, ',')
		}
		i++
		out = append(out, `{"type":"function","function":{"name":`...)
		out = append(out, name...)
		if present(desc) {
			if body.KindOf(desc) != body.KindString {
				return fieldError(a.field("description"), "must be a string")
			}
			out = append(append(out, `,"description":`...), desc...)
		}
		out = append(append(out, `,"parameters":`...), schema...)
		if present(strict) {
			if body.KindOf(strict) != body.KindBool {
				return fieldError(a.field("strict"), "must be a boolean")
			}
			out = append(append(out, `,"strict":`...), strict...)
		}
		out = append(out, "}}"...)
	}
	if i > 0 {
		t.out.Set("tools", append(out, ']'))
	}
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

func (s *segments) add(b string) {
	s.grow(len(b))
	s.glue = append(s.glue, b...)
}

// grow makes room for n more bytes of glue, doubling it (append's growth of large slices,
// a quarter at a time, would allocate five times the glue over its growth).
func (s *segments) grow(n int) {
	if len(s.glue)+n <= cap(s.glue) {
		return
	}
	glue := make([]byte, len(s.glue), max(2*cap(s.glue), len(s.glue)+n))
	copy(glue, s.glue)
	s.glue = glue
}

// ref appends v: copied into the glue when small, referenced otherwise.
func (s *segments) ref(v []byte) {
	if len(v) <= inlineMax {
		s.grow(len(v))
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

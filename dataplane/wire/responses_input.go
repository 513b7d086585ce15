package wire

// The Responses API's request side, as the coordinator serves it: stateless. checkResponses
// refuses what a stateless proxy cannot honour (a stored conversation, a background run, a stored
// answer, server-side tools) and stateless makes every leg stateless (store: false);
// responsesChat is the request's prompt as the chat messages vLLM builds from it (instructions
// first, message items, function calls and their outputs), the body render tokenizes.

import (
	"bytes"
	"encoding/json"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/state/body"
)

// Stateful members: each names state the coordinator does not keep. A stateless request has
// them absent or null (background and store: false).
var stateful = []struct{ key, why string }{
	{"previous_response_id", "continues a stored response"},
	{"conversation", "continues a stored conversation"},
	{"prompt", "names a stored prompt template"},
}

// Item types of the input the pipeline understands; the others (item_reference, the built-in
// tools' calls) refer to stored state or to tools that run server-side.
var itemTypes = []string{"message", "function_call", "function_call_output", "reasoning"}

// MaxInputItems bounds the input items (and tools) of one request.
const MaxInputItems = 4096

// checkResponses validates the members of a Responses request the pipeline relies on, and refuses the
// stateful ones with a 400 naming the member: the coordinator keeps no responses (a stored
// previous_response_id or conversation may be on any worker, or none), runs nothing in the
// background and answers no later GET of a response. Upstream strips previous_response_id and
// conversation silently (llm-d-router#2934); the coordinator refuses them, since the answer
// would silently lose the conversation it continues.
func checkResponses(obj *body.Object) error {
	for _, s := range stateful {
		if k := obj.Kind(s.key); k != body.KindNone && k != body.KindNull {
			return apierror.InvalidField(s.key, "%q %s, and the coordinator is stateless: send the whole conversation in \"input\"", s.key, s.why)
		}
	}
	for _, key := range []string{"background", "store"} {
		v, _, err := obj.Bool(key)
		if err != nil {
			return apierror.InvalidField(key, "%v", err)
		}
		if v {
			why := "would store the response for a later GET /v1/responses/{id}"
			if key == "background" {
				why = "would run it in the background for a later GET /v1/responses/{id}"
			}
			return apierror.InvalidField(key, "%q: true %s; the coordinator is stateless: send %q: false or leave it out", key, why, key)
		}
	}
	if _, _, err := obj.Int("max_output_tokens"); err != nil {
		return apierror.InvalidField("max_output_tokens", "%v", err)
	}
	if _, _, err := obj.String("instructions"); err != nil {
		return apierror.InvalidField("instructions", "%v", err)
	}
	if err := checkTools(obj); err != nil {
		return err
	}
	return checkInput(obj)
}

// stateless makes the request's legs stateless: store false (vLLM stores a response whose store
// is absent).
func stateless(obj *body.Object) {
	if !obj.Has("store") {
		obj.Set("store", json.RawMessage("false"))
	}
}

func checkInput(obj *body.Object) error {
	raw, ok := obj.Get("input")
	switch body.KindOf(raw) {
	case body.KindString:
		return nil
	case body.KindArray:
	default:
		if !ok || body.KindOf(raw) == body.KindNull {
			return apierror.InvalidField("input", "\"input\" is required")
		}
		return apierror.InvalidField("input", "\"input\" must be a string or an array of input items")
	}
	items, err := body.Array(raw)
	if err != nil {
		return apierror.InvalidField("input", "\"input\" must be an array of input items")
	}
	if len(items) > MaxInputItems {
		return apierror.InvalidField("input", "too many input items: got %d, max %d", len(items), MaxInputItems)
	}
	for i, rawItem := range items {
		if _, err := itemOf(rawItem, i); err != nil {
			return err
		}
	}
	return nil
}

// item is one input item: its type (message when absent) and members.
type inputItem struct {
	typ string
	obj *body.Object
}

func itemOf(raw json.RawMessage, i int) (inputItem, error) {
	o, err := body.ParseNested(raw)
	if err != nil || body.KindOf(raw) != body.KindObject {
		return inputItem{}, apierror.InvalidField("input", "input[%d] must be an object", i)
	}
	typ, _, err := o.String("type")
	if err != nil {
		return inputItem{}, apierror.InvalidField("input", "input[%d].type must be a string", i)
	}
	if typ == "" {
		typ = "message" // an easy input message: {role, content}
	}
	known := false
	for _, t := range itemTypes {
		known = known || t == typ
	}
	switch {
	case typ == "item_reference":
		return inputItem{}, apierror.InvalidField("input", "input[%d]: an item_reference names a stored item, and the coordinator is stateless: send the item itself", i)
	case !known:
		return inputItem{}, apierror.InvalidField("input", "input[%d]: %q items are not served through the pipeline (stateless, no server-side tools): send messages, function calls and their outputs", i, typ)
	}
	switch typ {
	case "message":
		if k := o.Kind("content"); k != body.KindString && k != body.KindArray {
			return inputItem{}, apierror.InvalidField("input", "input[%d].content must be a string or an array of content parts", i)
		}
		if _, _, err := o.String("role"); err != nil {
			return inputItem{}, apierror.InvalidField("input", "input[%d].role must be a string", i)
		}
	case "function_call":
		for _, k := range []string{"call_id", "name", "arguments"} {
			if v, _, err := o.String(k); err != nil || v == "" && k != "arguments" {
				return inputItem{}, apierror.InvalidField("input", "input[%d].%s must be a non-empty string", i, k)
			}
		}
	case "reasoning":
		if k := o.Kind("encrypted_content"); k != body.KindNone && k != body.KindNull {
			return inputItem{}, apierror.InvalidField("input", "input[%d].encrypted_content: encrypted reasoning is not supported (as vLLM): send its summary", i)
		}
	case "function_call_output":
		if v, _, err := o.String("call_id"); err != nil || v == "" {
			return inputItem{}, apierror.InvalidField("input", "input[%d].call_id must be a non-empty string", i)
		}
		if o.Kind("output") != body.KindString {
			return inputItem{}, apierror.InvalidField("input", "input[%d].output must be a string (content-part outputs are not served through the pipeline)", i)
		}
	}
	return inputItem{typ: typ, obj: o}, nil
}

func checkTools(obj *body.Object) error {
	raw, _ := obj.Get("tools")
	switch body.KindOf(raw) {
	case body.KindNone, body.KindNull:
		return nil
	case body.KindArray:
	default:
		return apierror.InvalidField("tools", "\"tools\" must be an array")
	}
	tools, err := body.Array(raw)
	if err != nil || len(tools) > MaxInputItems {
		return apierror.InvalidField("tools", "\"tools\" must be an array of at most %d tools", MaxInputItems)
	}
	for i, t := range tools {
		o, err := body.ParseNested(t)
		if err != nil || body.KindOf(t) != body.KindObject {
			return apierror.InvalidField("tools", "tools[%d] must be an object", i)
		}
		typ, _, _ := o.String("type")
		if typ != "function" {
			return apierror.InvalidField("tools", "tools[%d]: %q tools run server-side, and the coordinator runs none: only function tools are served", i, typ)
		}
		if name, _, err := o.String("name"); err != nil || name == "" {
			return apierror.InvalidField("tools", "tools[%d].name must be a non-empty string", i)
		}
	}
	return nil
}

// responsesChat returns the chat body the render service tokenizes for a checked Responses request obj:
// model, the messages vLLM builds from instructions and input (a system message, then one
// message per item: function calls as assistant tool calls, their outputs as tool messages,
// reasoning items as assistant messages with their reasoning), and the function tools as chat
// tools (none with tool_choice none). Content parts are translated to the chat shape (input_text and output_text to text,
// input_image to image_url); each media URL is a subslice of obj, not a copy.
func responsesChat(obj *body.Object) (*body.Object, error) {
	out := &body.Object{}
	if raw, ok := obj.Get("model"); ok {
		out.Set("model", raw)
	}
	var m chatMessages
	m.open()
	if instr, ok := obj.Get("instructions"); ok && body.KindOf(instr) == body.KindString {
		m.message(`{"role":"system","content":`, instr)
	}
	raw, _ := obj.Get("input")
	if body.KindOf(raw) == body.KindString {
		m.message(`{"role":"user","content":`, raw)
	} else {
		items, err := body.Array(raw)
		if err != nil {
			return nil, apierror.InvalidField("input", "\"input\" must be a string or an array of input items")
		}
		for i, rawItem := range items {
			it, err := itemOf(rawItem, i)
			if err != nil {
				return nil, err
			}
			if err := m.item(it, i); err != nil {
				return nil, err
			}
		}
	}
	out.SetSegments("messages", m.close()...)
	choice, _, _ := obj.String("tool_choice")
	if tools, ok := obj.Get("tools"); ok && body.KindOf(tools) == body.KindArray && choice != "none" {
		out.Set("tools", chatTools(tools)) // as vLLM: no tools in the prompt with tool_choice none
	}
	return out, nil
}

// messages builds the messages array as segments: small new pieces and subslices of the
// request.
type chatMessages struct {
	segs [][]byte
	cur  []byte // the piece being written
	n    int
}

func (m *chatMessages) open() { m.cur = append(m.cur, '[') }

func (m *chatMessages) write(s string) { m.cur = append(m.cur, s...) }

// ref appends raw as is: a subslice of the request, not copied.
func (m *chatMessages) ref(raw []byte) {
	if len(raw) < 256 {
		m.cur = append(m.cur, raw...)
		return
	}
	m.segs = append(m.segs, m.cur, raw)
	m.cur = nil
}

func (m *chatMessages) sep() {
	if m.n > 0 {
		m.write(",")
	}
	m.n++
}

// message appends one message whose last member is content (prefix ends with its key).
func (m *chatMessages) message(prefix string, content []byte) {
	m.sep()
	m.write(prefix)
	m.ref(content)
	m.write("}")
}

func (m *chatMessages) close() [][]byte {
	m.write("]")
	return append(m.segs, m.cur)
}

func (m *chatMessages) item(it inputItem, i int) error {
	o := it.obj
	switch it.typ {
	case "reasoning":
		// As vLLM: an assistant message whose reasoning is the item's one summary text, else its
		// one content text, else empty.
		m.sep()
		m.write(`{"role":"assistant","reasoning":`)
		m.ref(reasoningText(o))
		m.write("}")
		return nil
	case "function_call":
		id, _ := o.Get("call_id")
		name, _ := o.Get("name")
		args, _ := o.Get("arguments")
		m.sep()
		m.write(`{"role":"assistant","content":null,"tool_calls":[{"id":`)
		m.ref(id)
		m.write(`,"type":"function","function":{"name":`)
		m.ref(name)
		m.write(`,"arguments":`)
		m.ref(args)
		m.write(`}}]}`)
		return nil
	case "function_call_output":
		id, _ := o.Get("call_id")
		m.sep()
		m.write(`{"role":"tool","tool_call_id":`)
		m.ref(id)
		out, _ := o.Get("output")
		m.write(`,"content":`)
		m.ref(out)
		m.write("}")
		return nil
	}
	role, _ := o.Get("role")
	content, _ := o.Get("content")
	m.sep()
	m.write(`{"role":`)
	m.ref(role)
	m.write(`,"content":`)
	if body.KindOf(content) == body.KindString {
		m.ref(content)
		m.write("}")
		return nil
	}
	parts, err := body.Array(content)
	if err != nil {
		return apierror.InvalidField("input", "input[%d].content must be an array of content parts", i)
	}
	m.write("[")
	for j, rawPart := range parts {
		if j > 0 {
			m.write(",")
		}
		if err := m.part(rawPart, i, j); err != nil {
			return err
		}
	}
	m.write("]}")
	return nil
}

// reasoningText is the JSON string a reasoning item gives its assistant message.
func reasoningText(o *body.Object) json.RawMessage {
	for _, key := range []string{"summary", "content"} {
		raw, _ := o.Get(key)
		parts, err := body.Array(raw)
		if err != nil || len(parts) != 1 {
			continue
		}
		if p, err := body.ParseNested(parts[0]); err == nil {
			if text, ok := p.Get("text"); ok && body.KindOf(text) == body.KindString {
				return text
			}
		}
	}
	return json.RawMessage(`""`)
}

// part appends the chat form of one content part.
func (m *chatMessages) part(raw json.RawMessage, i, j int) error {
	p, err := body.ParseNested(raw)
	if err != nil || body.KindOf(raw) != body.KindObject {
		return apierror.InvalidField("input", "input[%d].content[%d] must be an object", i, j)
	}
	typ, _, _ := p.String("type")
	switch typ {
	case "input_text", "output_text", "text", "refusal":
		key := "text"
		if typ == "refusal" {
			key = "refusal"
		}
		text, ok := p.Get(key)
		if !ok || body.KindOf(text) != body.KindString {
			return apierror.InvalidField("input", "input[%d].content[%d].%s must be a string", i, j, key)
		}
		m.write(`{"type":"text","text":`)
		m.ref(text)
		m.write("}")
	case "input_image":
		u, ok := p.Get("image_url")
		if !ok || body.KindOf(u) != body.KindString {
			return apierror.InvalidField("input", "input[%d].content[%d].image_url must be a URL string (file_id images are stored files)", i, j)
		}
		m.write(`{"type":"image_url","image_url":{"url":`)
		m.ref(u)
		m.write("}}")
	default:
		m.ref(raw) // input_audio has the chat shape; anything else the render service judges
	}
	return nil
}

// chatTools translates function tools ({type, name, description, parameters, strict}) to chat
// tools ({type, function: {…}}).
func chatTools(raw json.RawMessage) json.RawMessage {
	tools, _ := body.Array(raw)
	var b bytes.Buffer
	b.WriteByte('[')
	for i, t := range tools {
		if i > 0 {
			b.WriteByte(',')
		}
		o, _ := body.ParseNested(t)
		b.WriteString(`{"type":"function","function":{`)
		n := 0
		for _, f := range o.Fields() {
			if f.Key == "type" {
				continue
			}
			if n > 0 {
				b.WriteByte(',')
			}
			n++
			key, _ := json.Marshal(f.Key)
			b.Write(key)
			b.WriteByte(':')
			b.Write(f.Value)
		}
		b.WriteString("}}")
	}
	b.WriteByte(']')
	return b.Bytes()
}

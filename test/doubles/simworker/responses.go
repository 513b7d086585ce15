package simworker

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// PathResponses is the Responses API endpoint a Worker serves (stateless, as vLLM's with its
// response store off).
const PathResponses = "/v1/responses"

// parseResponses normalizes a Responses API request: its prompt is the chat messages vLLM builds
// from instructions and input (responsesMessages), its limit max_output_tokens. A
// previous_response_id is a stored response this stateless worker does not have (vLLM's 404).
func parseResponses(f fields, detail imageDetail) (*inference, *apiError) {
	in := common(f)
	in.maxTokens, in.maxTokensName = f.integer("max_output_tokens"), "max_output_tokens"
	tokens := f.object("tokens")
	ids := tokens.ints("token_ids")
	in.features = parseFeatures(tokens.object("features"))
	input, instructions := f.raw("input"), f.raw("instructions")
	prev := f.str("previous_response_id")
	if err := typeError(f); err != nil {
		return nil, err
	}
	if prev != "" {
		return nil, &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("Response with id '%s' not found.", prev), param: "previous_response_id"}
	}
	msgs, err := responsesMessages(instructions, input)
	if err != nil {
		return nil, badRequest("%v", err)
	}
	r := renderer{detail: detail}
	if err := r.render(msgs); err != nil {
		return nil, badRequest("%v", err)
	}
	in.promptIDs, in.echo, in.chatImages = r.ids, r.lastUser, r.images
	if len(ids) > 0 {
		in.promptIDs = ids
	}
	return in, nil
}

// RenderResponses returns the token ids a Worker renders for a Responses API request body (its
// own reading of the input, not the coordinator's), ignoring any tokens the body carries.
func RenderResponses(body []byte) ([]int, error) {
	var req struct {
		Input        json.RawMessage `json:"input"`
		Instructions json.RawMessage `json:"instructions"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, err
	}
	msgs, err := responsesMessages(req.Instructions, req.Input)
	if err != nil {
		return nil, err
	}
	r := renderer{detail: imageData}
	if err := r.render(msgs); err != nil {
		return nil, err
	}
	return r.ids, nil
}

// responsesMessages builds the chat messages of a Responses request as vLLM's
// construct_input_messages does: instructions as the system message, a string input as one user
// message, message items with their parts in the chat shape, function calls as assistant tool
// calls, their outputs as tool messages, reasoning items as assistant messages with reasoning.
func responsesMessages(instructions, input []byte) ([]byte, error) {
	var msgs []map[string]any
	if !absent(instructions) {
		var s string
		if err := json.Unmarshal(instructions, &s); err != nil {
			return nil, fmt.Errorf("instructions must be a string: %w", err)
		}
		msgs = append(msgs, map[string]any{"role": "system", "content": s})
	}
	if absent(input) {
		return nil, fmt.Errorf("input is required")
	}
	if input[0] == '"' {
		var s string
		if err := json.Unmarshal(input, &s); err != nil {
			return nil, err
		}
		msgs = append(msgs, map[string]any{"role": "user", "content": s})
		return json.Marshal(msgs)
	}
	var items []map[string]json.RawMessage
	if err := json.Unmarshal(input, &items); err != nil {
		return nil, fmt.Errorf("input must be a string or an array of items: %w", err)
	}
	for i, it := range items {
		var typ, role string
		_ = json.Unmarshal(it["type"], &typ)
		_ = json.Unmarshal(it["role"], &role)
		switch typ {
		case "reasoning":
			msgs = append(msgs, map[string]any{"role": "assistant", "reasoning": reasoningOf(it)})
		case "function_call":
			var id, name, args string
			_ = json.Unmarshal(it["call_id"], &id)
			_ = json.Unmarshal(it["name"], &name)
			_ = json.Unmarshal(it["arguments"], &args)
			msgs = append(msgs, map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{
				map[string]any{"id": id, "type": "function", "function": map[string]any{"name": name, "arguments": args}}}})
		case "function_call_output":
			var id, out string
			_ = json.Unmarshal(it["call_id"], &id)
			if err := json.Unmarshal(it["output"], &out); err != nil {
				return nil, fmt.Errorf("input[%d].output must be a string", i)
			}
			msgs = append(msgs, map[string]any{"role": "tool", "tool_call_id": id, "content": out})
		case "", "message":
			content, err := responsesContent(it["content"])
			if err != nil {
				return nil, fmt.Errorf("input[%d].content: %w", i, err)
			}
			msgs = append(msgs, map[string]any{"role": role, "content": content})
		default:
			return nil, fmt.Errorf("input[%d]: unsupported item type %q", i, typ)
		}
	}
	return json.Marshal(msgs)
}

// reasoningOf is what vLLM makes a reasoning item's message reasoning: its one summary text, else
// its one content text.
func reasoningOf(it map[string]json.RawMessage) string {
	for _, key := range []string{"summary", "content"} {
		var parts []struct {
			Text string `json:"text"`
		}
		if json.Unmarshal(it[key], &parts) == nil && len(parts) == 1 {
			return parts[0].Text
		}
	}
	return ""
}

// responsesContent is a message item's content in the chat shape.
func responsesContent(raw json.RawMessage) (any, error) {
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var parts []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, err
	}
	out := make([]any, len(parts))
	for j, p := range parts {
		var typ string
		_ = json.Unmarshal(p["type"], &typ)
		switch typ {
		case "input_text", "output_text":
			out[j] = map[string]json.RawMessage{"type": json.RawMessage(`"text"`), "text": p["text"]}
		case "input_image":
			var url string
			if err := json.Unmarshal(p["image_url"], &url); err != nil {
				return nil, fmt.Errorf("part %d: input_image needs an image_url string", j)
			}
			out[j] = map[string]any{"type": "image_url", "image_url": map[string]string{"url": url}}
		default:
			out[j] = p
		}
	}
	return out, nil
}

// respEvent is one Responses stream event; its type is also the SSE event name.
type respEvent map[string]any

// responseObject returns the Response of g with status and output ("" output: none yet).
func (g *generation) responseObject(status string, withOutput bool) map[string]any {
	r := map[string]any{
		"id": g.id, "object": "response", "created_at": g.created, "model": g.model, "status": status,
		"output": []any{}, "parallel_tool_calls": true, "tool_choice": "auto", "tools": []any{}, "error": nil,
		"incomplete_details": nil, "usage": nil,
	}
	if withOutput {
		r["output"] = []any{g.messageItem("completed", g.text())}
		u := map[string]any{
			"input_tokens": g.usage.PromptTokens, "output_tokens": g.usage.CompletionTokens, "total_tokens": g.usage.TotalTokens,
			"input_tokens_details": map[string]int{"cached_tokens": 0}, "output_tokens_details": map[string]int{"reasoning_tokens": 0},
		}
		if d := g.usage.PromptTokensDetails; d != nil {
			u["input_tokens_details"] = map[string]int{"cached_tokens": d.CachedTokens}
		}
		r["usage"] = u
		if status == "incomplete" {
			r["incomplete_details"] = map[string]string{"reason": "max_output_tokens"}
		}
	}
	if g.kv != nil {
		r["kv_transfer_params"] = g.kv
	}
	if len(g.ec) > 0 {
		r["ec_transfer_params"] = g.ec
	}
	return r
}

// finalStatus is the status of a finished response: incomplete, since every generation ends at
// its token limit (finishLength).
func (g *generation) finalStatus() string { return "incomplete" }

func (g *generation) itemID() string { return "msg_" + strings.TrimPrefix(g.id, "resp_") }

func (g *generation) messageItem(status, text string) map[string]any {
	content := []any{}
	if status == "completed" {
		content = []any{g.textPart(text)}
	}
	return map[string]any{"id": g.itemID(), "type": "message", "role": "assistant", "status": status, "content": content}
}

func (g *generation) textPart(text string) map[string]any {
	return map[string]any{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": []any{}}
}

// event returns the next event of a Responses stream, numbered.
func (g *generation) event(typ string, members map[string]any) respEvent {
	ev := respEvent{"type": typ, "sequence_number": g.seq}
	g.seq++
	for k, v := range members {
		ev[k] = v
	}
	return ev
}

// openingEvents start a Responses stream: the response created and in progress, its message
// item and text part added.
func (g *generation) openingEvents() []respEvent {
	return []respEvent{
		g.event("response.created", map[string]any{"response": g.responseObject("in_progress", false)}),
		g.event("response.in_progress", map[string]any{"response": g.responseObject("in_progress", false)}),
		g.event("response.output_item.added", map[string]any{"output_index": 0, "item": g.messageItem("in_progress", "")}),
		g.event("response.content_part.added", map[string]any{"output_index": 0, "content_index": 0, "item_id": g.itemID(), "part": g.textPart("")}),
	}
}

// deltaEvent carries token i.
func (g *generation) deltaEvent(i int) respEvent {
	return g.event("response.output_text.delta", map[string]any{"output_index": 0, "content_index": 0, "item_id": g.itemID(),
		"delta": g.piece(i), "logprobs": []any{}})
}

// closingEvents end a Responses stream: the text, part and item done, then the response with its
// usage (response.incomplete at the token limit, as OpenAI's API).
func (g *generation) closingEvents() []respEvent {
	text, status := g.text(), g.finalStatus()
	final := "response.completed"
	if status == "incomplete" {
		final = "response.incomplete"
	}
	return []respEvent{
		g.event("response.output_text.done", map[string]any{"output_index": 0, "content_index": 0, "item_id": g.itemID(), "text": text, "logprobs": []any{}}),
		g.event("response.content_part.done", map[string]any{"output_index": 0, "content_index": 0, "item_id": g.itemID(), "part": g.textPart(text)}),
		g.event("response.output_item.done", map[string]any{"output_index": 0, "item": g.messageItem("completed", text)}),
		g.event(final, map[string]any{"response": g.responseObject(status, true)}),
	}
}

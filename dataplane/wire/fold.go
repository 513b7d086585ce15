package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/wire/sse"
)

// FoldBound reads what bounds the folded answer of rc (force_stream): its token limit and number
// of choices, or why its answer is not folded: "unsupported" (a format whose streams are not
// folded, tools, logprobs) or "unbounded" (no token limit).
func FoldBound(rc *request.Context) (limit, n int64, why string) {
	f := Of(rc.API)
	o := f.sampling(rc.Body)
	switch {
	case f.Events().Fold() == nil:
		return 0, 0, "unsupported" // its events are not folded (nor resumed)
	case o == nil:
		return 0, 0, "unbounded"
	}
	for _, k := range []string{"tools", "functions"} {
		if raw, ok := o.Get(k); ok && body.KindOf(raw) == body.KindArray && string(bytes.TrimSpace(raw)) != "[]" {
			return 0, 0, "unsupported"
		}
	}
	for _, k := range []string{"logprobs", "top_logprobs", "prompt_logprobs"} {
		if raw, ok := o.Get(k); ok && string(raw) != "null" && string(raw) != "false" {
			return 0, 0, "unsupported"
		}
	}
	limit = -1
	for _, k := range []string{"max_completion_tokens", "max_tokens"} {
		if v, ok, err := o.Int(k); err == nil && ok && v > 0 {
			limit = v
			break
		}
	}
	if limit < 0 {
		return 0, 0, "unbounded"
	}
	n = 1
	if v, ok, err := o.Int("n"); err == nil && ok && v > 1 {
		n = v
	}
	return limit, n, ""
}

// Streamed is rc's body as a stream a Fold reads: stream true, and the usage chunk asked for
// where the format streams one.
func Streamed(rc *request.Context) *body.Object {
	obj := rc.Body.Clone()
	obj.Set("stream", json.RawMessage("true"))
	if rc.API != request.APIGenerate {
		obj.Set("stream_options", json.RawMessage(`{"include_usage":true}`))
	}
	return obj
}

// foldedChoice is one choice assembled from the events.
type foldedChoice struct {
	role, finish string
	text         []byte
	ids          []int
}

// Fold assembles the events of a stream into the unstreamed answer: the first non-empty id,
// model, created and system_fingerprint; choices by index with their text (or token ids), role
// (default assistant) and finish_reason; usage as the last usage event had it (not for
// generate). Size counts the bytes it holds.
type Fold struct {
	answer                            func(f *Fold) map[string]any
	id, model, fingerprint, requestID string
	created, usage                    json.RawMessage
	choices                           map[int]*foldedChoice
	size                              int64
	err                               error
}

// foldEvent is the part of a chat, completions or generate event a Fold reads.
type foldEvent struct {
	ID                string          `json:"id"`
	RequestID         string          `json:"request_id"`
	Model             string          `json:"model"`
	SystemFingerprint string          `json:"system_fingerprint"`
	Created           json.RawMessage `json:"created"`
	Usage             json.RawMessage `json:"usage"`
	Error             json.RawMessage `json:"error"`
	Choices           []struct {
		Index int `json:"index"`
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Text         *string `json:"text"`
		TokenIDs     []int   `json:"token_ids"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
}

// Add folds in complete events, and returns the first error (an event not JSON, an error event).
func (f *Fold) Add(events []byte) error {
	for d := range sse.Data(events) {
		f.add(d)
	}
	return f.err
}

// Size is how many bytes the fold holds.
func (f *Fold) Size() int64 { return f.size }

// add folds one event's data in.
func (f *Fold) add(d []byte) {
	if f.err != nil || bytes.Equal(d, dataDone) {
		return
	}
	var ev foldEvent
	if err := json.Unmarshal(d, &ev); err != nil {
		f.err = fmt.Errorf("an event is not JSON: %w", err)
		return
	}
	if len(ev.Error) > 0 {
		f.err = errors.New("the stream ended with an error event")
		return
	}
	first := func(dst *string, v string) {
		if *dst == "" {
			*dst = v
			f.size += int64(len(v))
		}
	}
	first(&f.id, ev.ID)
	first(&f.requestID, ev.RequestID)
	first(&f.model, ev.Model)
	first(&f.fingerprint, ev.SystemFingerprint)
	if len(f.created) == 0 && len(ev.Created) > 0 {
		f.created = ev.Created
	}
	if len(ev.Usage) > 0 && string(ev.Usage) != "null" {
		f.usage = ev.Usage
	}
	if f.choices == nil {
		f.choices = map[int]*foldedChoice{}
	}
	for _, c := range ev.Choices {
		fc := f.choices[c.Index]
		if fc == nil {
			fc = &foldedChoice{}
			f.choices[c.Index] = fc
			f.size += 64
		}
		if c.Delta.Role != "" {
			fc.role = c.Delta.Role
		}
		if c.Delta.Content != nil {
			fc.text = append(fc.text, *c.Delta.Content...)
			f.size += int64(len(*c.Delta.Content))
		}
		if c.Text != nil {
			fc.text = append(fc.text, *c.Text...)
			f.size += int64(len(*c.Text))
		}
		fc.ids = append(fc.ids, c.TokenIDs...)
		f.size += 8 * int64(len(c.TokenIDs))
		if c.FinishReason != nil {
			fc.finish = *c.FinishReason
		}
	}
}

// Answer is the folded answer in the format's unstreamed shape.
func (f *Fold) Answer() ([]byte, error) {
	if f.err != nil {
		return nil, f.err
	}
	return json.Marshal(f.answer(f))
}

// each calls fn with every choice, by index.
func (f *Fold) each(fn func(i int, c *foldedChoice) map[string]any) []any {
	indexes := make([]int, 0, len(f.choices))
	for i := range f.choices {
		indexes = append(indexes, i)
	}
	sort.Ints(indexes)
	out := make([]any, 0, len(indexes))
	for _, i := range indexes {
		out = append(out, fn(i, f.choices[i]))
	}
	return out
}

// finish is a choice's finish_reason (null when none came).
func (c *foldedChoice) reason() any {
	if c.finish == "" {
		return nil
	}
	return c.finish
}

// openAIAnswer is what chat and completions answers share: id, model, object, created,
// system_fingerprint and usage.
func openAIAnswer(f *Fold, object string, choices []any) map[string]any {
	a := map[string]any{"choices": choices, "id": f.id, "model": f.model, "object": object}
	if len(f.created) > 0 {
		a["created"] = f.created
	}
	if f.fingerprint != "" {
		a["system_fingerprint"] = f.fingerprint
	}
	if len(f.usage) > 0 {
		a["usage"] = f.usage
	}
	return a
}

func chatAnswer(f *Fold) map[string]any {
	return openAIAnswer(f, "chat.completion", f.each(func(i int, c *foldedChoice) map[string]any {
		role := c.role
		if role == "" {
			role = "assistant"
		}
		return map[string]any{"index": i, "message": map[string]any{"role": role, "content": string(c.text)}, "logprobs": nil, "finish_reason": c.reason()}
	}))
}

func completionsAnswer(f *Fold) map[string]any {
	return openAIAnswer(f, "text_completion", f.each(func(i int, c *foldedChoice) map[string]any {
		return map[string]any{"index": i, "text": string(c.text), "logprobs": nil, "finish_reason": c.reason()}
	}))
}

func generateAnswer(f *Fold) map[string]any {
	choices := f.each(func(i int, c *foldedChoice) map[string]any {
		ids := c.ids
		if ids == nil {
			ids = []int{}
		}
		return map[string]any{"index": i, "token_ids": ids, "finish_reason": c.reason()}
	})
	return map[string]any{"choices": choices, "request_id": f.requestID, "prompt_logprobs": nil, "kv_transfer_params": nil}
}

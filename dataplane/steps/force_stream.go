package steps

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/budget"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/pipeline/params"
	"github.com/epd-dev/coordinator/dataplane/relay"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
)

// Force-stream defaults (upstream llm-d-router steps/force_stream*.go at 6c95e02f/81d7e193).
const (
	defaultForceStreamBufferMiB     = 1024
	defaultForceStreamMaxRequestKiB = 256
)

// forceStream sends a non-streaming client's decode leg as a stream, so that it is resumed when
// its decode worker dies, and folds the events back into one JSON answer. Each answer reserves
// n·(max_tokens·16 + 256) + 2048 bytes of a process-wide budget while it is assembled.
type forceStream struct {
	budget     int64 // force_stream_buffer_size, bytes
	maxRequest int64 // force_stream_max_request_size, bytes
	// held is the process-wide count budget bounds (builder.Shared.Folds), shared by every
	// decode step and across reloads.
	held *budget.Bytes
}

func newForceStream(p *params.Params, held *budget.Bytes) *forceStream {
	on := p.Bool("force_stream", false)
	limit := int64(p.Int("force_stream_buffer_size", defaultForceStreamBufferMiB, 1)) << 20
	maxRequest := int64(p.Int("force_stream_max_request_size", defaultForceStreamMaxRequestKiB, 1)) << 10
	if maxRequest > limit {
		p.Fail("force_stream_max_request_size", "%d KiB is more than force_stream_buffer_size (%d MiB)", maxRequest>>10, limit>>20)
	}
	if !on {
		return nil
	}
	return &forceStream{budget: limit, maxRequest: maxRequest, held: cmp.Or(held, &budget.Bytes{})}
}

// admit decides whether rc's answer is force-streamed and reserves its bytes; it reports the
// reservation (released by forced) or false with the reason logged. Responses requests, requests
// with tools or logprobs, without a token limit, or over the per-request or process budget go
// unstreamed.
func (f *forceStream) admit(rc *request.Context) (int64, bool) {
	o := rc.Body
	if rc.API == request.APIResponses {
		return f.skip(rc, "unsupported") // its events are not folded (nor resumed)
	}
	if rc.API == request.APIGenerate {
		sp, _, err := o.Object("sampling_params")
		if err != nil || sp == nil {
			return f.skip(rc, "unbounded")
		}
		o = sp
	}
	for _, k := range []string{"tools", "functions"} {
		if raw, ok := o.Get(k); ok && body.KindOf(raw) == body.KindArray && string(bytes.TrimSpace(raw)) != "[]" {
			return f.skip(rc, "unsupported")
		}
	}
	for _, k := range []string{"logprobs", "top_logprobs", "prompt_logprobs"} {
		if raw, ok := o.Get(k); ok && string(raw) != "null" && string(raw) != "false" {
			return f.skip(rc, "unsupported")
		}
	}
	limit := int64(-1)
	for _, k := range []string{"max_completion_tokens", "max_tokens"} {
		if n, ok, err := o.Int(k); err == nil && ok && n > 0 {
			limit = n
			break
		}
	}
	if limit < 0 {
		return f.skip(rc, "unbounded")
	}
	n := int64(1)
	if v, ok, err := o.Int("n"); err == nil && ok && v > 1 {
		n = v
	}
	if limit > f.maxRequest || n > f.maxRequest { // keeps the product below from overflowing
		return f.skip(rc, "budget")
	}
	reservation := n*(limit*16+256) + 2048
	if reservation > f.maxRequest {
		return f.skip(rc, "budget")
	}
	if !f.held.Reserve(reservation, f.budget) {
		return f.skip(rc, "budget")
	}
	return reservation, true
}

func (f *forceStream) skip(rc *request.Context, why string) (int64, bool) {
	rc.Log.V(logging.Debug).Info("decode not force-streamed", "reason", why)
	return 0, false
}

// forced runs the decode leg as a stream folded as it arrives (at most reservation bytes of
// assembled answer), resumed like any stream, and answers the client with the folded JSON. A stream that breaks off for good is
// a clean 502 (the client got nothing yet); a worker's error answer is relayed as it came.
func (s *decode) forced(ctx context.Context, rc *request.Context, reservation int64) error {
	defer s.force.held.Release(reservation)
	client, clientBody := rc.Writer, rc.Body
	streamed := rc.Body.Clone()
	streamed.Set("stream", json.RawMessage("true"))
	if rc.API != request.APIGenerate {
		streamed.Set("stream_options", json.RawMessage(`{"include_usage":true}`))
	}
	buf := &heldResponse{header: http.Header{}, limit: reservation}
	rc.Writer, rc.Body, rc.Stream = buf, streamed, true
	err := s.send(ctx, rc)
	rc.Writer, rc.Body, rc.Stream = client, clientBody, false
	switch {
	case buf.overflow:
		return &apierror.UpstreamError{Phase: DecodeStep, Status: http.StatusOK,
			Err: fmt.Errorf("the streamed answer is larger than its %d bytes (force_stream)", reservation)}
	case err != nil && buf.status == 0:
		return err // nothing came: the leg's own error
	case err != nil:
		return &apierror.UpstreamError{Phase: DecodeStep, Status: http.StatusOK, Err: fmt.Errorf("force-streamed answer: %w", err)}
	case buf.status != http.StatusOK || !upstream.IsEventStream(buf.header):
		return buf.relay(client, rc.ID) // an error or an answer that did not stream: as it came
	}
	out, ferr := buf.fold.answer(rc.API)
	if ferr != nil {
		return &apierror.UpstreamError{Phase: DecodeStep, Status: http.StatusOK, Err: ferr}
	}
	h := client.Header()
	h.Set("Content-Type", "application/json")
	h.Set(upstream.RequestIDHeader, rc.ID)
	h.Set("Content-Length", strconv.Itoa(len(out)))
	client.WriteHeader(http.StatusOK)
	if _, werr := client.Write(out); werr != nil {
		return errors.Join(upstream.ErrClientGone, werr)
	}
	return nil
}

// heldResponse is a response held in memory: an event stream is folded event by event (only
// the assembled text, at most limit bytes of it, is kept), any other body kept whole up to
// limit bytes.
type heldResponse struct {
	header   http.Header
	status   int
	body     bytes.Buffer // a body that is not an event stream
	fold     folder
	limit    int64
	overflow bool
}

func (c *heldResponse) Header() http.Header { return c.header }
func (c *heldResponse) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
}

func (c *heldResponse) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	if c.status != http.StatusOK || !upstream.IsEventStream(c.header) {
		if int64(c.body.Len()+len(p)) > c.limit {
			c.overflow = true
			return 0, errors.New("force-streamed answer over its reservation")
		}
		return c.body.Write(p)
	}
	// An event stream reaches it through relay.Stream, which writes complete events only.
	relay.EachData(p, c.fold.add)
	if c.fold.err != nil {
		return 0, c.fold.err
	}
	if c.fold.size > c.limit {
		c.overflow = true
		return 0, errors.New("force-streamed answer over its reservation")
	}
	return len(p), nil
}

func (*heldResponse) Flush() {}

// relay writes the held response to w as it came.
func (c *heldResponse) relay(w http.ResponseWriter, requestID string) error {
	upstream.CopyResponseHeader(w.Header(), c.header)
	w.Header().Set(upstream.RequestIDHeader, requestID)
	w.WriteHeader(c.status)
	_, err := w.Write(c.body.Bytes())
	return err
}

// foldedChoice is one choice assembled from the events.
type foldedChoice struct {
	role, finish string
	text         []byte
	ids          []int
}

// folder assembles the events of a stream into the unstreamed answer: the first non-empty id,
// model, created and system_fingerprint; choices by index with their text (or token ids), role
// (default assistant) and finish_reason; usage as the last usage event had it (not for
// generate). size counts the bytes it holds.
type folder struct {
	id, model, fingerprint, requestID string
	created, usage                    json.RawMessage
	choices                           map[int]*foldedChoice
	size                              int64
	err                               error
}

// foldEvent is the part of a chat, completions or generate event the folder reads.
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

// add folds one event's data in.
func (f *folder) add(d []byte) {
	if f.err != nil || bytes.Equal(d, []byte("[DONE]")) {
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

// fold assembles the events of a whole stream (see folder).
func fold(api request.API, events []byte) ([]byte, error) {
	var f folder
	relay.EachData(events, f.add)
	return f.answer(api)
}

// answer is the folded answer of api.
func (f *folder) answer(api request.API) ([]byte, error) {
	if f.err != nil {
		return nil, f.err
	}
	indexes := make([]int, 0, len(f.choices))
	for i := range f.choices {
		indexes = append(indexes, i)
	}
	sort.Ints(indexes)
	finish := func(fc *foldedChoice) any {
		if fc.finish == "" {
			return nil
		}
		return fc.finish
	}
	out := make([]any, 0, len(indexes))
	for _, i := range indexes {
		fc := f.choices[i]
		switch api {
		case request.APIChat:
			role := fc.role
			if role == "" {
				role = "assistant"
			}
			out = append(out, map[string]any{"index": i, "message": map[string]any{"role": role, "content": string(fc.text)},
				"logprobs": nil, "finish_reason": finish(fc)})
		case request.APICompletions:
			out = append(out, map[string]any{"index": i, "text": string(fc.text), "logprobs": nil, "finish_reason": finish(fc)})
		default:
			ids := fc.ids
			if ids == nil {
				ids = []int{}
			}
			out = append(out, map[string]any{"index": i, "token_ids": ids, "finish_reason": finish(fc)})
		}
	}
	answer := map[string]any{"choices": out}
	switch api {
	case request.APIGenerate:
		answer["request_id"] = f.requestID
		answer["prompt_logprobs"] = nil
		answer["kv_transfer_params"] = nil
	default:
		answer["id"], answer["model"] = f.id, f.model
		answer["object"] = map[bool]string{true: "chat.completion", false: "text_completion"}[api == request.APIChat]
		if len(f.created) > 0 {
			answer["created"] = f.created
		}
		if f.fingerprint != "" {
			answer["system_fingerprint"] = f.fingerprint
		}
		if len(f.usage) > 0 {
			answer["usage"] = f.usage
		}
	}
	return json.Marshal(answer)
}

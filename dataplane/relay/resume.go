// Package resume keeps a streamed answer whole when its decode worker dies. A Stream relays a
// worker's server-sent events to the client one complete event at a time (a partial event is
// held until it completes, so a break never leaves half an event with the client) and records
// what the client got. When the stream breaks, Continuation tells whether another decode worker
// can produce exactly the rest, and builds that request: for chat, the client's messages plus
// the output so far as an assistant message continued with vLLM's continue_final_message; for
// tokens-in generate, the prompt ids plus the output ids; in both, the token limit reduced by
// what was produced. Relaying the continuation through the same Stream splices it in: the
// original id and created time, no second role event, usage totals that add up. A stream that
// cannot be resumed ends with an OpenAI error event (Fail) and an aborted body.
//
// A Responses API stream is relayed the same way but never resumed (the API has no continuation
// of a partial answer): it ends with its response.completed, response.incomplete or
// response.failed event rather than [DONE], and a break ends it with the API's own error event.
package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
)

// MaxTracked bounds the events a Stream keeps to resume from; a longer answer still streams but
// is no longer resumed.
const MaxTracked = 4 << 20

// ErrBroken reports a stream that ended before its [DONE] event after the client got part of it.
var ErrBroken = errors.New("the decode stream broke off")

var (
	eventEnd = []byte("\n\n")
	dataDone = []byte("[DONE]")
	// bufs are the read buffers, one per relayed stream for its whole life: thousands of streams
	// are open at once, each reading one small event at a time (a longer one gathers in pending).
	bufs = sync.Pool{New: func() any { b := make([]byte, 2<<10); return &b }}
	// batches hold the events of a stream not folded yet (Stream.unfolded).
	batches = sync.Pool{New: func() any { b := make([]byte, 0, foldAt); return &b }}
)

// Stream is one client's event stream, fed by one worker answer after another.
type Stream struct {
	w         http.ResponseWriter
	flusher   http.Flusher
	requestID string
	api       request.API
	events    int // data events written (the next sequence_number of a Responses stream)

	pending []byte // the start of an event not yet complete
	// got is what the client got (chat and generate streams, the ones that can be resumed; nil
	// for the others): the text or token ids so far and the facts a continuation needs, not the
	// events themselves, so an open stream holds a few bytes per token. The events are folded in
	// batches of foldAt bytes (unfolded holds the batch): a short answer, which ends before its
	// first batch does, is never parsed at all.
	got      *state
	unfolded []byte
	batch    *[]byte // unfolded's pooled backing
	started  bool    // the response's status and headers are written
	done     bool    // the [DONE] event was forwarded

	// splice is set while a continuation is relayed: what its events are rewritten to.
	splice *splice
	// rc, when watched, receives the answer's statistics and token events (Watch).
	rc *request.Context
}

// Watch makes the stream report to rc what the client gets: each write's token events
// (rc.OnEvents), the served model and the usage (rc.Answer); with rc.HideUsage, the usage chunk
// (an empty choices list next to the usage) is read but not relayed.
func (s *Stream) Watch(rc *request.Context) { s.rc = rc }

// New returns the stream of a response in format api written to w; Release it when the
// response is done.
func New(w http.ResponseWriter, requestID string, api request.API) *Stream {
	f, _ := w.(http.Flusher)
	s := &Stream{w: w, flusher: f, requestID: requestID, api: api}
	if api == request.APIChat || api == request.APIGenerate {
		s.got = &state{api: api}
	}
	return s
}

// Release returns the stream's buffer to the pool; the stream is not used afterwards.
func (s *Stream) Release() {
	if s.batch != nil {
		*s.batch = s.unfolded[:0]
		batches.Put(s.batch)
		s.batch, s.unfolded = nil, nil
	}
}

// Started reports whether the client got the response's headers (and at least one event).
func (s *Stream) Started() bool { return s.started }

// Relay forwards resp, an event stream, and closes it. It returns nil once the [DONE] event was
// forwarded; errors.Join(upstream.ErrNotStarted, err) when it broke before the client got
// anything (nothing was written: the leg may simply be retried); upstream.ErrClientGone; or
// ErrBroken when it ended or failed before [DONE] after the client got part of it.
func (s *Stream) Relay(resp *http.Response) error {
	defer resp.Body.Close()
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
	buf := *bp
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if err := s.feed(resp, buf[:n]); err != nil {
				return err
			}
		}
		switch {
		case rerr == nil:
			continue
		case s.done:
			return nil
		case rerr == io.EOF:
			rerr = io.ErrUnexpectedEOF // the worker closed the stream without [DONE]
		}
		s.pending = s.pending[:0] // the dead worker's partial event is never sent
		if !s.started {
			return errors.Join(upstream.ErrNotStarted, rerr)
		}
		return errors.Join(ErrBroken, rerr)
	}
}

// feed forwards the complete events p ends (with what is pending) and holds the rest.
func (s *Stream) feed(resp *http.Response, p []byte) error {
	var complete []byte
	if len(s.pending) == 0 && bytes.HasSuffix(p, eventEnd) {
		complete = p // the common case: the worker wrote whole events
	} else {
		s.pending = append(s.pending, p...)
		i := bytes.LastIndex(s.pending, eventEnd)
		if i < 0 {
			return nil
		}
		complete = s.pending[:i+2]
		defer func() { s.pending = s.pending[:copy(s.pending, s.pending[i+2:])] }()
	}
	if s.splice != nil {
		complete = s.splice.rewrite(complete)
		if len(complete) == 0 {
			return nil
		}
	}
	events := 0
	if s.rc != nil {
		if complete, events = s.observe(complete); len(complete) == 0 {
			return nil
		}
	}
	if !s.started {
		h := s.w.Header()
		upstream.CopyResponseHeader(h, resp.Header)
		h.Del("Content-Length")
		if s.requestID != "" {
			h.Set(upstream.RequestIDHeader, s.requestID)
		}
		s.w.WriteHeader(resp.StatusCode)
		s.started = true
	}
	if _, err := s.w.Write(complete); err != nil {
		return errors.Join(upstream.ErrClientGone, err)
	}
	if s.flusher != nil {
		s.flusher.Flush()
	}
	if events > 0 && s.rc.OnEvents != nil {
		s.rc.OnEvents(events)
	}
	if s.got != nil {
		s.record(complete)
	}
	if s.api == request.APIResponses {
		EachData(complete, func(d []byte) {
			s.events++
			s.done = s.done || terminal(d)
		})
	} else if bytes.Contains(complete, dataDone) && lastData(complete, dataDone) {
		s.done = true
	}
	return nil
}

// Responses stream events that end a response.
var terminalTypes = []string{"response.completed", "response.incomplete", "response.failed"}

// terminal reports whether d, a Responses stream event, ends the response: only an event that
// names a terminal type anywhere is parsed to be sure it is its own.
func terminal(d []byte) bool {
	for _, t := range terminalTypes {
		if bytes.Contains(d, []byte(t)) {
			return slices.Contains(terminalTypes, eventType(d))
		}
	}
	return false
}

// eventType is the type member of a Responses stream event ("" when it has none).
func eventType(d []byte) string {
	o, err := body.Parse(d)
	if err != nil {
		return ""
	}
	t, _, _ := o.String("type")
	return t
}

// observe reads the statistics of complete events for s.rc and counts their token events. With
// rc.HideUsage it returns complete without its usage chunks (a copy: complete may be the read
// buffer); otherwise complete itself.
func (s *Stream) observe(complete []byte) ([]byte, int) {
	rc, events := s.rc, 0
	var kept []byte // nil until an event is dropped: then the events before it, and those after
	for rest := complete; len(rest) > 0; {
		ev := rest
		if i := bytes.Index(rest, eventEnd); i >= 0 {
			ev, rest = rest[:i+2], rest[i+2:]
		} else {
			rest = nil
		}
		drop := false
		EachData(ev, func(d []byte) {
			switch {
			case bytes.Equal(d, dataDone):
			case rc.Answer.Read(d) && request.UsageOnly(d):
				drop = rc.HideUsage
			case s.api != request.APIResponses || bytes.HasSuffix([]byte(eventType(d)), []byte(".delta")):
				events++ // a Responses stream's token events are its deltas
			}
		})
		switch {
		case drop && kept == nil:
			kept = append(make([]byte, 0, len(complete)), complete[:len(complete)-len(rest)-len(ev)]...)
		case !drop && kept != nil:
			kept = append(kept, ev...)
		}
	}
	if kept == nil {
		return complete, events
	}
	return kept, events
}

// lastData reports whether the last data line of events is want.
func lastData(events, want []byte) bool {
	var last []byte
	EachData(events, func(d []byte) { last = d })
	return bytes.Equal(last, want)
}

// EachData calls fn with the payload of every data line of events (SSE).
func EachData(events []byte, fn func([]byte)) {
	for len(events) > 0 {
		line := events
		if i := bytes.IndexByte(events, '\n'); i >= 0 {
			line, events = events[:i], events[i+1:]
		} else {
			events = nil
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			fn(bytes.TrimPrefix(d, []byte(" ")))
		}
	}
}

// Fail ends the stream with an OpenAI error event (the response is then aborted by the caller:
// no terminating chunk, so every client reports an error) and returns ErrResponseTruncated
// with cause. A stream not yet started gets nothing: the caller answers the error itself.
func (s *Stream) Fail(reason string, cause error) error {
	if s.started {
		e := &apierror.Error{Type: apierror.TypeAPI, Code: "stream_interrupted",
			Message: "the answer broke off and could not be resumed: " + reason}
		var ev []byte
		if s.api == request.APIResponses {
			// The Responses API's own error event.
			ev, _ = json.Marshal(map[string]any{"type": "error", "code": e.Code, "message": e.Message, "param": nil, "sequence_number": s.events})
			ev = append(append([]byte("event: error\ndata: "), ev...), "\n\n"...)
		} else {
			ev = append(append([]byte("data: "), bytes.TrimSuffix(e.Body(s.requestID), []byte("\n"))...), "\n\n"...)
		}
		if _, err := s.w.Write(ev); err == nil && s.flusher != nil {
			s.flusher.Flush()
		}
	}
	return errors.Join(upstream.ErrResponseTruncated, fmt.Errorf("%s: %w", reason, cause))
}

// Finish ends a stream whose last choice already finished but whose [DONE] was lost, when the
// client asked for no usage; it reports whether it could.
func (s *Stream) Finish(rc *request.Context) bool {
	st, err := s.state(rc.API)
	if err != nil || !st.finished || (includeUsage(rc) && !rc.HideUsage) {
		return false // a client that asked for usage must get it: only a continuation can give it
	}
	if _, err := s.w.Write([]byte("data: [DONE]\n\n")); err != nil {
		return false
	}
	if s.flusher != nil {
		s.flusher.Flush()
	}
	s.done = true
	return true
}

// state is what the client got: each event it got is folded in as it passes.
type state struct {
	api      request.API
	id       string
	created  json.RawMessage
	text     []byte // chat: the content so far
	ids      []int  // generate: the token ids so far
	tokens   int    // content events (one token each, as vLLM streams)
	finished bool   // a finish_reason was sent
	exotic   string // why the output cannot be continued exactly, when it cannot
	roleSent bool
	err      error // an event that could not be read: the stream is no longer resumed
	over     bool  // the output outgrew MaxTracked: the stream is no longer resumed
}

func present(raw []byte) bool { return len(raw) > 0 && string(raw) != "null" }

// foldAt is the size of the batches in which the events a client got are folded into its state.
const foldAt = 4 << 10

// record keeps complete, events the client got, for the state.
func (s *Stream) record(complete []byte) {
	if s.batch == nil {
		s.batch = batches.Get().(*[]byte)
		s.unfolded = (*s.batch)[:0]
	}
	if len(s.unfolded)+len(complete) > foldAt {
		s.got.fold(s.unfolded)
		s.unfolded = s.unfolded[:0]
		if len(complete) > foldAt {
			s.got.fold(complete)
			return
		}
	}
	s.unfolded = append(s.unfolded, complete...)
}

// state is what the client got, or why a continuation cannot be built from it.
func (s *Stream) state(api request.API) (*state, error) {
	if s.got != nil && len(s.unfolded) > 0 {
		s.got.fold(s.unfolded)
		s.unfolded = s.unfolded[:0]
	}
	switch {
	case api != request.APIChat && api != request.APIGenerate || s.got == nil:
		return nil, fmt.Errorf("%s streams are not resumed (only chat and tokens-in generate)", api)
	case s.got.over:
		return nil, fmt.Errorf("the answer is longer than the %d bytes kept to resume from", MaxTracked)
	case s.got.err != nil:
		return nil, s.got.err
	}
	return s.got, nil
}

// fold adds the data events of events, which the client got.
func (st *state) fold(events []byte) {
	if st.over || st.err != nil {
		return
	}
	EachData(events, func(d []byte) {
		if st.err != nil || bytes.Equal(d, dataDone) {
			return
		}
		if !body.Valid(d) {
			st.err = errors.New("an event the client got is not JSON")
			return
		}
		st.err = st.add(d)
	})
	if len(st.text)+8*len(st.ids) > MaxTracked {
		st.over, st.text, st.ids = true, nil, nil
	}
}

// add folds in one event, d (valid JSON).
func (st *state) add(d []byte) error {
	var id, created []byte
	for k, v := range body.Members(d) {
		switch k {
		case "id", "request_id":
			if k == "id" && st.api == request.APIChat || k == "request_id" && st.api == request.APIGenerate {
				id = v
			}
		case "created":
			created = v
		case "choices":
			for ch := range body.Elements(v) {
				if err := st.addChoice(ch); err != nil {
					return err
				}
			}
		}
	}
	if st.id == "" && len(id) > 0 {
		raw, err := body.AppendString(nil, id)
		if err != nil {
			return fmt.Errorf("an event the client got has an id that is not a string: %w", err)
		}
		st.id = string(raw)
		if st.api == request.APIChat {
			st.created = bytes.Clone(created)
		}
	}
	return nil
}

// addChoice folds in one choice of an event.
func (st *state) addChoice(ch []byte) error {
	var index int64
	var delta, logprobs, tokenIDs []byte
	for k, v := range body.Members(ch) {
		switch k {
		case "index":
			index, _ = body.ParseInt(v)
		case "delta":
			delta = v
		case "token_ids":
			tokenIDs = v
		case "logprobs":
			logprobs = v
		case "finish_reason":
			st.finished = st.finished || present(v)
		}
	}
	var content, toolCalls, reasoning []byte
	for k, v := range body.Members(delta) {
		switch k {
		case "role":
			st.roleSent = st.roleSent || body.KindOf(v) == body.KindString && len(v) > 2
		case "content":
			content = v
		case "tool_calls":
			toolCalls = v
		case "reasoning", "reasoning_content":
			if present(v) {
				reasoning = v
			}
		}
	}
	switch {
	case index != 0:
		st.exotic = "several choices"
	case st.api == request.APIChat && present(toolCalls):
		st.exotic = "a tool call was being streamed"
	case st.api == request.APIChat && reasoning != nil:
		st.exotic = "reasoning was being streamed"
	case present(logprobs):
		st.exotic = "logprobs were being streamed"
	}
	if st.api == request.APIGenerate {
		for id := range body.Elements(tokenIDs) {
			n, err := body.ParseInt(id)
			if err != nil {
				return fmt.Errorf("an event the client got has a token id that is not an integer: %s", id)
			}
			st.ids = append(st.ids, int(n))
			st.tokens++
		}
		return nil
	}
	if body.KindOf(content) == body.KindString && len(content) > 2 {
		var err error
		if st.text, err = body.AppendString(st.text, content); err != nil {
			return err
		}
		st.tokens++
	}
	return nil
}

// notExact names what in a request makes a continuation differ from the uninterrupted answer,
// or "" when none does.
func notExact(rc *request.Context) string {
	o := rc.Body
	if rc.API == request.APIGenerate {
		sp, _, err := o.Object("sampling_params")
		if err != nil || sp == nil {
			return ""
		}
		o = sp
	}
	if n, ok, _ := o.Int("n"); ok && n != 1 {
		return "n > 1"
	}
	for _, k := range []string{"logprobs", "top_logprobs", "prompt_logprobs"} {
		if raw, ok := o.Get(k); ok && string(raw) != "null" && string(raw) != "false" {
			return k + " was requested"
		}
	}
	for _, k := range []string{"response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
		"structured_outputs", "guided_decoding", "json_schema"} {
		raw, ok := o.Get(k)
		if !ok || string(raw) == "null" {
			continue
		}
		if k == "response_format" {
			if t, _ := responseFormatType(raw); t == "text" {
				continue
			}
		}
		return "structured output (" + k + ") was requested"
	}
	if b, ok, _ := o.Bool("continue_final_message"); ok && b {
		return "the request itself continues a message"
	}
	return ""
}

func responseFormatType(raw json.RawMessage) (string, error) {
	o, err := body.Parse(raw)
	if err != nil {
		return "", err
	}
	t, _, err := o.String("type")
	return t, err
}

func includeUsage(rc *request.Context) bool {
	so, _, err := rc.Body.Object("stream_options")
	if err != nil || so == nil {
		return false
	}
	b, _, _ := so.Bool("include_usage")
	return b
}

// Continuation returns the body of a request for the rest of the answer, to send on rc.Path
// with the decode profile; the decode worker prefills the longer prompt itself (no KV transfer
// parameters: the prefill pool may be what failed, and the new prompt is not what was
// prefilled). Relays that follow splice its events into the stream. It returns an error saying
// why when the rest cannot be produced exactly (see docs/operations.md).
func (s *Stream) Continuation(rc *request.Context) (*body.Object, error) {
	if why := notExact(rc); why != "" {
		return nil, errors.New(why)
	}
	st, err := s.state(rc.API)
	if err != nil {
		return nil, err
	}
	if st.exotic != "" {
		return nil, errors.New(st.exotic)
	}
	if st.finished {
		return nil, errors.New("the answer had finished; only its end was lost")
	}
	obj := rc.Body.Clone()
	if rc.API == request.APIChat {
		if err := continueChat(rc, obj, st); err != nil {
			return nil, err
		}
	} else if err := continueGenerate(rc, obj, st); err != nil {
		return nil, err
	}
	s.splice = &splice{api: st.api, id: st.id, created: st.created, tokens: st.tokens}
	return obj, nil
}

// continueChat appends the output so far as the assistant message to continue and lowers the
// token limits.
func continueChat(rc *request.Context, obj *body.Object, st *state) error {
	if len(st.text) > 0 {
		raw, _ := rc.Body.Get("messages")
		raw = bytes.TrimRight(raw, " \t\r\n")
		if len(raw) < 2 || raw[len(raw)-1] != ']' {
			return errors.New("messages is not an array")
		}
		msg, _ := json.Marshal(struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		}{"assistant", string(st.text)})
		tail := make([]byte, 0, len(msg)+2)
		tail = append(append(append(tail, ','), msg...), ']')
		obj.SetSegments("messages", raw[:len(raw)-1], tail)
		obj.Set("continue_final_message", json.RawMessage("true"))
		obj.Set("add_generation_prompt", json.RawMessage("false"))
	}
	return lowerLimits(obj, st.tokens, "max_tokens", "max_completion_tokens")
}

// continueGenerate appends the output ids to the prompt ids and lowers sampling_params.max_tokens.
func continueGenerate(rc *request.Context, obj *body.Object, st *state) error {
	raw, _ := rc.Body.Get("token_ids")
	raw = bytes.TrimRight(raw, " \t\r\n")
	if len(raw) < 2 || raw[len(raw)-1] != ']' {
		return errors.New("token_ids is not an array")
	}
	if len(st.ids) > 0 {
		tail := make([]byte, 0, 8*len(st.ids)+2)
		for i, id := range st.ids {
			if i > 0 || len(bytes.TrimSpace(raw[1:len(raw)-1])) > 0 {
				tail = append(tail, ',')
			}
			tail = strconv.AppendInt(tail, int64(id), 10)
		}
		tail = append(tail, ']')
		obj.SetSegments("token_ids", raw[:len(raw)-1], tail)
	}
	sp, _, err := obj.Object("sampling_params")
	if err != nil {
		return err
	}
	if sp == nil {
		return nil
	}
	sp = sp.Clone()
	if err := lowerLimits(sp, st.tokens, "max_tokens"); err != nil {
		return err
	}
	obj.Set("sampling_params", sp.Bytes())
	return nil
}

// lowerLimits lowers each present limit by produced tokens.
func lowerLimits(o *body.Object, produced int, keys ...string) error {
	for _, k := range keys {
		n, ok, err := o.Int(k)
		if err != nil || !ok {
			continue
		}
		left := n - int64(produced)
		if left < 1 {
			return fmt.Errorf("%s is used up", k)
		}
		o.Set(k, strconv.AppendInt(nil, left, 10))
	}
	return nil
}

// splice is what a continuation's events are rewritten to: the original stream's id and created
// time, and the tokens produced before the break.
type splice struct {
	api     request.API
	id      string
	created json.RawMessage
	tokens  int
}

// rewrite makes a continuation's events the original stream's: its first role-only event is
// dropped (the client has had one), the id and created time are the original's, and a usage
// event counts the tokens produced before the break as completion tokens, not prompt.
func (st *splice) rewrite(events []byte) []byte {
	out := make([]byte, 0, len(events)+32)
	for len(events) > 0 {
		ev := events
		if i := bytes.Index(events, eventEnd); i >= 0 {
			ev, events = events[:i+2], events[i+2:]
		} else {
			events = nil
		}
		out = append(out, st.rewriteEvent(ev)...)
	}
	return out
}

func (st *splice) rewriteEvent(ev []byte) []byte {
	var out []byte
	keep := true
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i+1], ev[i+1:]
		} else {
			ev = nil
		}
		d, isData := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:"))
		d = bytes.TrimPrefix(d, []byte(" "))
		if !isData || bytes.Equal(d, dataDone) {
			out = append(out, line...)
			continue
		}
		o, err := body.Parse(d)
		if err != nil {
			out = append(out, line...)
			continue
		}
		if st.api == request.APIChat {
			if st.roleOnly(o) {
				keep = false
				continue
			}
			o.Set("id", strconv.AppendQuote(nil, st.id))
			if len(st.created) > 0 {
				o.Set("created", st.created)
			}
		} else {
			o.Set("request_id", strconv.AppendQuote(nil, st.id))
		}
		st.fixUsage(o)
		out = append(append(append(out, "data: "...), o.Bytes()...), '\n')
	}
	if !keep && len(bytes.TrimSpace(out)) == 0 {
		return nil
	}
	return out
}

// roleOnly reports the opening event of a chat stream: a role with empty content, nothing else.
func (st *splice) roleOnly(o *body.Object) bool {
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

// fixUsage moves the tokens produced before the break from the continuation's prompt count to
// its completion count: the totals are those of the uninterrupted answer.
func (st *splice) fixUsage(o *body.Object) {
	raw, ok := o.Get("usage")
	if !ok || st.tokens == 0 || string(raw) == "null" {
		return
	}
	var u map[string]json.RawMessage
	if json.Unmarshal(raw, &u) != nil {
		return
	}
	num := func(k string) int64 { n, _ := strconv.ParseInt(string(u[k]), 10, 64); return n }
	prompt, completion := num("prompt_tokens"), num("completion_tokens")
	moved := min(int64(st.tokens), prompt)
	u["prompt_tokens"] = strconv.AppendInt(nil, prompt-moved, 10)
	u["completion_tokens"] = strconv.AppendInt(nil, completion+moved, 10)
	u["total_tokens"] = strconv.AppendInt(nil, prompt+completion, 10)
	b, err := json.Marshal(u)
	if err == nil {
		o.Set("usage", b)
	}
}

package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"strconv"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/wire/sse"
)

// Errors Write returns once it ended the stream with an error event of its own: the chat stream
// need not be read further.
var (
	// ErrEventTooLarge reports a chat stream event over Options.MaxEvent.
	ErrEventTooLarge = errors.New("a chat stream event exceeds the translation's limit")
	// ErrUntranslatable reports a chat stream event that cannot be translated.
	ErrUntranslatable = errors.New("a chat stream event cannot be translated")
)

// errBroken is the message of the error event that ends a stream cut off before its end.
const errBroken = "the answer broke off before its end"

// openBlock is the kind of the content block being streamed.
type openBlock int

const (
	blockNone openBlock = iota
	blockText
	blockTool
)

// Stream translates a chat completions event stream into Anthropic's event stream as it comes:
// message_start and ping at the first chunk, a content block per run of text and per tool call
// (content_block_start, content_block_delta with text_delta or input_json_delta,
// content_block_stop), then message_delta (stop_reason, usage) and message_stop at [DONE]. An
// error event of the chat stream, a stream that ends early and an event that cannot be
// translated end it with an Anthropic error event. It holds one event at a time.
type Stream struct {
	w io.Writer
	o Options

	in   sse.Reader // cuts the chat stream into events, at most Options.MaxEvent each
	data []byte     // the data of the event being read
	out  []byte     // the events translated from one Write

	started, done bool
	err           error // why the translation ended the stream itself
	next          int   // the index of the next content block
	open          openBlock
	tool          int // the chat index of the open tool call; maxTool the highest seen (-1: none)
	maxTool       int
	finish        *string
	workerStop    json.RawMessage
	usage         *chatUsage
}

// NewStream returns the translation of a chat stream written to it into w.
func NewStream(w io.Writer, o Options) *Stream {
	return &Stream{w: w, o: o, maxTool: -1, in: sse.Reader{Limit: int(min(o.MaxEvent, math.MaxInt32))}}
}

// Done reports whether the translated stream has ended (message_stop or an error event).
func (s *Stream) Done() bool { return s.done }

// Write feeds chat stream bytes and writes the Anthropic events they complete.
func (s *Stream) Write(p []byte) (int, error) {
	if !s.done {
		events, err := s.in.Feed(p)
		for ev := range sse.Events(events) {
			if s.done {
				break
			}
			s.event(ev)
		}
		if err != nil && !s.done {
			s.fail("an event of the answer exceeds gateway.max_event_size ("+strconv.Itoa(s.in.Limit)+" bytes)", ErrEventTooLarge)
		}
	}
	if err := s.flushOut(); err != nil {
		return len(p), err
	}
	return len(p), s.err
}

// flushOut writes the translated events.
func (s *Stream) flushOut() error {
	if len(s.out) == 0 {
		return nil
	}
	_, err := s.w.Write(s.out)
	s.out = s.out[:0]
	if err != nil {
		s.done = true
	}
	return err
}

// event reads one event of the chat stream: its data lines, joined by line breaks, are
// dispatched; comments and other fields are passed over.
func (s *Stream) event(ev []byte) {
	s.data = s.data[:0]
	for d := range sse.Data(ev) {
		if len(s.data) > 0 {
			s.data = append(s.data, '\n')
		}
		s.data = append(s.data, d...)
	}
	if len(s.data) > 0 {
		s.dispatch(s.data)
	}
}

// chatChunk is the part of a chat stream event the translation reads.
type chatChunk struct {
	ID      string `json:"id"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Content   json.RawMessage `json:"content"`
			ToolCalls []chatToolCall  `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string         `json:"finish_reason"`
		StopReason   json.RawMessage `json:"stop_reason"`
	} `json:"choices"`
	Usage *chatUsage      `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// dispatch translates one chat event.
func (s *Stream) dispatch(data []byte) {
	if s.done {
		return
	}
	if string(bytes.TrimSpace(data)) == "[DONE]" {
		s.end()
		return
	}
	var c chatChunk
	if err := json.Unmarshal(data, &c); err != nil {
		s.fail("the answer held an event that is not JSON", ErrUntranslatable)
		return
	}
	if present(c.Error) {
		s.fail(upstreamMessage(c.Error), nil) // the chat stream's own end
		return
	}
	if !s.started {
		s.start(c.ID, c.Model)
	}
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			continue // one choice: n is never set
		}
		if k := ch.Delta.Content; len(k) > 2 && k[0] == '"' {
			s.text(k)
		}
		for i, tc := range ch.Delta.ToolCalls {
			idx := i
			if tc.Index != nil {
				idx = *tc.Index
			}
			if !s.toolDelta(idx, tc) {
				return
			}
		}
		if ch.FinishReason != nil {
			s.finish, s.workerStop = ch.FinishReason, ch.StopReason
			s.closeBlock()
		}
	}
	if c.Usage != nil {
		s.usage = c.Usage
	}
}

// upstreamMessage is the message of a chat stream's error object, sanitised.
func upstreamMessage(raw json.RawMessage) string {
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &e) != nil || e.Message == "" {
		return errBroken
	}
	if m := apierror.Sanitize(e.Message); m != "" {
		return m
	}
	return errBroken
}

// start writes message_start and a ping.
func (s *Stream) start(chatID, model string) {
	s.started = true
	if model == "" {
		model = s.o.Model
	}
	s.out = append(s.out, `event: message_start
data: {"type":"message_start","message":{"id":`...)
	s.out = append(s.out, mustString(messageID(chatID, s.o.RequestID))...)
	s.out = append(s.out, `,"type":"message","role":"assistant","model":`...)
	s.out = append(s.out, mustString(model)...)
	s.out = append(s.out, `,"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}}

event: ping
data: {"type":"ping"}

`...)
}

// text writes a text delta (raw: a JSON string), opening a text block first if needed.
func (s *Stream) text(raw []byte) {
	if s.open != blockText {
		s.closeBlock()
		s.open = blockText
		s.out = append(s.out, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":"...)
		s.out = strconv.AppendInt(s.out, int64(s.next), 10)
		s.out = append(s.out, ",\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"...)
	}
	s.out = append(s.out, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":"...)
	s.out = strconv.AppendInt(s.out, int64(s.next), 10)
	s.out = append(s.out, ",\"delta\":{\"type\":\"text_delta\",\"text\":"...)
	s.out = append(s.out, raw...)
	s.out = append(s.out, "}}\n\n"...)
}

// toolDelta writes a tool call delta: a new call opens a tool_use block, its arguments are
// input_json_delta events. Deltas of a call whose block was closed cannot be translated (the
// blocks of a message are sequential): it reports false after failing the stream.
func (s *Stream) toolDelta(idx int, tc chatToolCall) bool {
	if s.open != blockTool || s.tool != idx {
		if idx <= s.maxTool {
			s.fail("the answer interleaved its tool calls, which cannot be streamed as Anthropic blocks", ErrUntranslatable)
			return false
		}
		s.closeBlock()
		s.open, s.tool, s.maxTool = blockTool, idx, idx
		s.out = append(s.out, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":"...)
		s.out = strconv.AppendInt(s.out, int64(s.next), 10)
		s.out = append(s.out, `,"content_block":{"type":"tool_use","id":`...)
		s.out = append(s.out, mustString(toolUseID(tc.ID, s.o.RequestID, idx))...)
		s.out = append(s.out, `,"name":`...)
		s.out = append(s.out, mustString(tc.Function.Name)...)
		s.out = append(s.out, ",\"input\":{}}}\n\n"...)
	}
	if tc.Function.Arguments == "" {
		return true
	}
	s.out = append(s.out, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":"...)
	s.out = strconv.AppendInt(s.out, int64(s.next), 10)
	s.out = append(s.out, `,"delta":{"type":"input_json_delta","partial_json":`...)
	s.out = append(s.out, mustString(tc.Function.Arguments)...)
	s.out = append(s.out, "}}\n\n"...)
	return true
}

// closeBlock writes content_block_stop for the open block.
func (s *Stream) closeBlock() {
	if s.open == blockNone {
		return
	}
	s.out = append(s.out, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":"...)
	s.out = strconv.AppendInt(s.out, int64(s.next), 10)
	s.out = append(s.out, "}\n\n"...)
	s.open = blockNone
	s.next++
}

// end writes message_delta and message_stop.
func (s *Stream) end() {
	if !s.started {
		s.start("", "")
	}
	s.closeBlock()
	reason, seq := stopReason(s.finish, s.workerStop, s.o.StopSequences, s.maxTool >= 0)
	delta, _ := json.Marshal(struct {
		Type  string `json:"type"`
		Delta struct {
			StopReason   string  `json:"stop_reason"`
			StopSequence *string `json:"stop_sequence"`
		} `json:"delta"`
		Usage usage `json:"usage"`
	}{Type: "message_delta", Delta: struct {
		StopReason   string  `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	}{reason, seq}, Usage: usageOf(s.usage)})
	s.out = append(s.out, "event: message_delta\ndata: "...)
	s.out = append(s.out, delta...)
	s.out = append(s.out, "\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"...)
	if s.finish == nil {
		s.finish = &reason
	}
	s.done = true
}

// fail ends the stream with an api_error event; err, when set, is what Write returns from now on.
func (s *Stream) fail(message string, err error) {
	if s.done {
		return
	}
	s.out = errorEvent(s.out, TypeAPI, message, s.o.RequestID)
	s.done, s.err = true, err
}

// Close ends a stream that has not ended, the chat stream having broken off, with an error event
// (unless its client went away: nothing is written then).
func (s *Stream) Close(clientGone bool) error {
	if s.done || clientGone {
		s.done = true
		return nil
	}
	s.fail(errBroken, nil)
	return s.flushOut()
}

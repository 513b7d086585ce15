package relay

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
	"github.com/epd-dev/coordinator/dataplane/wire"
	"github.com/epd-dev/coordinator/dataplane/wire/sse"
)

// ErrBroken reports a stream that ended before its end event after the client got part of it.
var ErrBroken = errors.New("the decode stream broke off")

var (
	dataDone = []byte("[DONE]")
	// bufs are the read buffers, one per relayed stream for its whole life: thousands of streams
	// are open at once, each reading one small event at a time (a longer one gathers in the
	// stream's reader).
	bufs = sync.Pool{New: func() any { b := make([]byte, 2<<10); return &b }}
	// batches hold the events of a stream not folded yet (Stream.unfolded).
	batches = sync.Pool{New: func() any { b := make([]byte, 0, foldAt); return &b }}
)

// Stream is one client's event stream, fed by one worker answer after another.
type Stream struct {
	w         http.ResponseWriter
	flusher   http.Flusher
	requestID string
	events    wire.Events
	numbered  int // numbered events written (the next sequence_number of a Responses stream)

	// in cuts the worker's bytes into complete events: a partial one is held until it ends, at
	// most the event limit (gateway.max_event_size).
	in sse.Reader
	// got is what the client got (wire.Got: chat and generate streams, the ones that are
	// continued; nil for the others). The events are folded into it in batches of foldAt bytes
	// (unfolded holds the batch): a short answer, which ends before its first batch does, is never
	// parsed at all.
	got      *wire.Got
	unfolded []byte
	batch    *[]byte // unfolded's pooled backing
	started  bool    // the response's status and headers are written
	done     bool    // the stream's end was forwarded

	// splice is set while a continuation is relayed: what its events are rewritten to.
	splice *wire.Splice
	// named are the headers the client gets besides the allow list of upstream.CopyResponseHeader.
	named []string
	// rc, when watched, receives the answer's statistics and token events (Watch).
	rc *request.Context
}

// Watch makes the stream report to rc what the client gets: each write's token events
// (rc.OnEvents), the served model and the usage (rc.Answer); with rc.HideUsage, the usage chunk
// (an empty choices list next to the usage) is read but not relayed.
func (s *Stream) Watch(rc *request.Context) { s.rc = rc }

// Limits bound what one stream holds.
type Limits struct {
	// MaxEvent bounds one event of a worker's stream, in bytes (gateway.max_event_size; 0: no
	// bound): a longer one breaks the stream.
	MaxEvent int64
	// Keep bounds what the stream keeps to be resumed from.
	Keep wire.Keep
}

// New returns the stream of a response in format f written to w, within lim, whose client gets
// the upstream headers upstream.CopyResponseHeader lets through with named; Release it when the
// response is done.
func New(w http.ResponseWriter, requestID string, f wire.Format, lim Limits, named []string) *Stream {
	fl, _ := w.(http.Flusher)
	ev := f.Events()
	return &Stream{w: w, flusher: fl, requestID: requestID, named: named, events: ev, got: ev.Got(lim.Keep),
		in: sse.Reader{Limit: int(min(lim.MaxEvent, math.MaxInt32))}}
}

// Release returns the stream's buffer to the pool and lets go of what it kept to be resumed
// from; the stream is not used afterwards.
func (s *Stream) Release() {
	if s.got != nil {
		s.got.Release()
	}
	if s.batch != nil {
		*s.batch = s.unfolded[:0]
		batches.Put(s.batch)
		s.batch, s.unfolded = nil, nil
	}
}

// Started reports whether the client got the response's headers (and at least one event).
func (s *Stream) Started() bool { return s.started }

// Relay forwards resp, an event stream, and closes it. It returns nil once the stream's end was
// forwarded; errors.Join(upstream.ErrNotStarted, err) when it broke before the client got
// anything (nothing was written: the leg may simply be retried); upstream.ErrClientGone; or
// ErrBroken when it ended or failed before its end after the client got part of it (an event
// over the limit is such a failure: an *apierror.Error naming gateway.max_event_size, wrapping
// sse.ErrTooLarge).
func (s *Stream) Relay(resp *http.Response) error {
	defer resp.Body.Close()
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
	buf := *bp
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			complete, ferr := s.in.Feed(buf[:n])
			if len(complete) > 0 {
				if err := s.feed(resp, complete); err != nil {
					return err
				}
			}
			if ferr != nil {
				rerr = eventTooLarge(s.in.Limit, ferr)
			}
		}
		switch {
		case rerr == nil:
			continue
		case s.done:
			return nil
		case errors.Is(rerr, io.EOF):
			rerr = io.ErrUnexpectedEOF // the worker closed the stream without [DONE]
		}
		s.in.Reset() // the dead worker's partial event is never sent
		if !s.started {
			return errors.Join(upstream.ErrNotStarted, rerr)
		}
		return errors.Join(ErrBroken, rerr)
	}
}

// feed forwards complete events.
func (s *Stream) feed(resp *http.Response, complete []byte) error {
	if s.splice != nil {
		complete = s.splice.Rewrite(complete)
		if len(complete) == 0 {
			return nil
		}
	}
	tokens := 0
	if s.rc != nil {
		if complete, tokens = s.observe(complete); len(complete) == 0 {
			return nil
		}
	}
	if !s.started {
		h := s.w.Header()
		upstream.CopyResponseHeader(h, resp.Header, s.named)
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
	if tokens > 0 && s.rc.OnEvents != nil {
		s.rc.OnEvents(tokens)
	}
	if s.got != nil {
		s.record(complete)
	}
	ended, n := s.events.Ended(complete)
	s.numbered += n
	s.done = s.done || ended
	return nil
}

// observe reads the statistics of complete events for s.rc and counts their token events. With
// rc.HideUsage it returns complete without its usage chunks (a copy: complete may be the read
// buffer); otherwise complete itself.
func (s *Stream) observe(complete []byte) ([]byte, int) {
	rc, tokens, at := s.rc, 0, 0
	var kept []byte // nil until an event is dropped: then the events before it, and those after
	for ev := range sse.Events(complete) {
		drop := false
		for d := range sse.Data(ev) {
			switch {
			case bytes.Equal(d, dataDone):
			case wire.ReadStats(&rc.Answer, d) && wire.UsageOnly(d):
				drop = rc.HideUsage
			case s.events.Token(d):
				tokens++
			}
		}
		switch {
		case drop && kept == nil:
			kept = append(make([]byte, 0, len(complete)), complete[:at]...)
		case !drop && kept != nil:
			kept = append(kept, ev...)
		}
		at += len(ev)
	}
	if kept == nil {
		return complete, tokens
	}
	return kept, tokens
}

// codeEventTooLarge is the error code of a worker's event over gateway.max_event_size.
const codeEventTooLarge = "event_too_large"

// eventTooLarge is the error of a worker's event over limit bytes: the worker's fault, told to
// the client with the key that bounds it (a stream that had not started answers it: 502).
func eventTooLarge(limit int, err error) error {
	return &apierror.Error{Status: http.StatusBadGateway, Type: apierror.TypeAPI, Code: codeEventTooLarge, Cause: err,
		Message: fmt.Sprintf("an event of the worker's stream is over gateway.max_event_size (%d bytes)", limit)}
}

// Fail ends the stream with an OpenAI error event (the response is then aborted by the caller:
// no terminating chunk, so every client reports an error) and returns ErrResponseTruncated
// with cause. A stream not yet started gets nothing: the caller answers the error itself. An
// event over the limit in cause is named in the event.
func (s *Stream) Fail(reason string, cause error) error {
	var e *apierror.Error
	if errors.As(cause, &e) && e.Code == codeEventTooLarge {
		reason += " (" + e.Message + ")"
	}
	if s.started {
		e := &apierror.Error{Type: apierror.TypeAPI, Code: "stream_interrupted",
			Message: "the answer broke off and could not be resumed: " + reason}
		if _, err := s.w.Write(s.events.Broken(e, s.requestID, s.numbered)); err == nil && s.flusher != nil {
			s.flusher.Flush()
		}
	}
	return errors.Join(upstream.ErrResponseTruncated, fmt.Errorf("%s: %w", reason, cause))
}

// Finish ends a stream whose last choice already finished but whose [DONE] was lost, when the
// client asked for no usage (base: the body it sent); it reports whether it could.
func (s *Stream) Finish(rc *request.Context, base *body.Object) bool {
	if s.got == nil || !s.folded().Finished() || (wire.IncludeUsage(base) && !rc.HideUsage) {
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

// foldAt is the size of the batches in which the events a client got are folded into its state.
const foldAt = 4 << 10

// record keeps complete, events the client got, for the state.
func (s *Stream) record(complete []byte) {
	if s.batch == nil {
		s.batch = batches.Get().(*[]byte)
		s.unfolded = (*s.batch)[:0]
	}
	if len(s.unfolded)+len(complete) > foldAt {
		s.got.Fold(s.unfolded)
		s.unfolded = s.unfolded[:0]
		if len(complete) > foldAt {
			s.got.Fold(complete)
			return
		}
	}
	s.unfolded = append(s.unfolded, complete...)
}

// folded is what the client got, every event it got folded in.
func (s *Stream) folded() *wire.Got {
	if len(s.unfolded) > 0 {
		s.got.Fold(s.unfolded)
		s.unfolded = s.unfolded[:0]
	}
	return s.got
}

// Continuation returns the body of a request for the rest of the answer (from base, the body
// the stream was asked with), to send on rc.Path with the decode profile; relays that follow
// splice its events into the stream. It returns an error saying why when the rest cannot be
// produced exactly (see docs/operations.md).
func (s *Stream) Continuation(rc *request.Context, base *body.Object) (*body.Object, error) {
	if s.got == nil {
		return nil, fmt.Errorf("%s streams are not resumed (only chat and tokens-in generate)", rc.API)
	}
	cont, sp, err := s.folded().Continue(base)
	if err != nil {
		return nil, err
	}
	s.splice = sp
	return cont, nil
}

// Package sse is the framing of server-sent events (the WHATWG event stream) as the coordinator
// reads and writes them: a Reader that cuts a byte stream into complete events, bounded in size
// and linear in its input however the bytes arrive, and the iterators over the events and data
// lines of complete events that every stream transformer uses (the relay and its resume, the
// force_stream fold, the Messages translation).
//
// An event ends at a blank line: "\n\n", or "\r\n\r\n" from a peer that ends its lines so. A
// data line is "data:" with an optional space before its payload; other fields and comments are
// passed over by Data.
package sse

import (
	"bytes"
	"errors"
	"fmt"
	"iter"
)

// ErrTooLarge reports an event longer than the reader's limit (its blank line not found within
// it): a peer that never ends its event cannot grow the reader's buffer past the limit.
var ErrTooLarge = errors.New("an event of the stream is over its size limit")

// Reader cuts a stream's bytes into complete events. Feed it what was read; it returns the
// events each feed completes. Every byte is scanned for the end of its event a bounded number of
// times, whatever the size of the reads, and a partial event is held only until it completes:
// at most Limit bytes of it, however long the peer makes it (the bytes past the limit are never
// copied).
type Reader struct {
	// Limit bounds one event, its blank line included (0: no bound).
	Limit int

	buf   []byte // held bytes: what the last Feed returned (buf[:start]), then a partial event
	start int
}

// shrinkAbove is the capacity over which an emptied buffer is let go, so that one long event
// does not keep its buffer for the rest of the stream.
const shrinkAbove = 64 << 10

// Feed takes p, the stream's next bytes, and returns the complete events they end, with the
// start held from earlier feeds: a slice valid until the next Feed (p itself when p holds whole
// events and nothing was held). A partial event is copied and held until it ends. When an event
// is over Limit, Feed drops it and returns ErrTooLarge, with the complete events before it; the
// stream cannot go on after that.
func (r *Reader) Feed(p []byte) ([]byte, error) {
	r.drop()
	held := len(r.buf)
	if held == 0 {
		end := lastEnd(p, 0)
		if end == len(p) {
			return r.fit(p) // the common case: the peer wrote whole events
		}
		var events []byte
		if end > 0 {
			events = p[:end]
		}
		tail := p[max(end, 0):]
		if r.over(len(tail)) {
			events, err := r.fit(events)
			if err == nil {
				err = r.tooLarge()
			}
			return events, err
		}
		r.hold(tail)
		return r.fit(events)
	}
	first := seamEnd(r.buf, p) // where the held event ends in p
	switch {
	case first < 0 && r.over(held+len(p)), first >= 0 && r.over(held+first):
		r.Reset()
		return nil, r.tooLarge()
	case first < 0:
		r.hold(p)
		return nil, nil
	}
	end := max(lastEnd(p, first), first)
	if r.over(len(p) - end) {
		// The events p completes are returned; the partial one after them is over the limit.
		r.hold(p[:end])
		r.start = len(r.buf)
		events, err := r.fit(r.buf)
		if err == nil {
			err = r.tooLarge()
		}
		return events, err
	}
	r.hold(p)
	r.start = held + end
	return r.fit(r.buf[:r.start])
}

// fit returns events, a run of complete events, when none is over the limit; otherwise the
// events before the first that is, and ErrTooLarge (the rest is dropped). Only a run longer
// than the limit is searched.
func (r *Reader) fit(events []byte) ([]byte, error) {
	if r.Limit == 0 || len(events) <= r.Limit {
		return events, nil
	}
	at := 0
	for ev := range Events(events) {
		if len(ev) > r.Limit {
			r.Reset()
			return events[:at], r.tooLarge()
		}
		at += len(ev)
	}
	return events, nil
}

// hold appends b to the held bytes. Under a limit the buffer grows to the limit at most (plus
// what one Feed completes), not to twice it.
func (r *Reader) hold(b []byte) {
	if need := len(r.buf) + len(b); r.Limit > 0 && need > cap(r.buf) {
		c := min(max(2*cap(r.buf), need), max(r.Limit, need))
		r.buf = append(make([]byte, 0, c), r.buf...)
	}
	r.buf = append(r.buf, b...)
}

// over reports whether n bytes of one event are over the limit.
func (r *Reader) over(n int) bool { return r.Limit > 0 && n > r.Limit }

func (r *Reader) tooLarge() error { return fmt.Errorf("%w (%d bytes)", ErrTooLarge, r.Limit) }

// Pending is how many bytes of an unfinished event the reader holds.
func (r *Reader) Pending() int { return len(r.buf) - r.start }

// Reset drops what the reader holds (a dead peer's partial event is never sent on).
func (r *Reader) Reset() {
	r.buf, r.start = r.buf[:0], 0
	if cap(r.buf) > shrinkAbove {
		r.buf = nil
	}
}

// drop gives up what the last Feed returned.
func (r *Reader) drop() {
	if r.start == 0 {
		return
	}
	n := copy(r.buf, r.buf[r.start:])
	r.buf, r.start = r.buf[:n], 0
	if n == 0 && cap(r.buf) > shrinkAbove {
		r.buf = nil
	}
}

// seamEnd is the index in p just past the first event end that completes in p, held being the
// bytes before p (an end split across the two is found: only held's last two bytes are looked
// at), or -1 when there is none.
func seamEnd(held, p []byte) int {
	n := len(held)
	switch {
	case len(p) == 0:
		return -1
	case n >= 1 && held[n-1] == '\n' && p[0] == '\n':
		return 1
	case n >= 1 && held[n-1] == '\n' && len(p) >= 2 && p[0] == '\r' && p[1] == '\n':
		return 2
	case n >= 2 && held[n-2] == '\n' && held[n-1] == '\r' && p[0] == '\n':
		return 1
	}
	return firstEnd(p)
}

// lastEnd is the index just past the last event end in b that ends after from-3 (an end split
// across feeds is found), or -1 when there is none.
func lastEnd(b []byte, from int) int {
	from = max(from-3, 0)
	tail := b[from:]
	if !bytes.Contains(tail, []byte("\n\n")) && !bytes.Contains(tail, []byte("\n\r\n")) {
		return -1 // a long event's common case, found by the vectorised forward search
	}
	// Backwards from the end, the first newline that closes a blank line ("\n\n" or "\n\r\n").
	for i := len(tail); ; {
		i = bytes.LastIndexByte(tail[:i], '\n')
		switch {
		case i < 1:
			return -1
		case tail[i-1] == '\n', tail[i-1] == '\r' && i >= 2 && tail[i-2] == '\n':
			return from + i + 1
		}
	}
}

// Events yields each event of b, complete events (the last one may lack its blank line), with
// its blank line.
func Events(b []byte) iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		for len(b) > 0 {
			ev := b
			if i := firstEnd(b); i >= 0 {
				ev, b = b[:i], b[i:]
			} else {
				b = nil
			}
			if !yield(ev) {
				return
			}
		}
	}
}

// firstEnd is the index just past the first event end in b, or -1.
func firstEnd(b []byte) int {
	for i := bytes.IndexByte(b, '\n'); i >= 0; {
		rest := b[i+1:]
		switch {
		case len(rest) > 0 && rest[0] == '\n':
			return i + 2
		case len(rest) > 1 && rest[0] == '\r' && rest[1] == '\n':
			return i + 3
		}
		k := bytes.IndexByte(rest, '\n')
		if k < 0 {
			return -1
		}
		i += 1 + k
	}
	return -1
}

// Lines yields each line of b without its line ending ("\n" or "\r\n").
func Lines(b []byte) iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		for len(b) > 0 {
			line := b
			if i := bytes.IndexByte(b, '\n'); i >= 0 {
				line, b = b[:i], b[i+1:]
			} else {
				b = nil
			}
			if !yield(bytes.TrimSuffix(line, []byte("\r"))) {
				return
			}
		}
	}
}

// Data yields the payload of every data line of b, complete events.
func Data(b []byte) iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		for line := range Lines(b) {
			if d, ok := DataOf(line); ok && !yield(d) {
				return
			}
		}
	}
}

// DataOf is the payload of a data line, and whether line is one.
func DataOf(line []byte) ([]byte, bool) {
	d, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return nil, false
	}
	return bytes.TrimPrefix(d, []byte(" ")), true
}

// AppendEvent appends an event of one data line, data, to dst.
func AppendEvent(dst, data []byte) []byte {
	dst = append(dst, "data: "...)
	dst = append(dst, data...)
	return append(dst, "\n\n"...)
}

// AppendNamed appends an event named name ("event: name") of one data line, data, to dst.
func AppendNamed(dst []byte, name string, data []byte) []byte {
	dst = append(dst, "event: "...)
	dst = append(dst, name...)
	dst = append(dst, '\n')
	return AppendEvent(dst, data)
}

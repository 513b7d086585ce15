package anthropic

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
)

// MaxAnswerBytes bounds a chat answer (or a worker's error) held whole for its translation.
const MaxAnswerBytes = 64 << 20

// writeMode is what a Writer does with the answer written to it, decided by its status.
type writeMode int

const (
	modeNone     writeMode = iota // nothing written yet
	modeStream                    // a 200 event stream: translated event by event
	modeWhole                     // a 200 JSON answer: held, translated at Finish
	modeError                     // an error status: held, written as an Anthropic error at Finish
	modeVerbatim                  // any other status (an async broker's 202): passed through
)

// Writer is the client response of a translated Messages request. The pipeline writes a chat
// completions answer to it as it would to the client; the client gets the Messages answer: a
// stream translated as it comes (flushed when the writer is), a JSON answer or a worker's error
// translated once whole (Finish). Answers of other statuses pass through.
type Writer struct {
	w       http.ResponseWriter
	flusher http.Flusher
	// h is the header the pipeline sets; it reaches the client's with the translated answer (a
	// failed translation leaves the client's header as it was, for the error written instead).
	h      http.Header
	o      Options
	mode   writeMode
	status int
	buf    []byte
	over   bool
	stream *Stream
}

// NewWriter returns the translating writer in front of w.
func NewWriter(w http.ResponseWriter, o Options) *Writer {
	f, _ := w.(http.Flusher)
	return &Writer{w: w, flusher: f, o: o, h: http.Header{}}
}

// Header is the header of the answer: it reaches the client with it, less Content-Length (the
// translation has a length of its own).
func (w *Writer) Header() http.Header { return w.h }

// commit writes the status and the answer's header to the client.
func (w *Writer) commit(status int) {
	dst := w.w.Header()
	for k, v := range w.h {
		if k != "Content-Length" {
			dst[k] = v
		}
	}
	w.w.WriteHeader(status)
}

// WriteHeader decides, from the status and the Content-Type, how the answer is translated.
func (w *Writer) WriteHeader(code int) {
	if w.mode != modeNone {
		return
	}
	w.status = code
	switch {
	case code == http.StatusOK && upstream.IsEventStream(w.h):
		w.mode = modeStream
		w.stream = NewStream(w.w, w.o)
		w.commit(code)
	case code == http.StatusOK:
		w.mode = modeWhole
	case code >= http.StatusBadRequest:
		w.mode = modeError
	default:
		w.mode = modeVerbatim
		if cl := w.h.Get("Content-Length"); cl != "" {
			w.w.Header().Set("Content-Length", cl) // passed through as it is
		}
		w.commit(code)
	}
}

// Write takes the answer's bytes (see WriteHeader).
func (w *Writer) Write(p []byte) (int, error) {
	if w.mode == modeNone {
		w.WriteHeader(http.StatusOK)
	}
	switch w.mode {
	case modeStream:
		return w.stream.Write(p)
	case modeVerbatim:
		return w.w.Write(p)
	}
	if len(w.buf)+len(p) > MaxAnswerBytes {
		w.over = true
		return len(p), nil
	}
	w.buf = append(w.buf, p...)
	return len(p), nil
}

// Flush flushes what was written to the client (streams and answers passed through).
func (w *Writer) Flush() {
	if (w.mode == modeStream || w.mode == modeVerbatim) && w.flusher != nil {
		w.flusher.Flush()
	}
}

// Unwrap is the client response (for http.ResponseController).
func (w *Writer) Unwrap() http.ResponseWriter { return w.w }

// Started reports whether the client got the response's status.
func (w *Writer) Started() bool { return w.mode == modeStream || w.mode == modeVerbatim }

// Finish completes the response once the pipeline returned err: a held answer is translated and
// written (a failed translation is a 502 for the caller to write), a stream that did not end
// gets an error event. It returns the error the request ended with.
func (w *Writer) Finish(err error) error {
	switch w.mode {
	case modeStream:
		if cerr := w.stream.Close(errors.Is(err, upstream.ErrClientGone)); cerr == nil {
			w.Flush()
		}
		return err
	case modeWhole:
		if err != nil {
			return err
		}
		if w.over {
			return &apierror.Error{Status: http.StatusBadGateway, Type: apierror.TypeAPI, Code: "answer_too_large",
				Message: "the answer is too large to translate: over " + strconv.Itoa(MaxAnswerBytes) + " bytes"}
		}
		out, terr := Answer(w.buf, w.o)
		if terr != nil {
			return &apierror.Error{Status: http.StatusBadGateway, Type: apierror.TypeAPI, Code: "untranslatable_answer",
				Message: "the worker's answer cannot be translated to a message", Cause: terr}
		}
		return w.send(http.StatusOK, out)
	case modeError:
		if err != nil {
			return err
		}
		e := apierror.From(&apierror.UpstreamError{Phase: "decode", Status: w.status, Body: w.buf, ContentType: w.h.Get("Content-Type")})
		e.Status = w.status // the worker's status, as a chat client gets it
		return w.send(w.status, ErrorBody(e, w.o.RequestID))
	}
	return err
}

// send writes a whole JSON response.
func (w *Writer) send(status int, b []byte) error {
	w.h.Set("Content-Type", "application/json")
	w.w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.commit(status)
	if _, err := w.w.Write(b); err != nil {
		return errors.Join(upstream.ErrClientGone, err)
	}
	return nil
}

package relay

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/budget"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
	"github.com/epd-dev/coordinator/dataplane/wire"
)

// Folder answers a non-streaming client from a stream (decode's force_stream): the decode leg is
// sent as a stream, so that it is continued when its decode worker dies, and its events are
// folded back into one JSON answer (wire.Fold). Each answer reserves
// n·(max_tokens·16 + 256) + 2048 bytes of a process-wide budget while it is assembled.
type Folder struct {
	limit      int64 // force_stream_buffer_size, bytes
	maxRequest int64 // force_stream_max_request_size, bytes
	// held is the process-wide count limit bounds, shared by every decode step and across
	// reloads.
	held *budget.Bytes
}

// NewFolder is a folder within limit bytes for all answers and maxRequest for one, counting on
// held (nil: a budget of its own).
func NewFolder(limit, maxRequest int64, held *budget.Bytes) *Folder {
	return &Folder{limit: limit, maxRequest: maxRequest, held: cmp.Or(held, &budget.Bytes{})}
}

// Held is the bytes folds hold now.
func (f *Folder) Held() int64 { return f.held.Held() }

// Admit decides whether rc's answer is folded from a stream and reserves its bytes; it reports
// the reservation (released by Fold) or false with the reason logged. Requests whose format is
// not folded (the Responses API), with tools or logprobs, without a token limit, or over the
// per-request or process budget go unstreamed.
func (f *Folder) Admit(rc *request.Context) (int64, bool) {
	limit, n, why := wire.FoldBound(rc)
	switch {
	case why != "":
		return f.skip(rc, why)
	case limit > f.maxRequest || n > f.maxRequest: // keeps the product below from overflowing
		return f.skip(rc, "budget")
	}
	reservation := n*(limit*16+256) + 2048
	if reservation > f.maxRequest || !f.held.Reserve(reservation, f.limit) {
		return f.skip(rc, "budget")
	}
	return reservation, true
}

func (f *Folder) skip(rc *request.Context, why string) (int64, bool) {
	rc.Log.V(logging.Debug).Info("decode not force-streamed", "reason", why)
	return 0, false
}

// Fold runs send, the decode leg relayed to a target that folds its stream (at most reservation
// bytes of assembled answer; the stream is resumed like any), and answers the client with the
// folded JSON. A stream that breaks off for good is a clean 502 (the client got nothing yet); a
// worker's error answer is relayed as it came. The reservation is released.
func (f *Folder) Fold(rc *request.Context, reservation int64, send func(Target) error) error {
	defer f.held.Release(reservation)
	held := &heldResponse{header: http.Header{}, limit: reservation, fold: wire.Of(rc.API).Events().Fold()}
	err := send(Target{W: held, Stream: true, Body: wire.Streamed(rc)})
	client := rc.Writer
	switch {
	case held.overflow:
		return &apierror.UpstreamError{Phase: resumePhase, Status: http.StatusOK,
			Err: fmt.Errorf("the streamed answer is larger than its %d bytes (force_stream)", reservation)}
	case err != nil && held.status == 0:
		return err // nothing came: the leg's own error
	case err != nil:
		return &apierror.UpstreamError{Phase: resumePhase, Status: http.StatusOK, Err: fmt.Errorf("force-streamed answer: %w", err)}
	case held.status != http.StatusOK || !upstream.IsEventStream(held.header):
		return held.relay(client, rc.ID, rc.ForwardResponse) // an error or an answer that did not stream: as it came
	}
	out, ferr := held.fold.Answer()
	if ferr != nil {
		return &apierror.UpstreamError{Phase: resumePhase, Status: http.StatusOK, Err: ferr}
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
	fold     *wire.Fold
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
	// An event stream reaches it through a Stream, which writes complete events only.
	if err := c.fold.Add(p); err != nil {
		return 0, err
	}
	if c.fold.Size() > c.limit {
		c.overflow = true
		return 0, errors.New("force-streamed answer over its reservation")
	}
	return len(p), nil
}

func (*heldResponse) Flush() {}

// relay writes the held response to w as it came.
func (c *heldResponse) relay(w http.ResponseWriter, requestID string, named []string) error {
	upstream.CopyResponseHeader(w.Header(), c.header, named)
	w.Header().Set(upstream.RequestIDHeader, requestID)
	w.WriteHeader(c.status)
	_, err := w.Write(c.body.Bytes())
	return err
}

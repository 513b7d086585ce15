package gateway

import (
	"io"
	"net/http"

	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/bodybuf"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
)

// NewLeg is a leg of rc, obj posted to path for profile, whose phase is the profile (see
// Outbound). Its x-request-id is its own, the request's id with the profile's suffix (-prefill,
// -encode; a decode leg keeps the request's id, as llm-d's coordinator does), and
// x-coordinator-request-id the request's: the endpoint picker keys per-request state on
// x-request-id. Legs of one profile in flight together take their own suffixes (WithID).
func NewLeg(rc *request.Context, profile, path string, obj *body.Object) Leg {
	r := Outbound(rc, profile, path, obj)
	r.ParentID = rc.ID
	if profile != ProfileDecode {
		r.RequestID = rc.ID + "-" + profile
	}
	return Leg{Profile: profile, Request: r}
}

// WithID returns leg with the x-request-id of its request followed by suffix (e.g. -encode-2,
// -reserve).
func (leg Leg) WithID(suffix string) Leg {
	leg.RequestID = leg.ParentID + suffix
	return leg
}

// Outbound returns a POST of obj to path with rc's forwarded headers and id, named phase: the
// request of a leg, or of a side service's call (render). The body, and every replay of it,
// holds a reference on the request's buffer until it has been sent; an answer's
// forward_response_headers are kept for the later legs. At trace level the body is logged,
// redacted. Safe for concurrent use (encode's legs are built in parallel, one per attempt).
func Outbound(rc *request.Context, phase, path string, obj *body.Object) upstream.Request {
	buf := rc.Buffer
	if buf == nil {
		buf = bodybuf.Of(nil) // the body's bytes are not pooled
	}
	var onAnswer func(http.Header)
	if len(rc.ForwardResponse) > 0 {
		onAnswer = rc.KeepForwarded
	}
	bufs, n := obj.Buffers()
	if l := rc.Log.V(logging.Trace); l.Enabled() {
		l.Info("leg request", "phase", phase, "path", path, "body", logging.RedactJSON(obj.Bytes()))
	}
	return upstream.Request{
		Path: path, Phase: phase, Header: rc.LegHeader(), RequestID: rc.ID, Body: buf.Open(bufs), Size: n,
		GetBody: func() (io.ReadCloser, error) { return buf.Open(bufs), nil }, OnAnswer: onAnswer,
	}
}

// With returns leg with header name set to value on a copy of its headers (the request's
// forwarded set, shared by all its legs, is never edited).
func (leg Leg) With(name, value string) Leg {
	h := leg.Header.Clone()
	if h == nil {
		h = make(http.Header, 1)
	}
	h.Set(name, value)
	leg.Header = h
	return leg
}

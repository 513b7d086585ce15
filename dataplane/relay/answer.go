// Package relay is an answer's way back to the client: a decode worker's answer relayed as it
// came (an error without a JSON body turned into the OpenAI error), read whole first when the
// client did not ask for a stream (so a break is retried, never cut), or, for a stream, relayed
// event by event and continued on another decode pick when its worker dies (Stream); and the
// answer of a non-streaming client folded from a stream (force_stream, Folder). What a format's
// events mean (their end, their tokens, their continuation) is package wire's; how events are
// framed is wire/sse's.
package relay

import (
	"context"
	"errors"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/retry"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
	"github.com/epd-dev/coordinator/dataplane/wire"
)

// DefaultMaxResumes is how many times one decode stream may be continued on another decode
// worker.
const DefaultMaxResumes = 2

// resumePhase names a continuation in metrics and errors: it is a decode leg.
const resumePhase = "decode"

// Target is where an answer is relayed: the writer, whether a stream was asked for, and the body
// a broken stream is continued from (the client's, or the one force_stream streams).
type Target struct {
	W      http.ResponseWriter
	Stream bool
	Body   *body.Object
	// Verify, when set, judges an answer that is not streamed once it is read whole (its usage in
	// rc.Answer), before anything is written: an error it returns is returned instead of the
	// answer, which the client never sees. Answers too large to hold and streams are not judged.
	Verify func(rc *request.Context) error
}

// ClientOf is the target of rc's client: its writer, as it asked.
func ClientOf(rc *request.Context) Target {
	return Target{W: rc.Writer, Stream: rc.Stream, Body: rc.Body}
}

// Answerer relays a decode worker's answer (decode, a conditional-decode hit, prefill-decode):
// an error status without a JSON body becomes the OpenAI error JSON; an answer that is not
// streamed is read whole first (up to MaxResponse), so a break is retried; an event stream goes
// through a Stream, so that a stream that breaks after the client got tokens is continued on
// another decode pick (at most MaxResumes times, within the request's allowance and the retry
// budget) or ends with an error event and an aborted body.
type Answerer struct {
	// MaxResumes is how many times one stream may be continued.
	MaxResumes int
	// MaxResponse bounds an answer read whole.
	MaxResponse int64
	// Limits bound each event of a stream and what it keeps to be resumed from.
	Limits Limits
	// Budget is the process's retry budget, which each continuation spends from.
	Budget *retry.Budget
	// Metrics counts resumes (nil: no metrics, and no answer statistics are read).
	Metrics *observe.Metrics
	// Resend sends a continuation, cont (a body of the client's format), and returns its
	// answer: a decode leg retried as gateway.Send does, or prefill-decode's new pair.
	Resend func(ctx context.Context, rc *request.Context, cont *body.Object) (*http.Response, error)
}

// Respond relays resp to t. It returns upstream.ErrNotStarted (joined with the cause) when the
// answer failed before the client got anything, so that the caller may retry the leg.
func (a Answerer) Respond(ctx context.Context, rc *request.Context, t Target, resp *http.Response, phase string) error {
	if resp.StatusCode >= 400 && !upstream.IsJSON(resp.Header.Get("Content-Type")) {
		// A text/plain 502 from the gateway, an HTML error page: the client gets OpenAI JSON.
		return upstream.ErrorOf(phase, resp)
	}
	if t.Stream && resp.StatusCode == http.StatusOK && upstream.IsEventStream(resp.Header) {
		return a.stream(ctx, rc, t, resp, phase)
	}
	var err error
	if t.Stream || resp.StatusCode != http.StatusOK {
		err = upstream.Relay(t.W, resp, rc.ID, t.Stream, rc.ForwardResponse)
	} else {
		// Held whole first: an answer that breaks off anywhere is retried, never cut. (A
		// worker's error is final anyway: it streams through, whatever its size.)
		var inspect func([]byte) error
		if a.Metrics != nil || rc.ReadAnswer || t.Verify != nil {
			inspect = func(b []byte) error {
				wire.ReadStats(&rc.Answer, b) // the served model and usage, for the metrics and the rate limit
				if t.Verify != nil {
					return t.Verify(rc)
				}
				return nil
			}
		}
		err = upstream.RelayWhole(t.W, resp, rc.ID, a.MaxResponse, rc.ForwardResponse, inspect)
	}
	logRelay(rc, err, phase)
	return err
}

// stream relays an event stream and resumes it when it breaks.
func (a Answerer) stream(ctx context.Context, rc *request.Context, t Target, resp *http.Response, phase string) error {
	st := New(t.W, rc.ID, wire.Of(rc.API), a.Limits, rc.ForwardResponse)
	defer st.Release()
	if a.Metrics != nil || rc.ReadAnswer {
		st.Watch(rc)
	}
	err := st.Relay(resp)
	for resumes := 0; err != nil && st.Started() && !errors.Is(err, upstream.ErrClientGone); resumes++ {
		if ctx.Err() != nil {
			return err
		}
		rc.Log.V(logging.Warn).Info("the decode stream broke off after the client got part of it", "phase", phase, "err", err.Error())
		if st.Finish(rc, t.Body) {
			return nil
		}
		cont, why := st.Continuation(rc, t.Body)
		switch {
		case why != nil:
			a.Metrics.StreamResume(observe.ResumeNotResumable)
			return a.fail(rc, st, why.Error(), err)
		case resumes >= a.MaxResumes:
			a.Metrics.StreamResume(observe.ResumeExhausted)
			return a.fail(rc, st, "the decode stream broke off too many times", err)
		case !retry.TakeRequest(ctx):
			a.Metrics.StreamResume(observe.ResumeExhausted)
			return a.fail(rc, st, "the request's retries are used up", err)
		case !a.Budget.Take():
			a.Metrics.RetryBudgetExhausted(resumePhase)
			a.Metrics.StreamResume(observe.ResumeExhausted)
			return a.fail(rc, st, "the retry budget is exhausted", err)
		}
		a.Metrics.StreamResume(observe.ResumeResumed)
		rc.Log.V(logging.Warn).Info("resuming the decode stream on another decode pick", "resume", resumes+1)
		trace.SpanFromContext(ctx).AddEvent("resume", trace.WithAttributes(attribute.Int("resume", resumes+1)))
		next, serr := a.Resend(ctx, rc, cont)
		if serr != nil {
			a.Metrics.StreamResume(observe.ResumeFailed)
			return a.fail(rc, st, "no decode worker could continue it", serr)
		}
		if next.StatusCode != http.StatusOK || !upstream.IsEventStream(next.Header) {
			up := upstream.ErrorOf(resumePhase, next)
			a.Metrics.StreamResume(observe.ResumeFailed)
			return a.fail(rc, st, "the decode worker refused to continue it", up)
		}
		err = st.Relay(next)
		if errors.Is(err, upstream.ErrNotStarted) {
			err = errors.Join(ErrBroken, err) // the client did get the start, from the first worker
		}
	}
	logRelay(rc, err, phase)
	return err
}

// fail ends a stream that cannot be resumed with an error event; the server aborts the body.
func (a Answerer) fail(rc *request.Context, st *Stream, why string, cause error) error {
	rc.Log.Error(cause, "the decode stream broke off and cannot be resumed; the client gets an error event", "why", why)
	return st.Fail(why, cause)
}

// logRelay logs how a relay ended when it did not end well.
func logRelay(rc *request.Context, err error, phase string) {
	switch {
	case err == nil, errors.Is(err, upstream.ErrNotStarted), errors.Is(err, upstream.ErrResponseTruncated) && errors.Is(err, ErrBroken):
	case errors.Is(err, upstream.ErrClientGone):
		rc.Log.V(logging.Verbose).Info("client went away during the response", "phase", phase, "err", err.Error())
	default:
		rc.Log.Error(err, "worker response broke off; the client's response is aborted", "phase", phase)
	}
}

package steps

import (
	"context"
	"errors"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/pipeline/params"
	"github.com/epd-dev/coordinator/dataplane/relay"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/dataplane/transport/retry"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
)

// defaultMaxResumes is how many times one decode stream may be continued on another decode
// worker.
const defaultMaxResumes = 2

// answerer relays a decode worker's answer to the client (decode, and a conditional-decode
// hit): an error status without a JSON body becomes the OpenAI error JSON; an answer that is
// not streamed is read whole first (up to gateway.max_response_size), so a break is retried;
// an event stream goes
// through a relay.Stream, so that a stream that breaks after the client got tokens is
// continued on another decode pick (at most maxResumes times, within the retry budget) or ends
// with an error event and an aborted body.
type answerer struct {
	gw         *gateway.Client
	maxResumes int
	metrics    *observe.Metrics
	// resend sends a continuation (nil: a decode leg, retried as gateway.Send does); the
	// prefill-decode step sends a new prefill with it.
	resend func(ctx context.Context, rc *request.Context, cont *body.Object) (*http.Response, error)
}

func newAnswerer(gw *gateway.Client, p *params.Params, metrics *observe.Metrics) answerer {
	return answerer{gw: gw, maxResumes: p.Int("max_resumes", defaultMaxResumes, 0), metrics: metrics}
}

// respond relays resp. It returns upstream.ErrNotStarted (joined with the cause) when the
// answer failed before the client got anything, so that the caller may retry the leg.
func (a answerer) respond(ctx context.Context, rc *request.Context, resp *http.Response, phase string) error {
	if resp.StatusCode >= 400 && !upstream.IsJSON(resp.Header.Get("Content-Type")) {
		// A text/plain 502 from the gateway, an HTML error page: the client gets OpenAI JSON.
		return upstream.ErrorOf(phase, resp)
	}
	if rc.Stream && resp.StatusCode == http.StatusOK && upstream.IsEventStream(resp.Header) {
		return a.stream(ctx, rc, resp, phase)
	}
	var err error
	if rc.Stream || resp.StatusCode != http.StatusOK {
		err = upstream.Relay(rc.Writer, resp, rc.ID, rc.Stream)
	} else {
		// Held whole first: an answer that breaks off anywhere is retried, never cut. (A
		// worker's error is final anyway: it streams through, whatever its size.)
		var inspect func([]byte)
		if a.metrics != nil {
			inspect = func(b []byte) { rc.Answer.Read(b) } // the served model and usage, for the metrics
		}
		err = upstream.RelayWhole(rc.Writer, resp, rc.ID, a.gw.MaxResponseBytes(), inspect)
	}
	logRelay(rc, err, phase)
	return err
}

// stream relays an event stream and resumes it when it breaks.
func (a answerer) stream(ctx context.Context, rc *request.Context, resp *http.Response, phase string) error {
	st := relay.New(rc.Writer, rc.ID, rc.API)
	defer st.Release()
	if a.metrics != nil {
		st.Watch(rc)
	}
	err := st.Relay(resp)
	for resumes := 0; err != nil && st.Started() && !errors.Is(err, upstream.ErrClientGone); resumes++ {
		if ctx.Err() != nil {
			return err
		}
		rc.Log.V(logging.Warn).Info("the decode stream broke off after the client got part of it", "phase", phase, "err", err.Error())
		if st.Finish(rc) {
			return nil
		}
		cont, why := st.Continuation(rc)
		switch {
		case why != nil:
			a.metrics.StreamResume(observe.ResumeNotResumable)
			return a.fail(rc, st, why.Error(), err)
		case resumes >= a.maxResumes:
			a.metrics.StreamResume(observe.ResumeExhausted)
			return a.fail(rc, st, "the decode stream broke off too many times", err)
		case !retry.TakeRequest(ctx):
			a.metrics.StreamResume(observe.ResumeExhausted)
			return a.fail(rc, st, "the request's retries are used up", err)
		case !a.gw.Retrier().Budget.Take():
			a.metrics.RetryBudgetExhausted(DecodeStep)
			a.metrics.StreamResume(observe.ResumeExhausted)
			return a.fail(rc, st, "the retry budget is exhausted", err)
		}
		a.metrics.StreamResume(observe.ResumeResumed)
		rc.Log.V(logging.Warn).Info("resuming the decode stream on another decode pick", "resume", resumes+1)
		trace.SpanFromContext(ctx).AddEvent("resume", trace.WithAttributes(attribute.Int("resume", resumes+1)))
		next, serr := a.send(ctx, rc, cont) //nolint:bodyclose // ErrorOf or the stream's Relay closes it
		if serr != nil {
			a.metrics.StreamResume(observe.ResumeFailed)
			return a.fail(rc, st, "no decode worker could continue it", serr)
		}
		if next.StatusCode != http.StatusOK || !upstream.IsEventStream(next.Header) {
			up := upstream.ErrorOf(DecodeStep, next)
			a.metrics.StreamResume(observe.ResumeFailed)
			return a.fail(rc, st, "the decode worker refused to continue it", up)
		}
		err = st.Relay(next)
		if errors.Is(err, upstream.ErrNotStarted) {
			err = errors.Join(relay.ErrBroken, err) // the client did get the start, from the first worker
		}
	}
	logRelay(rc, err, phase)
	return err
}

// send sends the continuation cont (see resend).
func (a answerer) send(ctx context.Context, rc *request.Context, cont *body.Object) (*http.Response, error) {
	if a.resend != nil {
		return a.resend(ctx, rc, cont)
	}
	return a.gw.Send(ctx, rc.Log, func() (gateway.Leg, error) {
		leg := rc.Leg(gateway.ProfileDecode, rc.Path, cont)
		leg.Stream = true
		return leg, nil
	})
}

// fail ends a stream that cannot be resumed with an error event; the server aborts the body.
func (a answerer) fail(rc *request.Context, st *relay.Stream, why string, cause error) error {
	rc.Log.Error(cause, "the decode stream broke off and cannot be resumed; the client gets an error event", "why", why)
	return st.Fail(why, cause)
}

// logRelay logs how a relay ended when it did not end well.
func logRelay(rc *request.Context, err error, phase string) {
	switch {
	case err == nil, errors.Is(err, upstream.ErrNotStarted), errors.Is(err, upstream.ErrResponseTruncated) && errors.Is(err, relay.ErrBroken):
	case errors.Is(err, upstream.ErrClientGone):
		rc.Log.V(logging.Verbose).Info("client went away during the response", "phase", phase, "err", err.Error())
	default:
		rc.Log.Error(err, "worker response broke off; the client's response is aborted", "phase", phase)
	}
}

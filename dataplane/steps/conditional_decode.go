package steps

import (
	"context"
	"errors"
	"net/http"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/relay"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/dataplane/transport/retry"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
	"github.com/epd-dev/coordinator/dataplane/wire"
)

// ConditionalDecodeStep is the type name of the decode-first fast path.
const ConditionalDecodeStep = "conditional-decode"

func init() { builder.Register(builder.Type{Name: ConditionalDecodeStep, New: newConditionalDecode}) }

// conditionalDecode tries decode alone first with "Prefer: if-available". A 412 means the decode
// worker cannot serve without the earlier phases: the pipeline continues. Any other answer is the
// response: it is streamed to the client and the pipeline stops.
type conditionalDecode struct {
	gw      *gateway.Client
	metrics *observe.Metrics
	ans     relay.Answerer
	hints   bool // read the 412's scheduling hints (hints.go)
}

func newConditionalDecode(deps builder.Deps, p *params.Params) (pipeline.Step, error) {
	deps.RequireGateway(p, ConditionalDecodeStep)
	// Accepted for compatibility with upstream configs; the leg always keeps the client's format.
	p.Bool(paramUseOpenAIFormat, true)
	return &conditionalDecode{gw: deps.Gateway, metrics: deps.Telemetry.Metrics, ans: newAnswerer(deps, p, resendDecode(deps.Gateway)), //nolint:bodyclose // the resend's answer is relayed and closed by the stream
		hints: p.Bool("hints", false)}, nil
}

func (*conditionalDecode) Name() string { return ConditionalDecodeStep }

func (s *conditionalDecode) Execute(ctx context.Context, rc *request.Context) error {
	leg := gateway.NewLeg(rc, gateway.ProfileDecode, rc.Path, wire.Of(rc.API).Conditional(rc)).WithID("-conditional")
	leg.Prefer = gateway.PreferIfAvailable
	leg.Phase = ConditionalDecodeStep
	leg.Stream = rc.Stream
	resp, err := s.gw.Do(ctx, leg) //nolint:bodyclose // upstream.Discard or respond closes it
	if err != nil {
		s.metrics.ConditionalDecode(observe.CondTransportError)
		if ctx.Err() != nil {
			return &apierror.UpstreamError{Phase: ConditionalDecodeStep, Err: err}
		}
		// The fast path is an optimisation: when it cannot be asked, run the full cascade.
		rc.Log.V(logging.Warn).Info("conditional decode failed; running the full pipeline", "err", err.Error())
		return nil
	}
	if resp.StatusCode == http.StatusPreconditionFailed {
		s.metrics.ConditionalDecode(observe.CondFellBack)
		if s.hints {
			var dropped int
			rc.Hints, dropped = gateway.ReadHints(resp.Header, s.gw.AllowedHintNetworks())
			if l := rc.Log.V(logging.Debug); l.Enabled() && (rc.Hints != nil || dropped > 0) {
				l.Info("conditional decode: the 412 hints where the later legs go", "hints", rc.Hints, "dropped", dropped)
			}
		}
		upstream.Discard(resp)
		rc.Log.V(logging.Verbose).Info("conditional decode: decode cannot serve directly (412); running the full pipeline")
		return nil
	}
	if _, unserved := retry.ClassifyStatus(resp.StatusCode, 0); unserved {
		// The picker shed it or no decode pod answered: the full cascade may still serve it.
		s.metrics.ConditionalDecode(observe.CondError)
		rc.Log.V(logging.Warn).Info("conditional decode not served; running the full pipeline", "status", resp.StatusCode)
		upstream.Discard(resp)
		return nil
	}
	if resp.StatusCode < 400 {
		s.metrics.ConditionalDecode(observe.CondServed)
	} else {
		s.metrics.ConditionalDecode(observe.CondError)
	}
	status := resp.StatusCode
	if err := s.ans.Respond(ctx, rc, relay.ClientOf(rc), resp, ConditionalDecodeStep); err != nil {
		if errors.Is(err, upstream.ErrNotStarted) {
			// Nothing reached the client: the full cascade serves it.
			rc.Log.V(logging.Warn).Info("conditional decode answer failed before its first byte; running the full pipeline", "err", err.Error())
			return nil
		}
		return err
	}
	if status >= 200 && status < 300 {
		s.metrics.PD(observe.PDAggregated) // a decode prefix-cache hit: no prefill, by policy
	}
	return pipeline.ErrDone
}

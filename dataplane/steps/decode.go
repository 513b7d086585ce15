package steps

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/connectors/kv"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/relay"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/dataplane/transport/retry"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
	"github.com/epd-dev/coordinator/dataplane/wire"
)

// DecodeStep is the type name of the terminal decode step.
const DecodeStep = "decode"

func init() { builder.Register(builder.Type{Name: DecodeStep, New: newDecode}) }

// Force-stream defaults (upstream llm-d-router steps/force_stream*.go at 6c95e02f/81d7e193).
const (
	defaultForceStreamBufferMiB     = 1024
	defaultForceStreamMaxRequestKiB = 256
)

// decode sends the final leg on the client's own path and format (EPP-Profile: decode) and
// relays the worker's answer to the client (relay.Answerer). A leg that fails before the client
// got anything is retried (gateway.retry); a stream that breaks later is resumed. With
// force_stream, a non-streaming client's leg is streamed and folded (relay.Folder).
type decode struct {
	gw    *gateway.Client
	kv    kv.Connector
	dp    kv.DataParallel
	ans   relay.Answerer
	force *relay.Folder // nil unless force_stream
	truth kvTruth
}

func newDecode(deps builder.Deps, p *params.Params) (pipeline.Step, error) {
	deps.RequireGateway(p, DecodeStep)
	c := kvConnector(deps, p)
	return &decode{gw: deps.Gateway, kv: c, dp: dataParallel(p, c), ans: newAnswerer(deps, p, resendDecode(deps.Gateway)), //nolint:bodyclose // the resend's answer is relayed and closed by the stream
		force: newFolder(p, deps), truth: newKVTruth(deps, p)}, nil
}

// newFolder reads force_stream and its budgets (nil: off).
func newFolder(p *params.Params, deps builder.Deps) *relay.Folder {
	on := p.Bool("force_stream", false)
	limit := int64(p.Int("force_stream_buffer_size", defaultForceStreamBufferMiB, 1)) << 20
	maxRequest := int64(p.Int("force_stream_max_request_size", defaultForceStreamMaxRequestKiB, 1)) << 10
	if maxRequest > limit {
		p.Fail("force_stream_max_request_size", "%d KiB is more than force_stream_buffer_size (%d MiB)", maxRequest>>10, limit>>20)
	}
	if !on {
		return nil
	}
	return relay.NewFolder(limit, maxRequest, deps.Shared.Folds)
}

var _ pipeline.Terminal = (*decode)(nil)

func (*decode) Name() string   { return DecodeStep }
func (*decode) Terminal() bool { return true }

// Execute sends the decode leg and relays its answer to the client, or folds it first
// (force_stream).
func (s *decode) Execute(ctx context.Context, rc *request.Context) error {
	if s.force != nil && !rc.Stream {
		if reservation, ok := s.force.Admit(rc); ok {
			return s.force.Fold(rc, reservation, func(t relay.Target) error { return s.send(ctx, rc, t) })
		}
	}
	return s.send(ctx, rc, relay.ClientOf(rc))
}

// send sends the decode leg, asking for t.Body as t's stream asks, and relays its answer to t.
// A retry after a prefill goes without the prefill's kv_transfer_params: the failed attempt's
// worker may have pulled (and freed) the KV blocks, so the new pick prefills the prompt itself.
// After a prefill, a first decode answer of 4xx is such a failed transfer and is retried so too.
// With strict_kv_transfer neither happens (a decode without the KV is a recompute, which strict
// mode refuses): every attempt carries the transfer parameters, a 4xx is the client's answer,
// and an answer held whole whose usage shows the prompt recomputed fails the request (kvTruth).
// After a prefill with kv-nixl and data_parallel_size > 1, every attempt carries the same
// X-Data-Parallel-Rank (rankOf). A served answer is counted in coordinator_pd_requests_total.
func (s *decode) send(ctx context.Context, rc *request.Context, t relay.Target) error {
	obj, err := s.body(rc, t.Body, true)
	if err != nil {
		return err
	}
	rank, pinned := s.rankOf(rc)
	strict := s.truth.strict && rc.Prefilled
	if strict && !t.Stream {
		t.Verify = s.truth.verifier()
	}
	sentKV, served := rc.Prefilled, false
	_, err = gateway.Do(ctx, s.gw.Retrier(), rc.Log, func(attempt int) (struct{}, error) {
		if attempt == 2 && rc.Prefilled && !strict {
			var err error
			if obj, err = s.body(rc, t.Body, false); err != nil {
				return struct{}{}, err
			}
			sentKV = false
		}
		leg := gateway.NewLeg(rc, gateway.ProfileDecode, rc.Path, obj)
		if pinned {
			leg = leg.With(kv.DataParallelRankHeader, strconv.Itoa(rank))
		}
		leg.Stream = t.Stream
		resp, err := s.gw.Do(ctx, leg) //nolint:bodyclose // ErrorOf or Respond closes it
		if err != nil {
			return struct{}{}, retry.IfUnserved(ctx, DecodeStep, &apierror.UpstreamError{Phase: DecodeStep, Err: err})
		}
		if f, again := retry.ClassifyStatus(resp.StatusCode, upstream.RetryAfter(resp.Header)); again {
			return struct{}{}, retry.Again(DecodeStep, f, upstream.ErrorOf(DecodeStep, resp))
		}
		if attempt == 1 && rc.Prefilled && !strict && resp.StatusCode >= 400 && resp.StatusCode < 500 {
			// The prefill accepted this very request, so a decode rejecting it is a KV transfer
			// that failed (the prefill worker died, its blocks were freed): the retry goes
			// without the transfer parameters and the decode worker prefills itself.
			return struct{}{}, retry.Again(DecodeStep, retry.Failure{Reason: retry.ReasonKVTransfer}, upstream.ErrorOf(DecodeStep, resp))
		}
		status := resp.StatusCode
		err = s.ans.Respond(ctx, rc, t, resp, DecodeStep)
		if errors.Is(err, upstream.ErrNotStarted) {
			// Nothing reached the client: the break decides, whatever the status.
			err = &apierror.UpstreamError{Phase: DecodeStep, Status: resp.StatusCode, Err: err}
			if f, again := retry.ClassifyError(ctx, err); again {
				return struct{}{}, retry.Again(DecodeStep, f, err)
			}
		}
		served = err == nil && status >= 200 && status < 300
		return struct{}{}, err
	}, nil)
	if served {
		s.truth.count(rc, sentKV)
	}
	return err
}

// rankOf returns the data-parallel rank the decode legs are pinned to; pinned is false when they
// are not. They are only after a prefill, with kv-nixl and data_parallel_size > 1: to the rank
// the prefill worker answered in remote_dp_rank when valid, else to the prefill leg's own (the
// request id's hash).
func (s *decode) rankOf(rc *request.Context) (rank int, pinned bool) {
	if !rc.Prefilled {
		return 0, false
	}
	rank, answered, pinned := s.dp.DecodeRank(rc.ID, rc.PrefillKV)
	if l := rc.Log.V(logging.Debug); pinned && l.Enabled() {
		l.Info("decode pinned to a data-parallel rank", "rank", rank, "from_prefill_answer", answered)
	}
	return rank, pinned
}

// body is the format's decode body from base with, only after a prefill and unless !withKV, the
// KV connector's kv_transfer_params derived from the prefill worker's answer.
func (s *decode) body(rc *request.Context, base *body.Object, withKV bool) (*body.Object, error) {
	var kvRaw json.RawMessage
	if rc.Prefilled && withKV {
		var err error
		if kvRaw, err = s.kv.DecodeParams(rc.PrefillKV); err != nil {
			return nil, &apierror.UpstreamError{Phase: PrefillStep, Status: 200, Err: err}
		}
	}
	return wire.Of(rc.API).Decode(rc, base, kvRaw)
}

package steps

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/connectors/kv"
	"github.com/epd-dev/coordinator/dataplane/media"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/pipeline/params"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/dataplane/transport/retry"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
)

// DecodeStep is the type name of the terminal decode step.
const DecodeStep = "decode"

func init() { builder.Register(builder.Type{Name: DecodeStep, New: newDecode}) }

// decode sends the final leg on the client's own path and format (EPP-Profile: decode) and
// streams the worker's answer back to the client byte for byte (see answerer). A leg that fails
// before the client got anything is retried (gateway.retry); a stream that breaks later is
// resumed.
type decode struct {
	gw    *gateway.Client
	kv    kv.Connector
	dp    kv.DataParallel
	ans   answerer
	force *forceStream // nil unless force_stream
}

func newDecode(deps builder.Deps, p *params.Params) (pipeline.Step, error) {
	deps.RequireGateway(p, DecodeStep)
	c := kvConnector(deps, p)
	return &decode{gw: deps.Gateway, kv: c, dp: dataParallel(p, c), ans: newAnswerer(deps.Gateway, p, deps.Telemetry.Metrics),
		force: newForceStream(p, deps.Shared.Folds)}, nil
}

var _ pipeline.Terminal = (*decode)(nil)

func (*decode) Name() string   { return DecodeStep }
func (*decode) Terminal() bool { return true }

// Execute sends the decode leg. A retry after a prefill goes without the prefill's
// kv_transfer_params: the failed attempt's worker may have pulled (and freed) the KV blocks, so
// the new pick prefills the prompt itself. After a prefill, a first decode answer of 4xx is
// such a failed transfer and is retried so too. After a prefill with kv-nixl and
// data_parallel_size > 1, every attempt carries the same X-Data-Parallel-Rank (rankOf).
func (s *decode) Execute(ctx context.Context, rc *request.Context) error {
	if s.force != nil && !rc.Stream {
		if reservation, ok := s.force.admit(rc); ok {
			return s.forced(ctx, rc, reservation)
		}
	}
	return s.send(ctx, rc)
}

// send sends the decode leg and relays its answer (see Execute).
func (s *decode) send(ctx context.Context, rc *request.Context) error {
	obj, err := s.body(rc, true)
	if err != nil {
		return err
	}
	rank, pinned := s.rankOf(rc)
	_, err = gateway.Do(ctx, s.gw.Retrier(), rc.Log, func(attempt int) (struct{}, error) {
		if attempt == 2 && rc.Prefilled {
			var err error
			if obj, err = s.body(rc, false); err != nil {
				return struct{}{}, err
			}
		}
		leg := rc.Leg(gateway.ProfileDecode, rc.Path, obj)
		if pinned {
			leg = pinRank(leg, rank)
		}
		leg.Stream = rc.Stream
		resp, err := s.gw.Do(ctx, leg) //nolint:bodyclose // ErrorOf or respond closes it
		if err != nil {
			return struct{}{}, retry.IfUnserved(ctx, DecodeStep, &apierror.UpstreamError{Phase: DecodeStep, Err: err})
		}
		if f, again := retry.ClassifyStatus(resp.StatusCode, upstream.RetryAfter(resp.Header)); again {
			return struct{}{}, retry.Again(DecodeStep, f, upstream.ErrorOf(DecodeStep, resp))
		}
		if attempt == 1 && rc.Prefilled && resp.StatusCode >= 400 && resp.StatusCode < 500 {
			// The prefill accepted this very request, so a decode rejecting it is a KV transfer
			// that failed (the prefill worker died, its blocks were freed): the retry goes
			// without the transfer parameters and the decode worker prefills itself.
			return struct{}{}, retry.Again(DecodeStep, retry.Failure{Reason: retry.ReasonKVTransfer}, upstream.ErrorOf(DecodeStep, resp))
		}
		err = s.ans.respond(ctx, rc, resp, DecodeStep)
		if errors.Is(err, upstream.ErrNotStarted) {
			// Nothing reached the client: the break decides, whatever the status.
			err = &apierror.UpstreamError{Phase: DecodeStep, Status: resp.StatusCode, Err: err}
			if f, again := retry.ClassifyError(ctx, err); again {
				return struct{}{}, retry.Again(DecodeStep, f, err)
			}
		}
		return struct{}{}, err
	}, nil)
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

// body is decodeBody with, only after a prefill and unless !withKV, the KV connector's
// kv_transfer_params derived from the prefill worker's answer.
func (s *decode) body(rc *request.Context, withKV bool) (*body.Object, error) {
	var kvRaw json.RawMessage
	if rc.Prefilled && withKV {
		var err error
		if kvRaw, err = s.kv.DecodeParams(rc.PrefillKV); err != nil {
			return nil, &apierror.UpstreamError{Phase: PrefillStep, Status: 200, Err: err}
		}
	}
	return decodeBody(rc, kvRaw)
}

// decodeBody is the client body plus what earlier phases produced: the rendered tokens (chat:
// tokens{token_ids, features}, with each media part's uuid; completions: prompt as token ids) and
// kvRaw as kv_transfer_params when not nil (generate: in sampling_params.extra_args). With
// neither render nor kvRaw it is the client body unchanged.
func decodeBody(rc *request.Context, kvRaw json.RawMessage) (*body.Object, error) {
	obj := rc.Body.Clone()
	switch rc.API {
	case request.APIChat, request.APIResponses:
		if rc.Rendered {
			if err := media.SetUUIDs(obj, mediaLayout(rc.API), rc.Media); err != nil {
				return nil, err
			}
			obj.Set("tokens", tokensJSON(rc))
		}
		if kvRaw != nil {
			obj.Set("kv_transfer_params", kvRaw)
		}
	case request.APICompletions:
		if rc.Rendered && len(rc.TokenIDs) > 0 {
			obj.Set("prompt", rc.TokenIDsJSON())
		}
		if kvRaw != nil {
			obj.Set("kv_transfer_params", kvRaw)
		}
	case request.APIGenerate:
		if kvRaw != nil {
			if err := setExtraArgs(obj, map[string]json.RawMessage{"kv_transfer_params": kvRaw}); err != nil {
				return nil, err
			}
		}
	}
	return obj, nil
}

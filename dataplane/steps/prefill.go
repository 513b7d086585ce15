package steps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/connectors/ec"
	"github.com/epd-dev/coordinator/dataplane/connectors/kv"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/dataplane/transport/retry"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
	"github.com/epd-dev/coordinator/dataplane/wire"
)

// PrefillStep is the type name of the prefill step.
const PrefillStep = "prefill"

func init() { builder.Register(builder.Type{Name: PrefillStep, New: newPrefill}) }

// prefill sends one single-token leg (EPP-Profile: prefill) carrying the KV connector's
// kv_transfer_params and the merged ec_transfer_params (and, with kv-nixl and
// data_parallel_size > 1, X-Data-Parallel-Rank), and keeps the worker's kv_transfer_params
// answer for decode.
type prefill struct {
	gw        *gateway.Client
	kv        kv.Connector
	dp        kv.DataParallel
	ec        ec.Connector
	useOpenAI bool
	pool      retry.PoolPolicy
}

func newPrefill(deps builder.Deps, p *params.Params) (pipeline.Step, error) {
	deps.RequireGateway(p, PrefillStep)
	c := kvConnector(deps, p)
	if c != nil && c.Name() == kv.SGLang {
		// SGLang's prefill waits for its decode to join the transfer: sent first, it never
		// completes (llm-d-router#2974).
		p.Fail(paramKVConnector, "%s needs prefill and decode in flight together: use the %s step in place of %s and %s",
			kv.SGLang, PrefillDecodeStep, PrefillStep, DecodeStep)
	}
	return &prefill{gw: deps.Gateway, kv: c, dp: dataParallel(p, c), ec: ecConnector(p), useOpenAI: p.Bool(paramUseOpenAIFormat, true),
		pool: onPoolFailure(deps, p)}, nil
}

func (*prefill) Name() string { return PrefillStep }

// Execute sends the prefill leg, retried with a fresh body per attempt (a kv-sglang bootstrap
// room is new each time) and the same data-parallel rank; a pool that cannot serve it is handled
// by pipeline.on_pool_failure. After a degraded encode it does nothing: decode serves the
// request alone.
func (s *prefill) Execute(ctx context.Context, rc *request.Context) error {
	if rc.Degraded != "" {
		return nil
	}
	format := wire.Of(rc.API).Legs(s.useOpenAI)
	rank, pinned := s.dp.PrefillRank(rc.ID)
	out, err := s.gw.Fetch(ctx, rc.Log, gateway.Hinted(rc, gateway.ProfilePrefill, 0, func() (gateway.Leg, error) {
		obj, err := format.Prefill(rc, s.transfer(rc))
		if err != nil {
			return gateway.Leg{}, err
		}
		leg := gateway.NewLeg(rc, gateway.ProfilePrefill, format.Path(), obj)
		if pinned {
			leg = leg.With(kv.DataParallelRankHeader, strconv.Itoa(rank))
		}
		return leg, nil
	}))
	if err != nil {
		return s.pool.Handle(ctx, rc, PrefillStep, err)
	}
	// The answer is validated once and only its kv_transfer_params taken: with a long prompt it
	// lists thousands of KV blocks, which are handed to decode raw.
	answer, err := body.Parse(out)
	if err != nil {
		return &apierror.UpstreamError{Phase: PrefillStep, Status: 200, Body: upstream.Head(out), Err: errors.New("decoding answer: not a JSON object")}
	}
	if kv, _ := answer.Get("kv_transfer_params"); body.KindOf(kv) == body.KindObject {
		rc.PrefillKV = kv
	}
	rc.Prefilled, rc.PrefillEnd = true, time.Now()
	return nil
}

// transfer are the prefill leg's transfer parameters: the KV connector's (none for
// prefill-decode, whose SGLang bootstrap fields replace them) and the merged encoder descriptors
// (with a connector that sends them).
func (s *prefill) transfer(rc *request.Context) wire.Transfer {
	var t wire.Transfer
	if s.kv != nil {
		t.KV = s.kv.PrefillParams()
	}
	t.EC = s.ecParams(rc)
	return t
}

// ecParams are the request's merged ec_transfer_params as a prefill leg carries them (nil:
// none, or a connector whose descriptors travel by shared storage).
func (s *prefill) ecParams(rc *request.Context) json.RawMessage {
	if len(rc.ECParams) == 0 || s.ec.Name() == ec.SharedStorage {
		return nil
	}
	b, err := json.Marshal(rc.ECParams)
	if err != nil {
		panic(fmt.Sprintf("steps: encoding the EC descriptors: %v", err)) // decoded from JSON: always encodable
	}
	return b
}

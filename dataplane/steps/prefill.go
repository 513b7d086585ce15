package steps

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/connectors/ec"
	"github.com/epd-dev/coordinator/dataplane/connectors/kv"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/pipeline/params"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
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
	pool      poolPolicy
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

// dataParallel reads data_parallel_size (≥ 1, default 1) for the step's KV connector c (nil when
// kv_connector was invalid, already reported): more than 1 is accepted with kv-nixl only.
func dataParallel(p *params.Params, c kv.Connector) kv.DataParallel {
	size := p.Int(kv.ParamDataParallelSize, 1, 1)
	if c == nil {
		return kv.DataParallel{}
	}
	dp, err := kv.NewDataParallel(c.Name(), size)
	if err != nil {
		p.Fail(kv.ParamDataParallelSize, "%v", err)
	}
	return dp
}

// pinRank returns leg with X-Data-Parallel-Rank set to rank, replacing a trusted client's own
// value.
func pinRank(leg gateway.Leg, rank int) gateway.Leg {
	return withHeader(leg, kv.DataParallelRankHeader, strconv.Itoa(rank))
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
	format := rc.API.Format(s.useOpenAI)
	rank, pinned := s.dp.PrefillRank(rc.ID)
	out, err := s.gw.Fetch(ctx, rc.Log, hinted(rc, gateway.ProfilePrefill, 0, func() (gateway.Leg, error) {
		obj, err := s.body(rc, format)
		if err != nil {
			return gateway.Leg{}, err
		}
		leg := rc.Leg(gateway.ProfilePrefill, format.Path(), obj)
		if pinned {
			leg = pinRank(leg, rank)
		}
		return leg, nil
	}))
	if err != nil {
		return s.pool.handle(ctx, rc, PrefillStep, err)
	}
	// The answer is validated once and only its kv_transfer_params taken: with a long prompt it
	// lists thousands of KV blocks, which are handed to decode raw.
	answer, err := body.Parse(out)
	if err != nil {
		return &apierror.UpstreamError{Phase: PrefillStep, Status: 200, Body: head(out), Err: errors.New("decoding answer: not a JSON object")}
	}
	if kv, _ := answer.Get("kv_transfer_params"); body.KindOf(kv) == body.KindObject {
		rc.PrefillKV = kv
	}
	rc.Prefilled, rc.PrefillEnd = true, time.Now()
	return nil
}

// body builds the prefill leg in the leg format:
//   - chat: the client body, capped to one token, with tokens{token_ids, features} when render
//     ran, kv_transfer_params and ec_transfer_params (when there are any);
//   - completions: the client body, capped, with request_id, the prompt as token ids when render
//     ran, kv_transfer_params, features and ec_transfer_params when there are media;
//   - generate: token_ids and features plus the client's sampling_params when the client itself
//     spoke generate, capped, transfer params in sampling_params.extra_args.
//
// The features carry kwargs_data, or mm_metadata instead when the leg carries ec_transfer_params
// and render gave every item metadata (prefillPayload): the worker gets the encoder outputs
// through the EC connector and needs no pixel values.
//
// Unlike upstream, completions and generate keep the client's sampling fields.
func (s *prefill) body(rc *request.Context, format request.API) (*body.Object, error) {
	var kvRaw json.RawMessage // none for prefill-decode: SGLang's bootstrap fields replace them
	if s.kv != nil {
		kvRaw = s.kv.PrefillParams()
	}
	var ecRaw json.RawMessage
	if len(rc.ECParams) > 0 && s.ec.Name() != ec.SharedStorage {
		ecRaw = mustJSON(rc.ECParams)
	}
	payload := prefillPayload(rc.Media, ecRaw != nil)
	var obj *body.Object
	switch format {
	case request.APIChat, request.APIResponses:
		obj = rc.Body.Clone()
		if rc.Rendered {
			obj.Set("tokens", tokensJSON(rc))
		}
		if kvRaw != nil {
			obj.Set("kv_transfer_params", kvRaw)
		}
		if ecRaw != nil {
			obj.Set("ec_transfer_params", ecRaw)
		}
	case request.APICompletions:
		obj = rc.Body.Clone()
		obj.Set("request_id", mustJSON(rc.ID))
		if rc.Rendered && len(rc.TokenIDs) > 0 {
			obj.Set("prompt", rc.TokenIDsJSON())
		}
		if kvRaw != nil {
			obj.Set("kv_transfer_params", kvRaw)
		}
		if f := featuresJSON(rc.Media, payload); f != nil {
			obj.Set("features", f)
		}
		if ecRaw != nil {
			obj.Set("ec_transfer_params", ecRaw)
		}
	case request.APIGenerate:
		obj = generateBody(rc, payload)
		extra := map[string]json.RawMessage{}
		if kvRaw != nil {
			extra["kv_transfer_params"] = kvRaw
		}
		if ecRaw != nil {
			extra["ec_transfer_params"] = ecRaw
		}
		if len(extra) > 0 {
			if err := setExtraArgs(obj, extra); err != nil {
				return nil, err
			}
		}
	}
	if err := capSingleToken(obj, format); err != nil {
		return nil, err
	}
	return obj, nil
}

// continuation is the prefill leg of a resumed stream's continuation cont (a chat or generate
// body in the client's format): cont capped to one token, its ec_transfer_params replaced by
// the request's merged ones.
func (s *prefill) continuation(rc *request.Context, cont *body.Object) (*body.Object, error) {
	obj := cont.Clone()
	if len(rc.ECParams) > 0 && s.ec.Name() != ec.SharedStorage {
		ecRaw := mustJSON(rc.ECParams)
		if rc.API == request.APIGenerate {
			if err := setExtraArgs(obj, map[string]json.RawMessage{"ec_transfer_params": ecRaw}); err != nil {
				return nil, err
			}
		} else {
			obj.Set("ec_transfer_params", ecRaw)
		}
	}
	if err := capSingleToken(obj, rc.API); err != nil {
		return nil, err
	}
	return obj, nil
}

// generateBody is the tokens-in body of a leg: {request_id, model, token_ids, features (with
// payload), sampling_params}. A generate client's own body is the base (its sampling_params and
// features are kept); a chat client's is translated.
func generateBody(rc *request.Context, payload mmPayload) *body.Object {
	var obj *body.Object
	if rc.API == request.APIGenerate {
		obj = rc.Body.Clone() // already tokens-in: token_ids and features are the client's
	} else {
		obj = &body.Object{}
		if raw, ok := rc.Body.Get("model"); ok {
			obj.Set("model", raw)
		}
		obj.Set("token_ids", rc.TokenIDsJSON())
		if f := featuresJSON(rc.Media, payload); f != nil {
			obj.Set("features", f)
		}
	}
	obj.Set("request_id", mustJSON(rc.ID))
	if !obj.Has("sampling_params") {
		obj.Set("sampling_params", json.RawMessage("{}"))
	}
	return obj
}

// head returns the start of an upstream body for logs.
func head(b []byte) []byte {
	if len(b) > 512 {
		return b[:512]
	}
	return b
}

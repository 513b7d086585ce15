package steps

import (
	"context"
	"encoding/json"

	"github.com/epd-dev/coordinator/dataplane/apierror"
	"github.com/epd-dev/coordinator/dataplane/body"
	"github.com/epd-dev/coordinator/dataplane/connectors/kv"
	"github.com/epd-dev/coordinator/dataplane/gateway"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline/registry"
	"github.com/epd-dev/coordinator/dataplane/request"
)

// DecodeStep is the type name of the terminal decode step.
const DecodeStep = "decode"

func init() { registry.Register(registry.Type{Name: DecodeStep, New: newDecode}) }

// decode sends the final leg on the client's own path and format (EPP-Profile: decode) and
// streams the worker's answer, whatever its status, back to the client byte for byte.
type decode struct {
	gw *gateway.Client
	kv kv.Connector
}

func newDecode(deps registry.Deps, p *params.Params) (pipeline.Step, error) {
	deps.RequireGateway(p, DecodeStep)
	return &decode{gw: deps.Gateway, kv: kvConnector(deps, p)}, nil
}

var _ pipeline.Terminal = (*decode)(nil)

func (*decode) Name() string   { return DecodeStep }
func (*decode) Terminal() bool { return true }

func (s *decode) Execute(ctx context.Context, rc *request.Context) error {
	obj, err := s.body(rc)
	if err != nil {
		return err
	}
	resp, err := s.gw.Do(ctx, rc.Leg(gateway.ProfileDecode, rc.Path, obj)) //nolint:bodyclose // respond closes it
	if err != nil {
		return &apierror.UpstreamError{Phase: DecodeStep, Err: err}
	}
	return respond(rc, resp, DecodeStep)
}

// body is the client body plus what earlier phases produced: the rendered tokens (chat:
// tokens{token_ids, features}, with each media part's uuid; completions: prompt as token ids) and,
// only after a prefill, the KV connector's kv_transfer_params derived from the prefill worker's
// answer (generate: in sampling_params.extra_args). With neither
// render nor prefill it is the client body unchanged.
func (s *decode) body(rc *request.Context) (*body.Object, error) {
	obj := rc.Body.Clone()
	var kvRaw json.RawMessage
	if rc.Prefilled {
		var err error
		if kvRaw, err = s.kv.DecodeParams(rc.PrefillKV); err != nil {
			return nil, &apierror.UpstreamError{Phase: PrefillStep, Status: 200, Err: err}
		}
	}
	switch rc.API {
	case request.APIChat:
		if rc.Rendered {
			if err := setMediaUUIDs(rc, obj); err != nil {
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

package wire

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/media"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// completions is OpenAI's text completions: a prompt string (or token ids); its legs carry the
// rendered prompt as the prompt's token ids. Its encode and prefill legs stay completions
// whatever use_openai_format says, as upstream.
type completions struct{}

func (completions) API() request.API { return request.APICompletions }
func (completions) Path() string     { return "/v1/completions" }

func (completions) Check(obj *body.Object) error {
	if k := obj.Kind("prompt"); k == body.KindNone || k == body.KindNull {
		return apierror.InvalidField("prompt", "%q is required", "prompt")
	} else if k != body.KindString && k != body.KindArray {
		return apierror.InvalidField("prompt", "\"prompt\" must be a string or an array")
	}
	return nil
}

func (completions) Media() *media.Layout         { return nil }
func (completions) Legs(bool) Format             { return Completions }
func (completions) AskUsage(rc *request.Context) { askUsage(rc) }
func (completions) Events() Events               { return completionEvents }

func (completions) Render(ctx context.Context, rc *request.Context, r Renderer) error {
	return r.Prompt(ctx, rc)
}

func (completions) Conditional(rc *request.Context) *body.Object {
	return conditional(rc, "prompt", (*request.Context).TokenIDsSegments)
}

func (completions) Decode(rc *request.Context, base *body.Object, kv json.RawMessage) (*body.Object, error) {
	obj := base.Clone()
	if rc.Rendered && rc.TokenCount() > 0 {
		obj.SetSegments("prompt", rc.TokenIDsSegments()...)
	}
	if kv != nil {
		obj.Set("kv_transfer_params", kv)
	}
	return obj, nil
}

// Prefill is the client's body capped, with request_id, the prompt as token ids when render
// ran, kv_transfer_params, and features and ec_transfer_params when there are media. Unlike
// upstream, it keeps the client's sampling fields.
func (completions) Prefill(rc *request.Context, t Transfer) (*body.Object, error) {
	obj := rc.Body.Clone()
	obj.Set("request_id", body.AppendQuote(nil, rc.ID))
	if rc.Rendered && rc.TokenCount() > 0 {
		obj.SetSegments("prompt", rc.TokenIDsSegments()...)
	}
	if t.KV != nil {
		obj.Set("kv_transfer_params", t.KV)
	}
	if f := featuresJSON(rc.Media, prefillPayload(rc.Media, t.EC != nil)); f != nil {
		obj.Set("features", f)
	}
	if t.EC != nil {
		obj.Set("ec_transfer_params", t.EC)
	}
	capOneToken(obj, capTokens)
	return obj, nil
}

func (f completions) Encoder(*request.Context) (string, func(int) (*body.Object, error), error) {
	return noEncoder(f)
}

func (completions) Continue(*body.Object, json.RawMessage) (*body.Object, error) {
	return nil, errors.New("completions streams are not continued")
}

func (completions) sampling(obj *body.Object) *body.Object { return obj }

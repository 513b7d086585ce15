package wire

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/epd-dev/coordinator/dataplane/media"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// generate is vLLM's tokens-in generate: token_ids and features in, token ids out, the sampling
// settings (token limits included) in sampling_params and transfer parameters in
// sampling_params.extra_args. It is also the format of every encode and prefill leg when
// use_openai_format is false.
type generate struct{}

func (generate) API() request.API { return request.APIGenerate }
func (generate) Path() string     { return "/inference/v1/generate" }

func (generate) Check(obj *body.Object) error {
	if err := expectKind(obj, "token_ids", body.KindArray, "an array", true); err != nil {
		return err
	}
	return expectKind(obj, "sampling_params", body.KindObject, "an object", false)
}

func (generate) Media() *media.Layout      { return nil }
func (generate) Legs(bool) Format          { return Generate }
func (generate) AskUsage(*request.Context) {}
func (generate) Events() Events            { return generateEvents }

func (generate) Render(_ context.Context, rc *request.Context, r Renderer) error {
	return r.TokensIn(rc)
}

// Conditional is the client's body: its prompt is token ids already.
func (generate) Conditional(rc *request.Context) *body.Object { return rc.Body }

func (generate) Decode(_ *request.Context, base *body.Object, kv json.RawMessage) (*body.Object, error) {
	obj := base.Clone()
	if kv != nil {
		if err := setExtraArgs(obj, map[string]json.RawMessage{"kv_transfer_params": kv}); err != nil {
			return nil, err
		}
	}
	return obj, nil
}

// Prefill is the request tokens-in (a generate client's own body, or a chat client's prompt as
// token_ids and features), capped, with the transfer parameters in sampling_params.extra_args.
// The features carry kwargs_data, or mm_metadata instead when the leg carries
// ec_transfer_params and render gave every item metadata (prefillPayload).
func (generate) Prefill(rc *request.Context, t Transfer) (*body.Object, error) {
	obj := tokensIn(rc, prefillPayload(rc.Media, t.EC != nil))
	extra := map[string]json.RawMessage{}
	if t.KV != nil {
		extra["kv_transfer_params"] = t.KV
	}
	if t.EC != nil {
		extra["ec_transfer_params"] = t.EC
	}
	if len(extra) > 0 {
		if err := setExtraArgs(obj, extra); err != nil {
			return nil, err
		}
	}
	return obj, capGenerate(obj)
}

// Encoder builds tokens-in encode legs for a chat or Responses client's items; a generate
// client's request has none (path ""): the prefill worker encodes tokens-in requests inline
// (vllm-project/vllm#46722).
func (f generate) Encoder(rc *request.Context) (string, func(int) (*body.Object, error), error) {
	if rc.API == request.APIGenerate {
		return "", nil, nil
	}
	return f.Path(), func(i int) (*body.Object, error) { return encodeItem(rc, nil, i, true), nil }, nil
}

func (generate) Continue(cont *body.Object, ec json.RawMessage) (*body.Object, error) {
	obj := cont.Clone()
	if ec != nil {
		if err := setExtraArgs(obj, map[string]json.RawMessage{"ec_transfer_params": ec}); err != nil {
			return nil, err
		}
	}
	return obj, capGenerate(obj)
}

// capGenerate caps a tokens-in leg to one token: the limits live in sampling_params.
func capGenerate(obj *body.Object) error {
	if err := editObject(obj, "sampling_params", func(sp *body.Object) error {
		capTokens(sp)
		return nil
	}); err != nil {
		return err
	}
	capOneToken(obj, func(*body.Object) {})
	return nil
}

// A generate stream is continued as the prompt's ids followed by the output's.

func (generate) idKey() string             { return "request_id" }
func (generate) created() bool             { return false }
func (generate) exotic(_, _ []byte) string { return "" }
func (generate) opening(*body.Object) bool { return false }

func (generate) output(g *Got, _, tokenIDs []byte) error {
	for id := range body.Elements(tokenIDs) {
		n, err := body.ParseInt(id)
		if err != nil {
			return fmt.Errorf("an event the client got has a token id that is not an integer: %s", id)
		}
		g.ids = append(g.ids, int(n))
		g.tokens++
	}
	return nil
}

// sampling is sampling_params (nil when absent or malformed).
func (generate) sampling(obj *body.Object) *body.Object {
	sp, _, err := obj.Object("sampling_params")
	if err != nil {
		return nil
	}
	return sp
}

// continueBody appends the output ids to the prompt ids and lowers sampling_params.max_tokens.
func (generate) continueBody(base, obj *body.Object, g *Got) error {
	raw, _ := base.Get("token_ids")
	raw = bytes.TrimRight(raw, " \t\r\n")
	if len(raw) < 2 || raw[len(raw)-1] != ']' {
		return errors.New("token_ids is not an array")
	}
	if len(g.ids) > 0 {
		tail := make([]byte, 0, 8*len(g.ids)+2)
		for i, id := range g.ids {
			if i > 0 || len(bytes.TrimSpace(raw[1:len(raw)-1])) > 0 {
				tail = append(tail, ',')
			}
			tail = strconv.AppendInt(tail, int64(id), 10)
		}
		tail = append(tail, ']')
		obj.SetSegments("token_ids", raw[:len(raw)-1], tail)
	}
	sp, _, err := obj.Object("sampling_params")
	if err != nil {
		return err
	}
	if sp == nil {
		return nil
	}
	sp = sp.Clone()
	if err := lowerLimits(sp, g.tokens, "max_tokens"); err != nil {
		return err
	}
	obj.Set("sampling_params", sp.Bytes())
	return nil
}

// Package steps holds the built-in pipeline steps, one per file, each registering itself with the
// pipeline registry. This file has what several steps share: reading connector params and
// building leg bodies by editing top-level keys of the parsed client body.
package steps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/connectors/ec"
	"github.com/epd-dev/coordinator/dataplane/connectors/kv"
	"github.com/epd-dev/coordinator/dataplane/media"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/pipeline/params"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/retry"
)

// Param names shared by several steps: the pipeline-level settings each step inherits.
const (
	paramKVConnector     = config.ParamKVConnector
	paramECConnector     = config.ParamECConnector
	paramUseOpenAIFormat = config.ParamUseOpenAIFormat
)

// Raw JSON literals used on legs.
var (
	jsonOne   = json.RawMessage("1")
	jsonFalse = json.RawMessage("false")
	jsonNull  = json.RawMessage("null")
)

func kvConnector(deps builder.Deps, p *params.Params) kv.Connector {
	name := p.String(paramKVConnector, kv.SharedStorage)
	c, err := kv.New(name, deps.Getenv)
	if err != nil {
		p.Fail(paramKVConnector, "%v", err)
	}
	return c
}

// poolPolicy is pipeline.on_pool_failure as a step reads it (the on_pool_failure param).
type poolPolicy struct {
	aggregate bool
	metrics   *observe.Metrics
}

func onPoolFailure(deps builder.Deps, p *params.Params) poolPolicy {
	v := p.String(config.ParamOnPoolFailure, config.DefaultOnPoolFailure)
	switch v {
	case config.OnPoolFailureAggregate, config.OnPoolFailureFail:
	default:
		p.Fail(config.ParamOnPoolFailure, "must be %q or %q, got %q", config.OnPoolFailureAggregate, config.OnPoolFailureFail, v)
	}
	return poolPolicy{aggregate: v == config.OnPoolFailureAggregate, metrics: deps.Telemetry.Metrics}
}

// handle applies the policy to err, the final error of phase's legs. A failure that says the
// pool could not serve (retry.Unserved) either degrades the request (nil: rc.Degraded is set
// and decode serves it alone, prefilling and encoding itself) or is a 503 naming the pool;
// anything else (a worker's rejection) is returned as is.
func (pp poolPolicy) handle(ctx context.Context, rc *request.Context, phase string, err error) error {
	if !retry.Unserved(ctx, err) {
		return err
	}
	if pp.aggregate {
		pp.metrics.Degraded(phase, observe.DegradedAggregated)
		rc.Degraded = phase
		rc.Log.V(logging.Warn).Info("the pool cannot serve the request; serving it on decode alone (pipeline.on_pool_failure: aggregate)",
			"phase", phase, "err", err.Error())
		trace.SpanFromContext(ctx).AddEvent("degraded", trace.WithAttributes(observe.AttrPhase.String(phase)))
		return nil
	}
	pp.metrics.Degraded(phase, observe.DegradedFailed)
	e := &apierror.Error{Status: http.StatusServiceUnavailable, Type: apierror.TypeUnavailable, Code: "pool_unavailable",
		Message: fmt.Sprintf("the %s pool cannot serve the request now; try again later", phase), Cause: err, RetryAfter: time.Second}
	var up *apierror.UpstreamError
	if errors.As(err, &up) && up.RetryAfter > 0 {
		e.RetryAfter = up.RetryAfter
	}
	return e
}

func ecConnector(p *params.Params) ec.Connector {
	name := p.String(paramECConnector, ec.SharedStorage)
	c, err := ec.New(name)
	if err != nil {
		p.Fail(paramECConnector, "%v", err)
	}
	return c
}

// capSingleToken turns a leg into a one-token, non-streaming request (encode and prefill legs):
// max_tokens 1, no min_tokens, max_completion_tokens / max_output_tokens 1 when present, and
// stream false without stream_options. In generate format the token limits live in
// sampling_params; the Responses API has max_output_tokens only.
func capSingleToken(o *body.Object, format request.API) error {
	if format == request.APIResponses {
		o.Set("max_output_tokens", jsonOne)
		o.Set("stream", jsonFalse)
		o.Delete("stream_options")
		return nil
	}
	if format == request.APIGenerate {
		if err := editObject(o, "sampling_params", func(sp *body.Object) error {
			capTokens(sp)
			return nil
		}); err != nil {
			return err
		}
	} else {
		capTokens(o)
	}
	o.Set("stream", jsonFalse)
	o.Delete("stream_options")
	return nil
}

func capTokens(o *body.Object) {
	o.Set("max_tokens", jsonOne)
	o.Delete("min_tokens")
	for _, k := range []string{"max_completion_tokens", "max_output_tokens"} {
		if o.Has(k) {
			o.Set(k, jsonOne)
		}
	}
}

// editObject applies fn to the object member key of o (created when absent or null).
func editObject(o *body.Object, key string, fn func(*body.Object) error) error {
	inner, _, err := o.Object(key)
	if err != nil {
		return apierror.InvalidField(key, "%v", err)
	}
	if inner == nil {
		inner = &body.Object{}
	} else {
		inner = inner.Clone()
	}
	if err := fn(inner); err != nil {
		return err
	}
	o.Set(key, inner.Bytes())
	return nil
}

// setExtraArgs merges values into sampling_params.extra_args, where vLLM's generate endpoint reads
// transfer params, keeping every other key.
func setExtraArgs(o *body.Object, values map[string]json.RawMessage) error {
	return editObject(o, "sampling_params", func(sp *body.Object) error {
		return editObject(sp, "extra_args", func(ea *body.Object) error {
			for _, k := range slices.Sorted(maps.Keys(values)) {
				ea.Set(k, values[k])
			}
			return nil
		})
	})
}

// mustJSON encodes small, always-encodable values (transfer params maps).
func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("steps: encoding %T: %v", v, err))
	}
	return b
}

// mmPayload is the per-item payload a leg's features carry beside mm_hashes and mm_placeholders.
type mmPayload int

const (
	// mmNone: hashes and placeholders only (chat tokens.features; the media are in the messages).
	mmNone mmPayload = iota
	// mmKwargs: kwargs_data, the preprocessed inputs (pixel values included) a worker encodes.
	mmKwargs
	// mmMetadata: mm_metadata, the light fields only (vllm-project/vllm#54659), for a prefill that
	// gets the encoder outputs through ec_transfer_params; every entry must have Metadata.
	mmMetadata
)

// key is the features member the payload fills ("" for mmNone).
func (p mmPayload) key() string {
	switch p {
	case mmKwargs:
		return "kwargs_data"
	case mmMetadata:
		return "mm_metadata"
	}
	return ""
}

// item is m's raw value of the payload (nil when it has none).
func (p mmPayload) item(m *request.MediaEntry) json.RawMessage {
	switch p {
	case mmKwargs:
		return m.Kwargs
	case mmMetadata:
		return m.Metadata
	}
	return nil
}

// prefillPayload is what the prefill leg's features carry: mm_metadata instead of kwargs_data when
// the leg sends ec_transfer_params (withEC) and render gave every item metadata (upstream
// llm-d-router#2723; vLLM refuses metadata-only items without ec_transfer_params), else kwargs_data.
func prefillPayload(items []request.MediaEntry, withEC bool) mmPayload {
	if !withEC || len(items) == 0 {
		return mmKwargs
	}
	for i := range items {
		if len(items[i].Metadata) == 0 {
			return mmKwargs
		}
	}
	return mmMetadata
}

// featuresJSON builds {"mm_hashes":{m:[..]},"mm_placeholders":{m:[{offset,length}..]}} plus, by
// payload, "kwargs_data":{m:[..]} or "mm_metadata":{m:[..]} (an item without one is null) from the
// rendered media entries, or nil without media.
func featuresJSON(items []request.MediaEntry, payload mmPayload) json.RawMessage {
	if len(items) == 0 {
		return nil
	}
	mods := make([]string, 0, 1)
	byMod := map[string][]int{}
	for i, m := range items {
		k := media.Modality(m.Kind)
		if _, seen := byMod[k]; !seen {
			mods = append(mods, k)
		}
		byMod[k] = append(byMod[k], i)
	}
	size := 64
	for i := range items {
		size += len(items[i].Hash) + 48 + len(payload.item(&items[i]))
	}
	b := make([]byte, 0, size)
	section := func(name string, item func(b []byte, m *request.MediaEntry) []byte) {
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, `":{`...)
		for mi, mod := range mods {
			if mi > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendQuote(b, mod)
			b = append(b, ":["...)
			for j, idx := range byMod[mod] {
				if j > 0 {
					b = append(b, ',')
				}
				b = item(b, &items[idx])
			}
			b = append(b, ']')
		}
		b = append(b, '}')
	}
	b = append(b, '{')
	section("mm_hashes", func(b []byte, m *request.MediaEntry) []byte { return strconv.AppendQuote(b, m.Hash) })
	b = append(b, ',')
	section("mm_placeholders", func(b []byte, m *request.MediaEntry) []byte {
		b = append(b, `{"offset":`...)
		b = strconv.AppendInt(b, int64(m.Placeholder.Offset), 10)
		b = append(b, `,"length":`...)
		b = strconv.AppendInt(b, int64(m.Placeholder.Length), 10)
		return append(b, '}')
	})
	if key := payload.key(); key != "" {
		b = append(b, ',')
		section(key, func(b []byte, m *request.MediaEntry) []byte {
			if v := payload.item(m); len(v) > 0 {
				return append(b, v...)
			}
			return append(b, jsonNull...)
		})
	}
	return append(b, '}')
}

// tokensJSON builds the chat-format tokens field {"token_ids":[..],"features":{..}} (features
// without kwargs, omitted without media) that lets workers and the EPP skip tokenizing.
func tokensJSON(rc *request.Context) json.RawMessage {
	ids := rc.TokenIDsJSON()
	feats := featuresJSON(rc.Media, mmNone)
	b := make([]byte, 0, len(ids)+len(feats)+32)
	b = append(b, `{"token_ids":`...)
	b = append(b, ids...)
	if feats != nil {
		b = append(b, `,"features":`...)
		b = append(b, feats...)
	}
	return append(b, '}')
}

// mediaLayout is where a conversational format lays its media parts out.
func mediaLayout(api request.API) media.Layout {
	return media.Layout{Messages: api.MessagesKey(), Input: api == request.APIResponses}
}

package wire

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/media"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// Raw JSON literals the legs carry.
var (
	jsonOne   = json.RawMessage("1")
	jsonFalse = json.RawMessage("false")
	jsonNull  = json.RawMessage("null")
)

// capOneToken makes a leg one token, not streamed (encode and prefill legs): capTokens on the
// object that holds the token limits, stream false without stream_options.
func capOneToken(o *body.Object, limits func(*body.Object)) {
	limits(o)
	o.Set("stream", jsonFalse)
	o.Delete("stream_options")
}

// capTokens caps an OpenAI request to one token: max_tokens 1, no min_tokens,
// max_completion_tokens / max_output_tokens 1 when present.
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
			b = body.AppendQuote(b, mod)
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
	section("mm_hashes", func(b []byte, m *request.MediaEntry) []byte { return body.AppendQuote(b, m.Hash) })
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

// tokensSegments is the chat-format tokens field {"token_ids":[..],"features":{..}} (features
// without kwargs, omitted without media), that lets workers and the EPP skip tokenizing, as
// pieces for body.Object.SetSegments: the ids' JSON is spliced in as it is held, not copied.
func tokensSegments(rc *request.Context) [][]byte {
	ids := rc.TokenIDsSegments()
	segs := make([][]byte, 0, len(ids)+4)
	segs = append(append(segs, tokenIDsOpen), ids...)
	if feats := featuresJSON(rc.Media, mmNone); feats != nil {
		segs = append(segs, featuresKey, feats)
	}
	return append(segs, closeBrace)
}

// The glue of tokensSegments (never modified).
var tokenIDsOpen, featuresKey, closeBrace = []byte(`{"token_ids":`), []byte(`,"features":`), []byte("}")

// partitionKeys are the members of a client's body that partition the workers' caches and the
// endpoint picker's prefix affinity: the model (a LoRA adapter is a model name), vLLM's
// cache_salt and OpenAI's prompt_cache_key. Every leg carries the client's values unchanged: the
// legs that copy the client's body keep them, and those built anew (encode legs, tokens-in legs
// of a chat or Responses client) copy them (copyPartition), so tenants that asked to be apart
// never share a cache on any phase.
var partitionKeys = []string{"model", "cache_salt", "prompt_cache_key"}

// copyPartition copies the partitionKeys present in client to obj, as they are.
func copyPartition(obj, client *body.Object) {
	for _, k := range partitionKeys {
		if raw, ok := client.Get(k); ok {
			obj.Set(k, raw)
		}
	}
}

// encodeItem is the encode leg of media item i of rc: its own media part (an input_audio's
// {"data", "format"}, another kind's {"url", ...}, from msgs, the conversation's items) plus its
// tokens, [BOS] + [P]*length with the placeholder at offset 1 and P its modality's placeholder
// token (chat shape), or, tokensIn, token_ids and features with kwargs_data keyed by its
// modality (generate shape).
func encodeItem(rc *request.Context, msgs []json.RawMessage, i int, tokensIn bool) *body.Object {
	m := rc.Media[i]
	bos, ph := 1, 0
	if rc.TokenCount() > 0 {
		bos = rc.TokenID(0)
	}
	if m.Placeholder.Offset >= 0 && m.Placeholder.Offset < rc.TokenCount() {
		ph = rc.TokenID(m.Placeholder.Offset)
	}
	ids := make([]byte, 0, 8*m.Placeholder.Length+16)
	ids = append(ids, '[')
	ids = strconv.AppendInt(ids, int64(bos), 10)
	for k := 0; k < m.Placeholder.Length; k++ {
		ids = append(ids, ',')
		ids = strconv.AppendInt(ids, int64(ph), 10)
	}
	ids = append(ids, ']')
	single := []request.MediaEntry{{Kind: m.Kind, Hash: m.Hash, Placeholder: request.Placeholder{Offset: 1, Length: m.Placeholder.Length}, Kwargs: m.Kwargs}}

	obj := &body.Object{}
	copyPartition(obj, rc.Body)
	if tokensIn {
		obj.Set("token_ids", ids)
		obj.Set("features", featuresJSON(single, mmKwargs))
		obj.Set("sampling_params", json.RawMessage(`{"max_tokens":1}`))
		obj.Set("stream", jsonFalse)
		return obj
	}
	part, err := media.Part(msgs, &m)
	if err != nil {
		part = json.RawMessage(`{"url":""}`)
	}
	head := make([]byte, 0, 96)
	head = append(head, `[{"role":"user","content":[{"type":`...)
	head = body.AppendQuote(head, m.Kind)
	head = append(head, ',')
	head = body.AppendQuote(head, media.Field(m.Kind))
	head = append(head, ':')
	// The media part (a data: URL, possibly megabytes) is streamed from the client's body, not copied.
	obj.SetSegments("messages", head, part, []byte("}]}]"))
	tokens := make([]byte, 0, len(ids)+128)
	tokens = append(tokens, `{"token_ids":`...)
	tokens = append(tokens, ids...)
	tokens = append(tokens, `,"features":`...)
	tokens = append(tokens, featuresJSON(single, mmNone)...)
	tokens = append(tokens, '}')
	obj.Set("tokens", tokens)
	obj.Set("max_tokens", jsonOne)
	obj.Set("stream", jsonFalse)
	return obj
}

// tokensIn is the tokens-in leg body of rc: {request_id, model, token_ids, features (with
// payload), sampling_params}. A generate client's own body is the base (its sampling_params and
// features are kept); a chat or Responses client's is translated.
func tokensIn(rc *request.Context, payload mmPayload) *body.Object {
	var obj *body.Object
	if rc.API == request.APIGenerate {
		obj = rc.Body.Clone() // already tokens-in: token_ids and features are the client's
	} else {
		obj = &body.Object{}
		copyPartition(obj, rc.Body)
		obj.SetSegments("token_ids", rc.TokenIDsSegments()...)
		if f := featuresJSON(rc.Media, payload); f != nil {
			obj.Set("features", f)
		}
	}
	obj.Set("request_id", body.AppendQuote(nil, rc.ID))
	if !obj.Has("sampling_params") {
		obj.Set("sampling_params", json.RawMessage("{}"))
	}
	return obj
}

package wire

import (
	"bytes"
	"encoding/json"

	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

var usageKey = []byte(`"usage"`)

// maxModelLen bounds the served model name kept (observe.MaxLabelLen is 128: anything longer
// is labelled invalid).
const maxModelLen = 256

// ReadStats takes into a the model (the first one seen) and the usage (the last one seen) of
// doc, a JSON answer or one stream chunk of any format (a Responses stream event carries them in
// its response), and reports whether doc carries a usage object. Anything that does not parse is
// ignored: statistics never fail an answer. It validates doc once and walks only the members it
// reads (chat and completions name the counts prompt and completion, the Responses API input and
// output), allocating nothing but the model name.
func ReadStats(a *request.AnswerStats, doc []byte) bool {
	hasUsage := bytes.Contains(doc, usageKey)
	if a.Model != "" && !hasUsage || !body.Valid(doc) {
		return false
	}
	obj := doc
	if inner, ok := member(doc, "response"); ok && body.KindOf(inner) == body.KindObject {
		obj = inner // response.created, response.completed, ...
	}
	var model, usage []byte
	for k, v := range body.Members(obj) {
		switch k {
		case "model":
			model = v
		case "usage":
			usage = v
		}
	}
	if a.Model == "" && body.KindOf(model) == body.KindString {
		a.Model = modelName(model)
	}
	if body.KindOf(usage) != body.KindObject {
		return false
	}
	var prompt, completion, cached, input, output, inputCached int64
	var hasCached, hasInputCached bool
	ok := true
	count := func(dst *int64, raw []byte) bool {
		if n, err := body.ParseInt(raw); err == nil {
			*dst = n
			return true
		} else if len(raw) > 0 && !isNull(raw) {
			ok = false // a count of the wrong type: the usage is not read
		}
		return false
	}
	for k, v := range body.Members(usage) {
		switch k {
		case "prompt_tokens":
			count(&prompt, v)
		case "completion_tokens":
			count(&completion, v)
		case "input_tokens":
			count(&input, v)
		case "output_tokens":
			count(&output, v)
		case "prompt_tokens_details":
			c, _ := member(v, "cached_tokens")
			hasCached = count(&cached, c)
		case "input_tokens_details":
			c, _ := member(v, "cached_tokens")
			hasInputCached = count(&inputCached, c)
		}
	}
	if !ok {
		return false
	}
	if prompt == 0 && completion == 0 {
		prompt, completion, cached, hasCached = input, output, inputCached, hasInputCached
	}
	a.HasUsage, a.PromptTokens, a.CompletionTokens = true, max(prompt, 0), max(completion, 0)
	a.CachedTokens, a.HasCached = min(max(cached, 0), a.PromptTokens), hasCached
	return true
}

// modelName is a copy of a model member's text (raw may be a reused read buffer), at most
// maxModelLen bytes of it: a longer name is no label anyway.
func modelName(raw []byte) string {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : 1+min(len(raw)-2, maxModelLen)])
	}
	m, err := body.AppendString(nil, raw)
	if err != nil {
		return ""
	}
	return string(m[:min(len(m), maxModelLen)])
}

// member is the raw value of key in obj, a validated object.
func member(obj []byte, key string) ([]byte, bool) {
	for k, v := range body.Members(obj) {
		if k == key {
			return v, true
		}
	}
	return nil, false
}

func isNull(raw []byte) bool { return string(raw) == "null" }

// UsageOnly reports whether a stream chunk is the usage chunk OpenAI streams add for
// stream_options.include_usage: an empty choices list next to the usage.
func UsageOnly(chunk []byte) bool {
	obj, err := body.Parse(chunk)
	if err != nil {
		return false
	}
	raw, ok := obj.Get("choices")
	inner, isList := bytes.CutPrefix(bytes.TrimSpace(raw), []byte("["))
	inner, closed := bytes.CutSuffix(inner, []byte("]"))
	return ok && isList && closed && len(bytes.TrimSpace(inner)) == 0
}

// askUsage is Format.AskUsage of chat and completions, whose streams end with a usage chunk
// when stream_options.include_usage asks for one.
func askUsage(rc *request.Context) {
	if !rc.Stream {
		return
	}
	raw, ok := rc.Body.Get("stream_options")
	if !ok || string(bytes.TrimSpace(raw)) == "null" {
		rc.Body.Set("stream_options", json.RawMessage(`{"include_usage":true}`))
		rc.HideUsage = true
		return
	}
	var opts map[string]json.RawMessage
	if json.Unmarshal(raw, &opts) != nil {
		return // the server checked it is an object; leave anything odd as the client sent it
	}
	if string(opts["include_usage"]) == "true" {
		return
	}
	opts["include_usage"] = json.RawMessage("true")
	merged, err := json.Marshal(opts)
	if err != nil {
		return
	}
	rc.Body.Set("stream_options", merged)
	rc.HideUsage = true
}

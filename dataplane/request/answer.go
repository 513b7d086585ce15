package request

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/epd-dev/coordinator/dataplane/body"
)

// AnswerStats is what an answer says about itself: the model that served it and its usage
// (OpenAI's usage object: prompt, completion and cached prompt tokens).
type AnswerStats struct {
	// Model is the answer's model member ("" when absent): the served model, which may differ
	// from the requested one (an alias, a LoRA adapter).
	Model string
	// HasUsage is true once a usage object was read; the counts are its members.
	HasUsage                                     bool
	PromptTokens, CompletionTokens, CachedTokens int64
}

var usageKey = []byte(`"usage"`)

// maxModelLen bounds the served model name kept (observe.MaxLabelLen is 128: anything longer
// is labelled invalid).
const maxModelLen = 256

// usage is the part of OpenAI's usage object the metrics count: chat and completions name the
// counts prompt and completion, the Responses API input and output.
type usage struct {
	PromptTokens        int64   `json:"prompt_tokens"`
	CompletionTokens    int64   `json:"completion_tokens"`
	PromptTokensDetails *cached `json:"prompt_tokens_details"`
	InputTokens         int64   `json:"input_tokens"`
	OutputTokens        int64   `json:"output_tokens"`
	InputTokensDetails  *cached `json:"input_tokens_details"`
}

type cached struct {
	CachedTokens int64 `json:"cached_tokens"`
}

// Read takes the model (the first one seen) and the usage (the last one seen) of doc, a JSON
// answer or one stream chunk (a Responses stream event carries them in its response), and
// reports whether doc carries a usage object. Anything that does not parse is ignored:
// statistics never fail an answer.
func (a *AnswerStats) Read(doc []byte) bool {
	hasUsage := bytes.Contains(doc, usageKey)
	if a.Model != "" && !hasUsage {
		return false
	}
	obj, err := body.Parse(doc)
	if err != nil {
		return false
	}
	if inner, _, err := obj.Object("response"); err == nil && inner != nil {
		obj = inner // response.created, response.completed, ...
	}
	if a.Model == "" {
		if m, _, err := obj.String("model"); err == nil {
			// A copy (doc may be a reused read buffer), at most maxModelLen bytes of it: a longer
			// name is no label anyway.
			a.Model = strings.Clone(m[:min(len(m), maxModelLen)])
		}
	}
	raw, ok := obj.Get("usage")
	if !ok || len(raw) == 0 || raw[0] != '{' {
		return false
	}
	var u usage
	if json.Unmarshal(raw, &u) != nil {
		return false
	}
	if u.PromptTokens == 0 && u.CompletionTokens == 0 {
		u.PromptTokens, u.CompletionTokens, u.PromptTokensDetails = u.InputTokens, u.OutputTokens, u.InputTokensDetails
	}
	a.HasUsage, a.PromptTokens, a.CompletionTokens = true, max(u.PromptTokens, 0), max(u.CompletionTokens, 0)
	a.CachedTokens = 0
	if d := u.PromptTokensDetails; d != nil {
		a.CachedTokens = min(max(d.CachedTokens, 0), a.PromptTokens)
	}
	return true
}

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

// AskUsage makes a streamed chat or completions request ask its decode worker for the usage
// chunk (stream_options.include_usage), so that its tokens can be counted, and sets HideUsage
// when the client had not asked for it: the client then gets the stream it asked for.
func (rc *Context) AskUsage() {
	if !rc.Stream || (rc.API != APIChat && rc.API != APICompletions) {
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

package simworker

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
)

// RenderFeatures is the multimodal part of a render answer (vLLM
// MultiModalFeatures). Every list is empty, not null, for text-only prompts.
type RenderFeatures struct {
	MMHashes       map[string][]string            `json:"mm_hashes"`
	MMPlaceholders map[string][]RenderPlaceholder `json:"mm_placeholders"`
	KwargsData     map[string][]string            `json:"kwargs_data"`
}

// RenderPlaceholder is the token range of one image.
type RenderPlaceholder struct {
	Offset int `json:"offset"`
	Length int `json:"length"`
}

// RenderResult is the answer of the render service: a ready-made vLLM
// GenerateRequest. Chat render answers one object; completions render answers
// a one-element array whose Features is null.
type RenderResult struct {
	RequestID      string          `json:"request_id"`
	Model          string          `json:"model"`
	TokenIDs       []int           `json:"token_ids"`
	Features       *RenderFeatures `json:"features"`
	SamplingParams map[string]any  `json:"sampling_params"`
	Stream         bool            `json:"stream"`
}

// samplingFields are the request fields copied into a render answer's
// sampling_params.
var samplingFields = []string{
	"temperature", "top_p", "top_k", "min_p", "seed", "stop", "n",
	"presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos", "min_tokens",
}

// handleChatRender answers POST /v1/chat/completions/render.
func (w *Worker) handleChatRender(rw http.ResponseWriter, r *http.Request) {
	body, fields, ok := w.readRenderBody(rw, r)
	if !ok {
		return
	}
	var req struct {
		Model    string          `json:"model"`
		Messages json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(rw, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	rendering, err := RenderChat(req.Messages)
	if err != nil {
		writeError(rw, http.StatusBadRequest, err.Error())
		return
	}
	feats := &RenderFeatures{
		MMHashes:       map[string][]string{"image": {}},
		MMPlaceholders: map[string][]RenderPlaceholder{"image": {}},
		KwargsData:     map[string][]string{"image": {}},
	}
	for _, img := range rendering.Images {
		feats.MMHashes["image"] = append(feats.MMHashes["image"], img.Hash)
		feats.MMPlaceholders["image"] = append(feats.MMPlaceholders["image"], RenderPlaceholder{Offset: img.Offset, Length: img.Length})
		feats.KwargsData["image"] = append(feats.KwargsData["image"], base64.StdEncoding.EncodeToString(ImageKwargsBlob(img.Bytes)))
	}
	writeJSON(rw, http.StatusOK, RenderResult{
		RequestID:      w.newID("render-"),
		Model:          w.modelOr(req.Model),
		TokenIDs:       rendering.TokenIDs,
		Features:       feats,
		SamplingParams: samplingParams(fields, "max_completion_tokens", "max_tokens"),
	})
}

// handleCompletionRender answers POST /v1/completions/render.
func (w *Worker) handleCompletionRender(rw http.ResponseWriter, r *http.Request) {
	body, fields, ok := w.readRenderBody(rw, r)
	if !ok {
		return
	}
	var req struct {
		Model  string          `json:"model"`
		Prompt json.RawMessage `json:"prompt"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(rw, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	var prompt string
	if isNull(req.Prompt) || json.Unmarshal(req.Prompt, &prompt) != nil {
		writeError(rw, http.StatusBadRequest, "prompt must be a string")
		return
	}
	writeJSON(rw, http.StatusOK, []RenderResult{{
		RequestID:      w.newID("render-"),
		Model:          w.modelOr(req.Model),
		TokenIDs:       TokenizePrompt(prompt),
		SamplingParams: samplingParams(fields, "max_tokens"),
	}})
}

// readRenderBody reads a render request and decodes its top-level fields.
func (w *Worker) readRenderBody(rw http.ResponseWriter, r *http.Request) ([]byte, map[string]json.RawMessage, bool) {
	if w.cfgErr != nil {
		writeError(rw, http.StatusInternalServerError, "simworker misconfigured: "+w.cfgErr.Error())
		return nil, nil, false
	}
	body, _ := io.ReadAll(r.Body) // already buffered by ServeHTTP
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		writeError(rw, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return nil, nil, false
	}
	return body, fields, true
}

// samplingParams builds render sampling_params from the request fields:
// max_tokens from the first present of maxFields, plus samplingFields.
func samplingParams(fields map[string]json.RawMessage, maxFields ...string) map[string]any {
	out := map[string]any{}
	for _, f := range maxFields {
		if raw, ok := fields[f]; ok && !isNull(raw) {
			out["max_tokens"] = raw
			break
		}
	}
	for _, f := range samplingFields {
		if raw, ok := fields[f]; ok && !isNull(raw) {
			out[f] = raw
		}
	}
	return out
}

// modelOr returns model, or the configured model name when it is empty.
func (w *Worker) modelOr(model string) string {
	if model == "" {
		return w.cfg.ModelName
	}
	return model
}

package simworker

import (
	"bufio"
	"net/http"
	"strconv"
)

// RenderFeatures is the multimodal part of a render answer (vLLM
// MultiModalFeatures), keyed by modality: image (empty, not null, for
// text-only prompts), and audio and video when the prompt has such items.
// MMMetadata (vllm-project/vllm#54659) holds each item's MediaMetadata,
// parallel to MMHashes; it is absent for text-only prompts and when the worker
// has Config.RenderWithoutMetadata, as from an older vLLM.
type RenderFeatures struct {
	MMHashes       map[string][]string            `json:"mm_hashes"`
	MMPlaceholders map[string][]RenderPlaceholder `json:"mm_placeholders"`
	KwargsData     map[string][]string            `json:"kwargs_data"`
	MMMetadata     map[string][]*string           `json:"mm_metadata,omitempty"`
}

// RenderPlaceholder is the token range of one media item.
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
	f, ok := w.renderFields(rw, r)
	if !ok {
		return
	}
	model, messages := f.str("model"), f.raw("messages")
	if err := typeError(f); err != nil {
		writeAPIError(rw, err)
		return
	}
	rd := renderer{detail: imageDigest}
	if err := rd.render(messages); err != nil {
		writeError(rw, http.StatusBadRequest, err.Error())
		return
	}
	writeRender(rw, false, renderAnswer{
		requestID: w.newID("render-"),
		model:     w.modelOr(model),
		tokenIDs:  rd.ids,
		images:    rd.images,
		features:  true,
		metadata:  !w.cfg.RenderWithoutMetadata,
		sampling:  samplingParams(f.obj, "max_completion_tokens", "max_tokens"),
	})
}

// handleCompletionRender answers POST /v1/completions/render.
func (w *Worker) handleCompletionRender(rw http.ResponseWriter, r *http.Request) {
	f, ok := w.renderFields(rw, r)
	if !ok {
		return
	}
	model, prompt := f.str("model"), f.raw("prompt")
	if err := typeError(f); err != nil {
		writeAPIError(rw, err)
		return
	}
	if prompt == nil || prompt[0] != '"' {
		writeError(rw, http.StatusBadRequest, "prompt must be a string")
		return
	}
	text, _ := jsonString(prompt, "prompt")
	writeRender(rw, true, renderAnswer{
		requestID: w.newID("render-"),
		model:     w.modelOr(model),
		tokenIDs:  TokenizePrompt(text),
		sampling:  samplingParams(f.obj, "max_tokens"),
	})
}

// renderFields parses the body of a render request.
func (w *Worker) renderFields(rw http.ResponseWriter, r *http.Request) (fields, bool) {
	if w.cfgErr != nil {
		writeError(rw, http.StatusInternalServerError, "simworker misconfigured: "+w.cfgErr.Error())
		return fields{}, false
	}
	o, err := parseObject(requestBody(r))
	if err != nil {
		writeError(rw, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return fields{}, false
	}
	return topFields(o, new(error)), true
}

// samplingParams builds render sampling_params from the request members:
// max_tokens from the first present of maxFields, plus samplingFields.
func samplingParams(o *object, maxFields ...string) map[string]any {
	out := map[string]any{}
	for _, f := range maxFields {
		if raw, ok := o.Get(f); ok && !isNull(raw) {
			out["max_tokens"] = raw
			break
		}
	}
	for _, f := range samplingFields {
		if raw, ok := o.Get(f); ok && !isNull(raw) {
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

// renderAnswer is the content of one RenderResult.
type renderAnswer struct {
	requestID string
	model     string
	tokenIDs  []int
	images    []chatImage // the media items' features, with imageDigest detail
	features  bool        // whether there are features (chat) or null (completions)
	metadata  bool        // whether the features carry mm_metadata (when there are items)
	sampling  map[string]any
}

// writeRender answers a RenderResult (in a one-element array when list is
// set) exactly as encoding/json would, but streams the large parts, token
// ids and kwargs blobs, instead of building them in memory.
func writeRender(rw http.ResponseWriter, list bool, a renderAnswer) {
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(rw) // larger writes (kwargs periods) go straight through
	if list {
		bw.WriteByte('[')
	}
	bw.WriteString(`{"request_id":`)
	writeMarshaled(bw, a.requestID)
	bw.WriteString(`,"model":`)
	writeMarshaled(bw, a.model)
	bw.WriteString(`,"token_ids":`)
	writeInts(bw, a.tokenIDs)
	bw.WriteString(`,"features":`)
	if a.features {
		writeFeatures(bw, a.images, a.metadata)
	} else {
		bw.WriteString("null")
	}
	bw.WriteString(`,"sampling_params":`)
	writeMarshaled(bw, a.sampling)
	bw.WriteString(`,"stream":false}`)
	if list {
		bw.WriteByte(']')
	}
	_ = bw.Flush()
}

// writeFeatures writes the RenderFeatures of the media items (images, audio, videos), modality by
// modality as encoding/json orders map keys: image always (empty for a text-only prompt), audio
// and video when there are any; with their mm_metadata when metadata is set and there are items.
func writeFeatures(bw *bufio.Writer, items []chatImage, metadata bool) {
	var num [20]byte
	byMod := map[string][]chatImage{}
	for _, im := range items {
		byMod[im.modality()] = append(byMod[im.modality()], im)
	}
	section := func(name string, item func(im *chatImage)) {
		bw.WriteString(`"` + name + `":{`)
		first := true
		for _, m := range modalityOrder {
			list, ok := byMod[m]
			if !ok && m != ModalityImage {
				continue
			}
			if !first {
				bw.WriteByte(',')
			}
			first = false
			bw.WriteString(`"` + m + `":[`)
			for i := range list {
				if i > 0 {
					bw.WriteByte(',')
				}
				item(&list[i])
			}
			bw.WriteByte(']')
		}
		bw.WriteByte('}')
	}
	bw.WriteByte('{')
	section("mm_hashes", func(im *chatImage) { bw.WriteString(`"` + im.hash() + `"`) })
	bw.WriteByte(',')
	section("mm_placeholders", func(im *chatImage) {
		bw.WriteString(`{"offset":`)
		bw.Write(strconv.AppendInt(num[:0], int64(im.offset), 10))
		bw.WriteString(`,"length":`)
		bw.Write(strconv.AppendInt(num[:0], int64(im.tokens()), 10))
		bw.WriteByte('}')
	})
	bw.WriteByte(',')
	section("kwargs_data", func(im *chatImage) {
		bw.WriteByte('"')
		_ = writeKwargsBase64(bw, im.sum, im.size)
		bw.WriteByte('"')
	})
	if metadata && len(items) > 0 {
		bw.WriteByte(',')
		section("mm_metadata", func(im *chatImage) {
			bw.WriteString(`"` + mediaMetadataBase64(im.modality(), im.sum, im.size) + `"`)
		})
	}
	bw.WriteByte('}')
}

// writeInts writes a JSON array of integers.
func writeInts(bw *bufio.Writer, ids []int) {
	var num [20]byte
	bw.WriteByte('[')
	for i, id := range ids {
		if i > 0 {
			bw.WriteByte(',')
		}
		bw.Write(strconv.AppendInt(num[:0], int64(id), 10))
	}
	bw.WriteByte(']')
}

// writeMarshaled writes v encoded by encoding/json (see appendMarshaled).
func writeMarshaled(bw *bufio.Writer, v any) {
	bw.Write(appendMarshaled(nil, v))
}

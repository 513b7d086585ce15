package simworker

import (
	"encoding/json"
	"fmt"
	"strings"
)

// apiKind is the wire format of an inference request.
type apiKind int

// The inference endpoints a Worker serves.
const (
	kindChat       apiKind = iota // POST /v1/chat/completions
	kindCompletion                // POST /v1/completions
	kindGenerate                  // POST /inference/v1/generate
)

// Endpoint paths served by a Worker.
const (
	PathChatCompletions  = "/v1/chat/completions"
	PathCompletions      = "/v1/completions"
	PathGenerate         = "/inference/v1/generate"
	PathChatRender       = "/v1/chat/completions/render"
	PathCompletionRender = "/v1/completions/render"
	PathModels           = "/v1/models"
	PathHealth           = "/health"
)

// maxGeneratedTokens bounds max_tokens to keep a misbehaving client from
// tying a worker up forever.
const maxGeneratedTokens = 1 << 20

// fallbackWord is echoed when a request has no words to echo.
const fallbackWord = "sim"

// streamOptions mirrors OpenAI's stream_options.
type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// placeholder is one mm_placeholders range.
type placeholder struct {
	Offset int `json:"offset"`
	Length int `json:"length"`
}

// mmFeatures mirrors vLLM's MultiModalFeatures (render output, generate input).
type mmFeatures struct {
	MMHashes       map[string][]string      `json:"mm_hashes"`
	MMPlaceholders map[string][]placeholder `json:"mm_placeholders"`
	KwargsData     map[string][]*string     `json:"kwargs_data,omitempty"`
}

// imageHashes returns the image mm_hashes, if any.
func (f *mmFeatures) imageHashes() []string {
	if f == nil {
		return nil
	}
	return f.MMHashes["image"]
}

// promptTokens is the "tokens" extension of a chat request: the rendered
// prompt the coordinator already computed.
type promptTokens struct {
	TokenIDs []int       `json:"token_ids"`
	Features *mmFeatures `json:"features"`
}

// chatRequest is the part of a chat completion request a Worker reads.
type chatRequest struct {
	Model               string          `json:"model"`
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              *bool           `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	KVTransferParams    rawParams       `json:"kv_transfer_params"`
	ECTransferParams    rawParams       `json:"ec_transfer_params"`
	Tokens              *promptTokens   `json:"tokens"`
}

// completionRequest is the part of a text completion request a Worker reads.
type completionRequest struct {
	Model            string          `json:"model"`
	Prompt           json.RawMessage `json:"prompt"`
	MaxTokens        *int            `json:"max_tokens"`
	Stream           *bool           `json:"stream"`
	StreamOptions    *streamOptions  `json:"stream_options"`
	KVTransferParams rawParams       `json:"kv_transfer_params"`
	ECTransferParams rawParams       `json:"ec_transfer_params"`
	Features         *mmFeatures     `json:"features"`
}

// generateRequest is the part of a vLLM GenerateRequest a Worker reads.
type generateRequest struct {
	RequestID        string            `json:"request_id"`
	Model            string            `json:"model"`
	TokenIDs         []int             `json:"token_ids"`
	Features         *mmFeatures       `json:"features"`
	SamplingParams   *generateSampling `json:"sampling_params"`
	Stream           *bool             `json:"stream"`
	StreamOptions    *streamOptions    `json:"stream_options"`
	KVTransferParams rawParams         `json:"kv_transfer_params"`
	ECTransferParams rawParams         `json:"ec_transfer_params"`
}

// generateSampling is the part of vLLM SamplingParams a Worker reads.
type generateSampling struct {
	MaxTokens *int `json:"max_tokens"`
	ExtraArgs *struct {
		KVTransferParams rawParams `json:"kv_transfer_params"`
		ECTransferParams rawParams `json:"ec_transfer_params"`
	} `json:"extra_args"`
}

// inference is an inference request normalized across the three formats.
type inference struct {
	kind          apiKind
	model         string
	requestID     string // from the body (generate only); may be empty
	stream        bool
	includeUsage  bool
	maxTokens     *int
	maxTokensName string // the field maxTokens came from, for messages
	promptIDs     []int
	promptKey     string
	words         []string // echo source for text formats
	kv            rawParams
	ec            rawParams
	kvName        string // field path of kv, for messages
	ecName        string // field path of ec, for messages
	features      *mmFeatures
	chatImages    []RenderedImage // chat only: images found in the messages
}

// kindForPath maps an inference endpoint path to its format.
func kindForPath(path string) (apiKind, bool) {
	switch path {
	case PathChatCompletions:
		return kindChat, true
	case PathCompletions:
		return kindCompletion, true
	case PathGenerate:
		return kindGenerate, true
	}
	return 0, false
}

// RequestPromptKey returns the prompt key a Worker computes for an inference
// request body sent to path (PathChatCompletions, PathCompletions or
// PathGenerate): PromptKey of the token ids the request carries, or of the
// tokenizer's output for its text.
func RequestPromptKey(path string, body []byte) (string, error) {
	kind, ok := kindForPath(path)
	if !ok {
		return "", fmt.Errorf("not an inference path: %q", path)
	}
	in, err := parseInference(kind, body)
	if err != nil {
		return "", err
	}
	return in.promptKey, nil
}

// parseInference decodes and normalizes an inference request body.
func parseInference(kind apiKind, body []byte) (*inference, *apiError) {
	var (
		in  *inference
		err *apiError
	)
	switch kind {
	case kindChat:
		in, err = parseChat(body)
	case kindCompletion:
		in, err = parseCompletion(body)
	default:
		in, err = parseGenerate(body)
	}
	if err != nil {
		return nil, err
	}
	in.kind = kind
	in.promptKey = PromptKey(in.promptIDs)
	if in.maxTokens != nil && (*in.maxTokens < 1 || *in.maxTokens > maxGeneratedTokens) {
		return nil, badRequest("%s must be between 1 and %d, got %d", in.maxTokensName, maxGeneratedTokens, *in.maxTokens)
	}
	return in, nil
}

// parseChat normalizes a chat completion request.
func parseChat(body []byte) (*inference, *apiError) {
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, badRequest("invalid JSON body: %v", err)
	}
	rendering, err := RenderChat(req.Messages)
	if err != nil {
		return nil, badRequest("%v", err)
	}
	in := &inference{
		model:        req.Model,
		stream:       req.Stream != nil && *req.Stream,
		includeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
		promptIDs:    rendering.TokenIDs,
		words:        strings.Fields(rendering.LastUserText),
		kv:           req.KVTransferParams,
		ec:           req.ECTransferParams,
		kvName:       "kv_transfer_params",
		ecName:       "ec_transfer_params",
		chatImages:   rendering.Images,
	}
	switch {
	case req.MaxCompletionTokens != nil:
		in.maxTokens, in.maxTokensName = req.MaxCompletionTokens, "max_completion_tokens"
	default:
		in.maxTokens, in.maxTokensName = req.MaxTokens, "max_tokens"
	}
	if req.Tokens != nil {
		if len(req.Tokens.TokenIDs) > 0 {
			in.promptIDs = req.Tokens.TokenIDs
		}
		in.features = req.Tokens.Features
	}
	return in, nil
}

// parseCompletion normalizes a text completion request.
func parseCompletion(body []byte) (*inference, *apiError) {
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, badRequest("invalid JSON body: %v", err)
	}
	in := &inference{
		model:         req.Model,
		stream:        req.Stream != nil && *req.Stream,
		includeUsage:  req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
		maxTokens:     req.MaxTokens,
		maxTokensName: "max_tokens",
		kv:            req.KVTransferParams,
		ec:            req.ECTransferParams,
		kvName:        "kv_transfer_params",
		ecName:        "ec_transfer_params",
		features:      req.Features,
	}
	var text string
	var ids []int
	switch {
	case isNull(req.Prompt):
		return nil, badRequest("prompt is required")
	case json.Unmarshal(req.Prompt, &text) == nil:
		in.promptIDs = TokenizePrompt(text)
		in.words = strings.Fields(text)
	case json.Unmarshal(req.Prompt, &ids) == nil && len(ids) > 0:
		in.promptIDs = ids
		in.words = tokenWords(ids)
	default:
		return nil, badRequest("prompt must be a string or a non-empty array of token ids")
	}
	return in, nil
}

// parseGenerate normalizes a vLLM generate (tokens-in, tokens-out) request.
func parseGenerate(body []byte) (*inference, *apiError) {
	var req generateRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, badRequest("invalid JSON body: %v", err)
	}
	if len(req.TokenIDs) == 0 {
		return nil, badRequest("token_ids is required and must not be empty")
	}
	if req.SamplingParams == nil {
		return nil, badRequest("sampling_params is required")
	}
	in := &inference{
		model:         req.Model,
		requestID:     req.RequestID,
		stream:        req.Stream != nil && *req.Stream,
		includeUsage:  req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
		maxTokens:     req.SamplingParams.MaxTokens,
		maxTokensName: "sampling_params.max_tokens",
		promptIDs:     req.TokenIDs,
		words:         tokenWords(req.TokenIDs),
		kv:            req.KVTransferParams,
		ec:            req.ECTransferParams,
		kvName:        "kv_transfer_params",
		ecName:        "ec_transfer_params",
		features:      req.Features,
	}
	if extra := req.SamplingParams.ExtraArgs; extra != nil {
		if extra.KVTransferParams != nil {
			in.kv, in.kvName = extra.KVTransferParams, "sampling_params.extra_args.kv_transfer_params"
		}
		if extra.ECTransferParams != nil {
			in.ec, in.ecName = extra.ECTransferParams, "sampling_params.extra_args.ec_transfer_params"
		}
	}
	return in, nil
}

// tokenWords names prompt tokens as words ("t<id>") for echoing, skipping BOS
// and image placeholders.
func tokenWords(ids []int) []string {
	var words []string
	for _, id := range ids {
		if id != BOSTokenID && id != ImageTokenID {
			words = append(words, fmt.Sprintf("t%d", id))
		}
	}
	return words
}

// completionTokens returns the number of tokens to generate.
func (in *inference) completionTokens(def int) int {
	if in.maxTokens != nil {
		return *in.maxTokens
	}
	return def
}

// outputWords returns n words cycled from the echo source.
func (in *inference) outputWords(n int) []string {
	src := in.words
	if len(src) == 0 {
		src = []string{fallbackWord}
	}
	out := make([]string, n)
	for i := range out {
		out[i] = src[i%len(src)]
	}
	return out
}

// outputTokenIDs returns n token ids cycled from the prompt (without BOS and
// image placeholders).
func (in *inference) outputTokenIDs(n int) []int {
	var src []int
	for _, id := range in.promptIDs {
		if id != BOSTokenID && id != ImageTokenID {
			src = append(src, id)
		}
	}
	if len(src) == 0 {
		src = []int{WordTokenID(fallbackWord)}
	}
	out := make([]int, n)
	for i := range out {
		out[i] = src[i%len(src)]
	}
	return out
}

// leg is the disaggregation leg a request asks for.
type leg int

// The legs a prefill/decode worker distinguishes.
const (
	legLocal         leg = iota // compute the prompt locally
	legPrefill                  // do_remote_decode: prefill and hand KV off
	legRemotePrefill            // do_remote_prefill: pull KV, then decode
)

// leg classifies the request by its kv_transfer_params.
func (in *inference) leg() (leg, *apiError) {
	if in.kv == nil {
		return legLocal, nil
	}
	decode, err := in.kv.boolean(in.kvName, "do_remote_decode")
	if err != nil {
		return 0, badRequest("%v", err)
	}
	prefill, err := in.kv.boolean(in.kvName, "do_remote_prefill")
	if err != nil {
		return 0, badRequest("%v", err)
	}
	switch {
	case decode:
		return legPrefill, nil
	case prefill:
		return legRemotePrefill, nil
	}
	return legLocal, nil
}

// requireSingleToken enforces the shape of a prefill or encode leg:
// max tokens exactly 1 and no streaming.
func (in *inference) requireSingleToken(what string) *apiError {
	if in.maxTokens == nil {
		return badRequest("%s must be 1 for %s requests, got none", in.maxTokensName, what)
	}
	if *in.maxTokens != 1 {
		return badRequest("%s must be 1 for %s requests, got %d", in.maxTokensName, what, *in.maxTokens)
	}
	if in.stream {
		return badRequest("stream must be false for %s requests", what)
	}
	return nil
}

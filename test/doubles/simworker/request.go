package simworker

import (
	"fmt"
	"net/http"
	"strings"
)

// apiKind is the wire format of an inference request.
type apiKind int

// The inference endpoints a Worker serves.
const (
	kindChat       apiKind = iota // POST /v1/chat/completions
	kindCompletion                // POST /v1/completions
	kindGenerate                  // POST /inference/v1/generate
	kindResponses                 // POST /v1/responses
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

// inference is an inference request normalized across the three formats.
type inference struct {
	kind          apiKind
	model         string
	requestID     string // from the body (generate only); may be empty
	stream        bool
	includeUsage  bool
	streamOptions bool // stream_options is a non-empty object
	maxTokens     *int
	maxTokensName string // the field maxTokens came from, for messages
	promptIDs     []int
	// cacheSalt is vLLM's cache_salt: prompts of different salts never share the prefix cache
	// (nor a KV transfer: promptKey includes it).
	cacheSalt string
	promptKey string
	words     []string // echo source for text formats, when known up front
	echo      []string // otherwise: texts whose words are the echo source
	continued int      // chat continue_final_message: words already in the final assistant message
	kv        rawParams
	ec        rawParams
	kvName    string // field path of kv, for messages
	// bootstrap holds SGLang's own top-level bootstrap_host, bootstrap_port and bootstrap_room
	// (nil without a bootstrap_room): a leg of upstream's prefill-decode step.
	bootstrap  rawParams
	ecName     string // field path of ec, for messages
	features   *mmFeatures
	chatImages []chatImage // chat only: images found in the messages
	// cachedPrompt is set when the worker had served the prompt before (its prefix cache holds it).
	cachedPrompt bool
	// kvLoaded is set when a decode leg loaded the prompt's KV from its prefill worker: as
	// vLLM counts tokens a KV connector loaded among the cached ones, its usage reports them all.
	kvLoaded bool
	// recomputed is set when a decode leg with a remote prefill computed the prompt itself
	// (FaultRecompute): its usage reports cached_tokens 0.
	recomputed bool
	// tool is the call a chat request is answered with (tools.go), nil for text.
	tool *toolCall
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
	case PathResponses:
		return kindResponses, true
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

// parseInference decodes and normalizes an inference request body, measuring
// chat images only (see parseInferenceImages).
func parseInference(kind apiKind, body []byte) (*inference, *apiError) {
	return parseInferenceImages(kind, body, imageSize)
}

// parseInferenceImages decodes and normalizes an inference request body in
// one pass, computing detail of each chat image.
func parseInferenceImages(kind apiKind, body []byte, detail imageDetail) (*inference, *apiError) {
	o, err := parseObject(body)
	if err != nil {
		return nil, badRequest("invalid JSON body: %v", err)
	}
	var (
		in    *inference
		aerr  *apiError
		typed error
	)
	f := topFields(o, &typed)
	switch kind {
	case kindChat:
		in, aerr = parseChat(f, detail)
	case kindCompletion:
		in, aerr = parseCompletion(f)
	case kindResponses:
		in, aerr = parseResponses(f, detail)
	default:
		in, aerr = parseGenerate(f)
	}
	if aerr != nil {
		return nil, aerr
	}
	if kind != kindChat && kind != kindResponses { // their media are in the messages: never metadata-only
		if aerr := in.checkMetadata(); aerr != nil {
			return nil, aerr
		}
	}
	in.kind = kind
	in.promptKey = SaltedKey(PromptKey(in.promptIDs), in.cacheSalt)
	if in.maxTokens != nil && (*in.maxTokens < 1 || *in.maxTokens > maxGeneratedTokens) {
		return nil, badRequest("%s must be between 1 and %d, got %d", in.maxTokensName, maxGeneratedTokens, *in.maxTokens)
	}
	return in, nil
}

// common reads the members the three formats share.
func common(f fields) *inference {
	opts := f.object("stream_options")
	return &inference{
		model:         f.str("model"),
		cacheSalt:     f.str("cache_salt"),
		stream:        f.boolean("stream"),
		includeUsage:  opts.boolean("include_usage"),
		streamOptions: opts.obj != nil && len(opts.obj.Fields()) > 0,
		kv:            f.params("kv_transfer_params"),
		bootstrap:     sglangFields(f),
		ec:            f.params("ec_transfer_params"),
		kvName:        "kv_transfer_params",
		ecName:        "ec_transfer_params",
	}
}

// checkStreamOptions refuses stream_options without streaming, as vLLM's chat and completion
// request validators do (an empty or null stream_options passes there too).
func (in *inference) checkStreamOptions() *apiError {
	if in.streamOptions && !in.stream {
		return &apiError{status: http.StatusBadRequest, msg: "Stream options can only be defined when `stream=True`.", param: "stream_options"}
	}
	return nil
}

// checkModel refuses a request naming another model than the one served, as vLLM does (no
// model means the served one).
func (in *inference) checkModel(served string) *apiError {
	if in.model == "" || in.model == served {
		return nil
	}
	return &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("The model `%s` does not exist.", in.model), param: "model"}
}

// parseChat normalizes a chat completion request; its messages are rendered
// only when every other member is well-typed.
func parseChat(f fields, detail imageDetail) (*inference, *apiError) {
	in := common(f)
	in.maxTokens, in.maxTokensName = f.integer("max_tokens"), "max_tokens"
	if n := f.integer("max_completion_tokens"); n != nil {
		in.maxTokens, in.maxTokensName = n, "max_completion_tokens"
	}
	messages := f.raw("messages")
	tokens := f.object("tokens")
	ids := tokens.ints("token_ids")
	in.features = parseFeatures(tokens.object("features"))
	tools, toolChoice := f.raw("tools"), f.raw("tool_choice")
	continueFinal := f.boolean("continue_final_message")
	// add_generation_prompt defaults to true.
	generationPrompt := f.boolean("add_generation_prompt") || f.raw("add_generation_prompt") == nil
	if err := typeError(f); err != nil {
		return nil, err
	}
	if err := in.checkStreamOptions(); err != nil {
		return nil, err
	}
	if continueFinal && generationPrompt {
		return nil, badRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	r := renderer{detail: detail}
	if err := r.render(messages); err != nil {
		return nil, badRequest("%v", err)
	}
	in.promptIDs, in.echo, in.chatImages = r.ids, r.lastUser, r.images
	if continueFinal {
		if r.lastRole != "assistant" {
			return nil, badRequest("continue_final_message needs a final assistant message to continue, the last message has role %q", r.lastRole)
		}
		for _, t := range r.lastTexts {
			in.continued += len(strings.Fields(t))
		}
	}
	var aerr *apiError
	if in.tool, aerr = in.toolCallOf(tools, toolChoice); aerr != nil {
		return nil, aerr
	}
	if len(ids) > 0 {
		in.promptIDs = ids
	}
	return in, nil
}

// parseCompletion normalizes a text completion request.
func parseCompletion(f fields) (*inference, *apiError) {
	in := common(f)
	in.maxTokens, in.maxTokensName = f.integer("max_tokens"), "max_tokens"
	in.features = parseFeatures(f.object("features"))
	prompt := f.raw("prompt")
	if err := typeError(f); err != nil {
		return nil, err
	}
	if err := in.checkStreamOptions(); err != nil {
		return nil, err
	}
	switch {
	case prompt == nil:
		return nil, badRequest("prompt is required")
	case prompt[0] == '"':
		text, _ := jsonString(prompt, "prompt")
		in.promptIDs = TokenizePrompt(text)
		in.echo = []string{text}
		return in, nil
	}
	if ids, err := jsonInts(prompt, "prompt"); err == nil && len(ids) > 0 {
		in.promptIDs = ids
		in.words = tokenWords(ids)
		return in, nil
	}
	return nil, badRequest("prompt must be a string or a non-empty array of token ids")
}

// parseGenerate normalizes a vLLM generate (tokens-in, tokens-out) request.
func parseGenerate(f fields) (*inference, *apiError) {
	in := common(f)
	in.requestID = f.str("request_id")
	in.promptIDs = f.ints("token_ids")
	in.features = parseFeatures(f.object("features"))
	sampling := f.object("sampling_params")
	in.maxTokens, in.maxTokensName = sampling.integer("max_tokens"), "sampling_params.max_tokens"
	extra := sampling.object("extra_args")
	if kv := extra.params("kv_transfer_params"); kv != nil {
		in.kv, in.kvName = kv, "sampling_params.extra_args.kv_transfer_params"
	}
	if ec := extra.params("ec_transfer_params"); ec != nil {
		in.ec, in.ecName = ec, "sampling_params.extra_args.ec_transfer_params"
	}
	if err := typeError(f); err != nil {
		return nil, err
	}
	switch {
	case len(in.promptIDs) == 0:
		return nil, badRequest("token_ids is required and must not be empty")
	case sampling.obj == nil:
		return nil, badRequest("sampling_params is required")
	}
	return in, nil
}

// typeError returns the answer to the type error kept by f, if any.
func typeError(f fields) *apiError {
	if *f.err == nil {
		return nil
	}
	return badRequest("invalid JSON body: %v", *f.err)
}

// tokenWords names prompt tokens as words ("t<id>") for echoing, skipping BOS
// and media placeholders.
func tokenWords(ids []int) []string {
	var words []string
	for _, id := range ids {
		if id != BOSTokenID && !isPlaceholder(id) {
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

// outputWords returns n words cycled from the echo source, from word
// in.continued of the cycle on: a continuation of m words is the rest of what
// the request without them would have produced.
func (in *inference) outputWords(n int) []string {
	src := in.words
	if src == nil {
		src = firstWords(in.echo, in.continued+n)
	}
	if len(src) == 0 {
		src = []string{fallbackWord}
	}
	out := make([]string, n)
	for i := range out {
		out[i] = src[(in.continued+i)%len(src)]
	}
	return out
}

// firstWords returns the first n words of texts, or all of them when there
// are fewer.
func firstWords(texts []string, n int) []string {
	var words []string
	for _, t := range texts {
		for w := range strings.FieldsSeq(t) {
			if len(words) == n {
				return words
			}
			words = append(words, w)
		}
	}
	return words
}

// outputTokenIDs returns the n token ids that continue the prompt's content
// (its ids without BOS and media placeholders) with its shortest period: the
// content C of length L, whose shortest period is p (C[i] == C[i+p] for
// every i, p == L when nothing repeats), is followed by C[(L+i) % p]. When
// no content id repeats that cycles the content from its start; and since
// the content followed by k ids of its output has the same shortest period,
// a prompt extended by the first k output ids is answered with the rest.
func (in *inference) outputTokenIDs(n int) []int {
	src := make([]int, 0, len(in.promptIDs))
	for _, id := range in.promptIDs {
		if id != BOSTokenID && !isPlaceholder(id) {
			src = append(src, id)
		}
	}
	if len(src) == 0 {
		src = []int{WordTokenID(fallbackWord)}
	}
	period := shortestPeriod(src)
	out := make([]int, n)
	for i := range out {
		out[i] = src[(len(src)+i)%period]
	}
	return out
}

// shortestPeriod returns the least p > 0 with s[i] == s[i+p] wherever both
// exist: len(s) less its longest proper border (the KMP failure function).
func shortestPeriod(s []int) int {
	border := make([]int, len(s))
	for i := 1; i < len(s); i++ {
		k := border[i-1]
		for k > 0 && s[i] != s[k] {
			k = border[k-1]
		}
		if s[i] == s[k] {
			k++
		}
		border[i] = k
	}
	return len(s) - border[len(s)-1]
}

// leg is the disaggregation leg a request asks for.
type leg int

// The legs a prefill/decode worker distinguishes.
const (
	legLocal         leg = iota // compute the prompt locally
	legPrefill                  // do_remote_decode: prefill and hand KV off
	legRemotePrefill            // do_remote_prefill: pull KV, then decode
)

// sglangFields returns the top-level SGLang bootstrap fields of a body, nil without a
// bootstrap_room.
func sglangFields(f fields) rawParams {
	room := f.raw("bootstrap_room")
	if room == nil {
		return nil
	}
	p := rawParams{"bootstrap_room": room}
	for _, k := range []string{"bootstrap_host", "bootstrap_port"} {
		if v := f.raw(k); v != nil {
			p[k] = v
		}
	}
	return p
}

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

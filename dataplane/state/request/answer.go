package request

// AnswerStats is what an answer says about itself: the model that served it and its usage
// (OpenAI's usage object: prompt, completion and cached prompt tokens).
type AnswerStats struct {
	// Model is the answer's model member ("" when absent): the served model, which may differ
	// from the requested one (an alias, a LoRA adapter).
	Model string
	// HasUsage is true once a usage object was read; the counts are its members.
	HasUsage                                     bool
	PromptTokens, CompletionTokens, CachedTokens int64
	// HasCached is true when that usage had prompt_tokens_details.cached_tokens (or the
	// Responses API's input_tokens_details.cached_tokens): CachedTokens is a count the worker
	// reported, not a missing one (vLLM reports it only with --enable-prompt-tokens-details).
	HasCached bool
}

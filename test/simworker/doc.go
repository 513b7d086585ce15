// Package simworker is a vLLM stand-in for tests, benchmarks and demos of the
// disaggregated-inference coordinator.
//
// A Worker speaks the vLLM HTTP API (OpenAI chat and text completions, the
// tokens-in/tokens-out /inference/v1/generate endpoint, the render service,
// /v1/models and /health) and plays one disaggregation role: encode, prefill,
// decode or both. It behaves like the real thing where the coordinator can
// observe it: prefill legs answer with connector-specific kv_transfer_params,
// decode legs verify those parameters against the prefill worker through a
// side channel, encode legs publish ec_transfer_params, Prefer: if-available
// requests get 412 on a prefix-cache miss, and streams are real SSE.
//
// Text generation is deterministic (echo mode): the words of the last user
// message or the prompt are cycled to produce exactly max_tokens tokens. The
// tokenizer is deterministic too and exported so that tests can compute the
// token ids, prompt keys and multimodal hashes a worker will produce.
package simworker

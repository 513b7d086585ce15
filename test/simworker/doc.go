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
// It refuses what vLLM refuses where a coordinator bug would otherwise go
// unnoticed: an inference request naming another model than the served one
// (404 NotFoundError, param "model"; no model means the served one), chat and
// completion requests with a non-empty stream_options but no stream=true (400,
// param "stream_options", vLLM's message), and a second pull of the same NIXL
// KV handle: a decode releases the handle once it has read the blocks, as a
// vLLM decode frees them, so a replayed or retried decode fails with "KV
// transfer failed".
//
// Text generation is deterministic (echo mode): the words of the last user
// message or the prompt are cycled to produce exactly max_tokens tokens. The
// tokenizer is deterministic too and exported so that tests can compute the
// token ids, prompt keys and multimodal hashes a worker will produce.
//
// # Differences from vLLM
//
// Where the worker still differs, and why:
//
//   - No model: echo generation, a word tokenizer and simulated encoder
//     outputs, so that tests can predict every token.
//   - Stricter legs, on purpose: a prefill or encode leg must ask for exactly
//     one token without streaming, and a prefill (decode) role refuses legs
//     that are not (are) prefill legs; vLLM serves them. This catches
//     coordinator legs that waste work or hit the wrong pool.
//   - Transfers go through HTTP side channels between workers (GET /kv/{id} to
//     look a handle up, DELETE /kv/{id} to free it; GET /ec/{hash}), not NIXL
//     reads and notifications. A decode that fails its checks leaves the handle
//     to another pull, and unpulled handles live in an LRU of 65536 instead of
//     being freed after vLLM's abort timeout. vLLM's answer to a decode whose
//     remote blocks are gone depends on its version and kv_load_failure_policy
//     (recompute or fail); the worker always fails, so that replays show.
//   - SGLang bootstrap parameters are only checked for shape (no bootstrap
//     server; a room may be reused); shared-storage KV and EC files are keyed
//     by prompt key and image hash and can be read any number of times; EC
//     descriptors can be looked up any number of times.
//   - The prefix cache is an LRU of whole prompts, not of KV blocks, so a
//     Prefer: if-available hit needs the exact prompt.
//   - The render endpoints take any model, and the generate endpoint accepts
//     stream_options without stream; only the checks named above are mirrored.
//   - Request bodies are typed with encoding/json's rules (no pydantic
//     coercion of "5" to 5), and error messages other than the mirrored ones
//     are the worker's own. A request that names an unknown model and is
//     malformed in its messages gets the 400 here, the 404 from vLLM.
package simworker

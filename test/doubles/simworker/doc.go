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
// token ids, prompt keys and multimodal hashes a worker will produce. A chat
// request with tools whose tool_choice is required or names a function is
// answered with one call of it instead, its arguments derived from the tool's
// parameters schema (see tools.go); tool_choice auto answers text.
//
// # Media
//
// Chat messages may carry image_url, audio_url, input_audio ({"data",
// "format"}) and video_url parts. Each item of modality m (image, audio for
// audio_url and input_audio alike, video) renders as MediaTokenCount(m, B)
// MediaTokenID(m) placeholder tokens, B being its bytes (a data: URL's or an
// input_audio's decoded payload, else the URL itself), and its mm_hash is
// MediaHash(m, B): vLLM's features, keyed by modality, in document order
// within each. An encode leg carries one part of any modality and gets one EC
// descriptor; a prefill leg needs the encoder outputs of every item, and a
// prefill or decode chat leg's tokens.features must line up with its
// messages, modality by modality (counts, lengths, the placeholder tokens
// they cover), or the worker answers 400 as vLLM would fail.
//
// # Streams and continuations
//
// Every streamed event that has a choice carries exactly one generated token
// (one word in the text formats, one id in token_ids), except the chat role
// event that opens a chat stream (role "assistant", content ""); the usage
// event has no choice. Counting token events therefore counts the tokens
// produced, also for a stream cut off by a fault.
//
// Generation is a pure function of the context, so that a client resuming
// an interrupted answer gets exactly its rest, as from a greedy model:
//
//   - Chat, as vLLM's continue_final_message: a request whose final message
//     is the assistant's, with continue_final_message true and
//     add_generation_prompt false, continues that message. With m words in
//     it and max tokens n, the output is words m to m+n-1 of the cycle the
//     request without the final message would produce (the last user
//     message is the same), and the first piece starts with a space when
//     m > 0: the existing content plus the pieces is what the uncontinued
//     request with max tokens m+n would have said. usage.prompt_tokens
//     counts the whole rendered prompt, the assistant's role token and m
//     words included (the tokenizer has no generation-prompt or
//     end-of-turn tokens, so this is one more than the original prompt plus
//     m). As in vLLM, continue_final_message with add_generation_prompt true
//     is a 400 ("Cannot set both `continue_final_message` and
//     `add_generation_prompt` to True."); add_generation_prompt defaults to
//     true, so leaving it out is that 400 too. Continuing a final message
//     that is not the assistant's is a 400 of the worker's own.
//   - Generate (tokens in): the output continues the prompt's content ids
//     (without BOS and media placeholders) with their shortest period: C of
//     length L with shortest period p is followed by C[(L+i) % p]. When no
//     content id repeats, p == L and the output cycles the content from its
//     start, as it always did; and since C followed by the first k output
//     ids has the same shortest period, a request whose token_ids are the
//     original prompt plus the k ids produced so far, with max tokens
//     reduced by k, gets exactly the remaining ids. (A prompt whose content
//     repeats a pattern, for example [7 8 7], is itself read as such a
//     continuation: it yields 8 7 8 ..., where cycling from the start gave
//     7 8 7 ....)
//
// # Faults
//
// A worker fails on demand the way a real one does, for fault-tolerance
// tests: InjectFault queues Faults (FailNext is the FaultStatus shorthand),
// each applying to the next Count inference or render requests (whose body
// contains Fault.Match, when set: one modality's encode legs): an error
// status, a TCP reset before the headers, a hang before or after the
// headers, a decode that ignores its KV transfer and recomputes the prompt
// (FaultRecompute: usage cached_tokens 0, where a decode that loaded the KV
// reports every prompt token cached, as vLLM does), or a death mid-answer
// after a given number of stream tokens (the
// connection is reset with SO_LINGER 0 after what was flushed, as a
// SIGKILL'd or OOM-killed vLLM looks to its peer). Requests records which
// fault each request drew, and AwaitRequests lets a test wait for a request
// to arrive or end. Kill stops a started worker as SIGKILL does: dials are
// refused and open connections reset. A worker process started with
// --fault-control (Config.FaultControl) takes faults over HTTP at
// PathFaults: POST a Fault as JSON, for example
// {"kind":"die-mid-stream","count":2,"after_tokens":3}, DELETE to clear the
// queue, GET to list it; each answers {"faults":[...]}, the queue
// afterwards, and these requests are neither recorded nor faulted.
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
//   - SGLang's transfer is a rendezvous over HTTP (POST /bootstrap/{room} on
//     the prefill worker's bootstrap server, Config.BootstrapAddr or its own
//     listener), not ZMQ and RDMA, but it keeps SGLang's contract: the prefill
//     leg waits for its decode to join the room and the decode for its
//     prefill, each failing after Config.BootstrapTimeout (300s), so a
//     sequential prefill-then-decode fails as on SGLang (llm-d-router#2974);
//     a room serves one prefill and one decode, and a decode whose prefill
//     worker dies fails at once. Shared-storage KV and EC files are keyed
//     by prompt key and media item hash and can be read any number of times; EC
//     descriptors can be looked up any number of times.
//   - No data-parallel ranks: a kv-nixl prefill answers remote_dp_rank equal
//     to its leg's X-Data-Parallel-Rank (a non-negative integer; nothing
//     without one), the rank a data-parallel vLLM would have run it on.
//   - The prefix cache is an LRU of whole prompts, not of KV blocks, so a
//     Prefer: if-available hit needs the exact prompt.
//   - The render endpoints take any model, and the generate endpoint accepts
//     stream_options without stream; only the checks named above are mirrored.
//   - Request bodies are typed with encoding/json's rules (no pydantic
//     coercion of "5" to 5), and error messages other than the mirrored ones
//     are the worker's own. A request that names an unknown model and is
//     malformed in its messages gets the 400 here, the 404 from vLLM.
package simworker

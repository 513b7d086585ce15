package simworker

import (
	"net/http"
	"strings"
	"time"

	"github.com/epd-dev/coordinator/dataplane/transport/retry"
)

// Usage is the token accounting of a response.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// PromptTokensDetails says, as vLLM does, how many prompt tokens the worker did not compute:
	// all of them when it had served the prompt before (its prefix cache) or loaded the prompt's
	// KV from a prefill worker, 0 when it ignored that KV (FaultRecompute), absent otherwise.
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptTokensDetails is usage.prompt_tokens_details.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// finishLength is the finish_reason of every generation: echo mode always
// produces exactly max_tokens tokens.
const finishLength = "length"

// generation is one response being produced.
type generation struct {
	in        *inference
	id        string // response id ("chatcmpl-..", "cmpl-..", or the generate request id)
	model     string
	created   int64
	words     []string // text formats
	continues bool     // words continue a final assistant message that has words: the text starts with a space
	ids       []int    // generate format
	usage     Usage
	kv        any
	ec        map[string]ECDescriptor
	seq       int // the next sequence_number of a Responses stream event
}

// newGeneration prepares the response to in.
func (w *Worker) newGeneration(r *http.Request, in *inference, kv any, ec map[string]ECDescriptor) *generation {
	n := in.completionTokens(w.cfg.DefaultMaxTokens)
	if in.tool != nil {
		n = in.tool.tokens(n)
	}
	g := &generation{
		in:      in,
		model:   in.model,
		created: time.Now().Unix(),
		usage:   Usage{PromptTokens: len(in.promptIDs), CompletionTokens: n, TotalTokens: len(in.promptIDs) + n},
		kv:      kv,
		ec:      ec,
	}
	if g.model == "" {
		g.model = w.cfg.ModelName
	}
	switch {
	case in.recomputed:
		g.usage.PromptTokensDetails = &PromptTokensDetails{} // cached_tokens 0, as vLLM reports a recompute
	case in.cachedPrompt || in.kvLoaded:
		g.usage.PromptTokensDetails = &PromptTokensDetails{CachedTokens: len(in.promptIDs)}
	}
	rid := r.Header.Get("X-Request-Id")
	if rid == "" {
		rid = w.newID("")
	}
	switch in.kind {
	case kindChat:
		g.id = "chatcmpl-" + rid
		g.words = in.outputWords(n)
		g.continues = in.continued > 0
	case kindCompletion:
		g.id = "cmpl-" + rid
		g.words = in.outputWords(n)
	case kindResponses:
		g.id = "resp_" + rid
		g.words = in.outputWords(n)
	default:
		g.id = in.requestID
		if g.id == "" {
			g.id = rid
		}
		g.ids = in.outputTokenIDs(n)
	}
	return g
}

// respond answers in, streamed or not, after the simulated latency.
func (w *Worker) respond(rw http.ResponseWriter, r *http.Request, in *inference, kv any, ec map[string]ECDescriptor) {
	g := w.newGeneration(r, in, kv, ec)
	if in.stream {
		w.stream(r.Context(), rw, g)
		return
	}
	if !retry.Sleep(r.Context(), w.latency(g.usage.CompletionTokens)) {
		return // client gone or worker closing
	}
	writeJSON(rw, http.StatusOK, g.full())
}

// latency is the time a non-streamed response of n tokens takes.
func (w *Worker) latency(n int) time.Duration {
	return w.cfg.TTFT + time.Duration(max(n-1, 0))*w.cfg.ITL
}

// text returns the generated text: the words joined by single spaces (and
// preceded by one for a continuation), the concatenation of the pieces.
func (g *generation) text() string {
	if g.continues {
		return " " + strings.Join(g.words, " ")
	}
	return strings.Join(g.words, " ")
}

// full returns the non-streamed response body.
func (g *generation) full() any {
	switch g.in.kind {
	case kindChat:
		if g.in.tool != nil {
			return g.toolFull()
		}
		return ChatCompletion{
			ID: g.id, Object: "chat.completion", Created: g.created, Model: g.model,
			Choices: []ChatChoice{{
				Message:      ChatMessage{Role: "assistant", Content: g.text()},
				FinishReason: finishLength,
			}},
			Usage: g.usage, KVTransferParams: g.kv, ECTransferParams: g.ec,
		}
	case kindCompletion:
		return TextCompletion{
			ID: g.id, Object: "text_completion", Created: g.created, Model: g.model,
			Choices: []TextChoice{{Text: g.text(), FinishReason: ptr(finishLength)}},
			Usage:   &g.usage, KVTransferParams: g.kv, ECTransferParams: g.ec,
		}
	case kindResponses:
		return g.responseObject(g.finalStatus(), true)
	default:
		return GenerateResponse{
			RequestID: g.id, Model: g.model, Created: g.created,
			Choices: []GenerateChoice{{TokenIDs: g.ids, FinishReason: ptr(finishLength)}},
			Usage:   &g.usage, KVTransferParams: g.kv, ECTransferParams: g.ec,
		}
	}
}

// ptr returns a pointer to v.
func ptr[T any](v T) *T { return &v }

// ChatCompletion is a non-streamed chat completion ("chat.completion").
type ChatCompletion struct {
	ID               string                  `json:"id"`
	Object           string                  `json:"object"`
	Created          int64                   `json:"created"`
	Model            string                  `json:"model"`
	Choices          []ChatChoice            `json:"choices"`
	Usage            Usage                   `json:"usage"`
	KVTransferParams any                     `json:"kv_transfer_params,omitempty"`
	ECTransferParams map[string]ECDescriptor `json:"ec_transfer_params,omitempty"`
}

// ChatChoice is one choice of a ChatCompletion.
type ChatChoice struct {
	Index        int         `json:"index"`
	Message      ChatMessage `json:"message"`
	Logprobs     *struct{}   `json:"logprobs"`
	FinishReason string      `json:"finish_reason"`
}

// ChatMessage is the assistant message of a ChatChoice.
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// TextCompletion is a text completion ("text_completion"), streamed chunk or
// full response.
type TextCompletion struct {
	ID               string                  `json:"id"`
	Object           string                  `json:"object"`
	Created          int64                   `json:"created"`
	Model            string                  `json:"model"`
	Choices          []TextChoice            `json:"choices"`
	Usage            *Usage                  `json:"usage,omitempty"`
	KVTransferParams any                     `json:"kv_transfer_params,omitempty"`
	ECTransferParams map[string]ECDescriptor `json:"ec_transfer_params,omitempty"`
}

// TextChoice is one choice of a TextCompletion.
type TextChoice struct {
	Index        int       `json:"index"`
	Text         string    `json:"text"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

// GenerateResponse is the answer of /inference/v1/generate, streamed chunk or
// full response.
type GenerateResponse struct {
	RequestID        string                  `json:"request_id"`
	Model            string                  `json:"model,omitempty"`
	Created          int64                   `json:"created,omitempty"`
	Choices          []GenerateChoice        `json:"choices"`
	Usage            *Usage                  `json:"usage,omitempty"`
	KVTransferParams any                     `json:"kv_transfer_params,omitempty"`
	ECTransferParams map[string]ECDescriptor `json:"ec_transfer_params,omitempty"`
}

// GenerateChoice is one choice of a GenerateResponse.
type GenerateChoice struct {
	Index        int     `json:"index"`
	TokenIDs     []int   `json:"token_ids"`
	FinishReason *string `json:"finish_reason"`
}

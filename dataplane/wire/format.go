// Package wire holds the API formats the coordinator speaks, as types: chat completions,
// completions, tokens-in generate and the Responses API are Formats (one file each), what the
// client sends and what the legs carry; Anthropic's Messages is a Client whose legs are chat
// (messages.go). A format knows its path, what a client body must hold, where its conversation
// carries media, how its prompt is tokenized, how each leg's body is built from the request
// (conditional decode, encode, prefill, decode, the continuation of a broken stream), how its
// answers give their usage, and how its streams end, fail and continue. Steps ask the format;
// none switches on the API.
//
// One mechanism serves every client API (Client): the server parses a client's body into the
// body its legs carry, runs the pipeline in that body's Format, and writes the answer back in the
// client's own shape. For the four formats the workers serve themselves the body is the client's
// own and the answer passes through as the worker wrote it (the Responses API is threaded, not
// translated); a Messages request is translated to chat at the edge and its chat answer back.
package wire

import (
	"context"
	"encoding/json"

	"github.com/epd-dev/coordinator/dataplane/media"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// Format is one format of the pipeline's legs: what a client body of it holds and how each leg
// of a request in it is built. Chat, Completions, Generate and Responses are its values.
type Format interface {
	// API is the format as a request records it (request.Context.API).
	API() request.API
	// Path is where clients send the format and workers serve it.
	Path() string
	// Check validates what the steps rely on in a client body of the format (beyond what every
	// format checks: model, stream, the token limits, stream_options), with a 400 naming the
	// member; it may complete the body (the Responses API's store: false).
	Check(obj *body.Object) error
	// Media is where the format's conversation carries media parts (nil: it carries none).
	Media() *media.Layout
	// Legs is the format the encode and prefill legs are sent in: the client's own, or tokens-in
	// generate when use_openai_format is false (completions always stay completions, as
	// upstream).
	Legs(useOpenAI bool) Format
	// Render tokenizes the request's prompt with r, as the format gives it.
	Render(ctx context.Context, rc *request.Context, r Renderer) error
	// Conditional is the conditional-decode leg's body: the client's with the rendered prompt,
	// no transfer parameters and no cap (it may be the answer).
	Conditional(rc *request.Context) *body.Object
	// Decode is the decode leg's body: base (the client's body, or the one force_stream streams)
	// with what earlier phases produced (the rendered prompt, each media part's uuid) and kv as
	// the KV transfer parameters when not nil. With neither render nor kv it is base unchanged.
	Decode(rc *request.Context, base *body.Object, kv json.RawMessage) (*body.Object, error)
	// Prefill is the prefill leg's body in this format (a leg format, Legs): capped to one
	// token, with t's transfer parameters.
	Prefill(rc *request.Context, t Transfer) (*body.Object, error)
	// Encoder is how the encode legs of the request's media items are built: their path and a
	// builder of item i's body. The conversation is read once.
	Encoder(rc *request.Context) (path string, item func(i int) (*body.Object, error), err error)
	// Continue is the prefill leg of a broken stream's continuation cont (a body of this
	// format): cont capped to one token, with ec as the encoder transfer parameters when not nil.
	Continue(cont *body.Object, ec json.RawMessage) (*body.Object, error)
	// AskUsage makes a streamed request ask its decode worker for the usage chunk, so that its
	// tokens can be counted, and sets rc.HideUsage when the client did not ask for it: the client
	// then gets the stream it asked for. Formats without a usage chunk do nothing.
	AskUsage(rc *request.Context)
	// Events is how the format's answers stream.
	Events() Events

	// sampling is where a body of the format keeps its sampling settings: the body itself, or
	// generate's sampling_params (nil when absent or malformed).
	sampling(obj *body.Object) *body.Object
}

// Transfer are the transfer parameters a prefill leg carries (nil: none).
type Transfer struct {
	// KV is the KV connector's kv_transfer_params.
	KV json.RawMessage
	// EC is the merged ec_transfer_params of the encode legs.
	EC json.RawMessage
}

// Renderer tokenizes a request's prompt in the shape its format gives it (the render step).
type Renderer interface {
	// TokensIn takes the prompt of a tokens-in request: its own token ids and features.
	TokensIn(rc *request.Context) error
	// Prompt tokenizes a completions prompt (a string, or token ids already).
	Prompt(ctx context.Context, rc *request.Context) error
	// Conversation tokenizes msgs, a chat body: the request's own, or the chat messages a
	// Responses request stands for.
	Conversation(ctx context.Context, rc *request.Context, msgs *body.Object) error
}

// The formats.
var (
	Chat        Format = chat{conversation{&media.Layout{Messages: "messages"}}}
	Completions Format = completions{}
	Generate    Format = generate{}
	Responses   Format = responses{conversation{&media.Layout{Messages: "input", Input: true}}}
)

// formats are the formats by request.API.
var formats = [...]Format{request.APIChat: Chat, request.APICompletions: Completions, request.APIGenerate: Generate,
	request.APIResponses: Responses}

// Of is the format of api.
func Of(api request.API) Format { return formats[api] }

// Paths are the client paths of the formats.
var Paths = []string{Chat.Path(), Completions.Path(), Generate.Path(), Responses.Path()}

// ForPath is the format served at path (nil: none).
func ForPath(path string) Format {
	for _, f := range formats {
		if f.Path() == path {
			return f
		}
	}
	return nil
}

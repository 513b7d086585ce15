package wire

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// responses is OpenAI's Responses API, served statelessly (responses_input.go): the workers serve
// it themselves, so every leg keeps its shape (threaded through the pipeline, not translated),
// its input items carry the conversation's content parts, its legs carry the rendered prompt as
// chat's do, and its only token limit is max_output_tokens. Its streams are never continued
// (the API has no continuation of a partial answer); they end with the response's own terminal
// event.
type responses struct{ conversation }

func (responses) API() request.API { return request.APIResponses }
func (responses) Path() string     { return "/v1/responses" }

// Check validates the request and refuses stored state (checkResponses), then makes it stateless.
func (responses) Check(obj *body.Object) error {
	if err := checkResponses(obj); err != nil {
		return err
	}
	stateless(obj)
	return nil
}

func (responses) Legs(useOpenAI bool) Format {
	if !useOpenAI {
		return Generate
	}
	return Responses
}

// Render tokenizes the chat messages vLLM builds from the request (responsesChat).
func (responses) Render(ctx context.Context, rc *request.Context, r Renderer) error {
	chat, err := responsesChat(rc.Body)
	if err != nil {
		return err
	}
	return r.Conversation(ctx, rc, chat)
}

func (r responses) Conditional(rc *request.Context) *body.Object {
	return conditional(rc, "tokens", tokensSegments)
}

func (r responses) Decode(rc *request.Context, base *body.Object, kv json.RawMessage) (*body.Object, error) {
	return r.decode(rc, base, kv)
}

// Prefill is capped with max_output_tokens alone (the API has no max_tokens) and stays on
// /v1/responses.
func (r responses) Prefill(rc *request.Context, t Transfer) (*body.Object, error) {
	obj := r.prefill(rc, t)
	capOneToken(obj, func(o *body.Object) { o.Set("max_output_tokens", jsonOne) })
	return obj, nil
}

// Encoder builds chat-shaped legs: an encode leg is one media part.
func (r responses) Encoder(rc *request.Context) (string, func(int) (*body.Object, error), error) {
	return r.encoder(rc, Chat.Path())
}

func (responses) Continue(*body.Object, json.RawMessage) (*body.Object, error) {
	return nil, errors.New("the Responses API's streams are not continued")
}

func (responses) AskUsage(*request.Context) {} // the response's own usage is in its terminal event
func (responses) Events() Events            { return responsesEvents }

func (responses) sampling(obj *body.Object) *body.Object { return obj }

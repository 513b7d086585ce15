package wire

import (
	"net/http"
	"strings"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/wire/anthropic"
)

// Anthropic's Messages API paths: /v1/messages runs through the pipeline as a chat request;
// count_tokens runs only the pipeline's render step (the server's handler).
const (
	MessagesPath    = "/v1/messages"
	CountTokensPath = "/v1/messages/count_tokens"
)

// Messages is Anthropic's Messages API: a request is translated to chat at the edge
// (package anthropic) and the chat answer, JSON or a stream, back; its errors are in Anthropic's
// shape (ErrorFormat).
var Messages Client = messages{}

type messages struct{}

func (messages) Route() string  { return "messages" }
func (messages) Format() Format { return Chat }

func (messages) Parse(raw []byte, lim Limits) (Request, error) {
	req, err := anthropic.Translate(raw, anthropic.Create, lim.MaxContentBlocks)
	if err != nil {
		return Request{}, err
	}
	return Request{Body: req.Chat, Model: req.Model, Stream: req.Stream, answer: func(w http.ResponseWriter, requestID string) Answer {
		return anthropic.NewWriter(w, anthropic.Options{RequestID: requestID, Model: req.Model, StopSequences: req.StopSequences,
			MaxEvent: lim.MaxEvent})
	}}, nil
}

// ErrorFormat is the error body format of a request path: Anthropic's for the Messages API,
// OpenAI's (nil) elsewhere.
func ErrorFormat(path string) apierror.Format {
	if path == MessagesPath || strings.HasPrefix(path, MessagesPath+"/") {
		return anthropic.ErrorBody
	}
	return nil
}

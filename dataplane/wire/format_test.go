package wire

import (
	"testing"

	"github.com/epd-dev/coordinator/dataplane/state/request"
)

func TestForPathAndLegs(t *testing.T) {
	tests := map[string]struct {
		api             request.API
		openAI, tokenIn Format
	}{
		"/v1/chat/completions":   {request.APIChat, Chat, Generate},
		"/v1/completions":        {request.APICompletions, Completions, Completions},
		"/inference/v1/generate": {request.APIGenerate, Generate, Generate},
		"/v1/responses":          {request.APIResponses, Responses, Generate},
	}
	for path, tc := range tests {
		f := ForPath(path)
		if f != Of(tc.api) || f.API() != tc.api || f.Legs(true) != tc.openAI || f.Legs(false) != tc.tokenIn || f.Path() != path {
			t.Errorf("%s: %v, formats %v/%v, path %s", path, f, f.Legs(true), f.Legs(false), f.Path())
		}
	}
	if ForPath("/v1/models") != nil || ClientFor("/v1/models") != nil || ClientFor(MessagesPath) != Messages {
		t.Fatal("only the formats' paths and /v1/messages are client APIs")
	}
}

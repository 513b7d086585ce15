package wire

import (
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

func TestReadStats(t *testing.T) {
	tests := map[string]struct {
		docs []string
		want request.AnswerStats
	}{
		"an answer": {docs: []string{`{"model":"served","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}}`},
			want: request.AnswerStats{Model: "served", HasUsage: true, PromptTokens: 7, CompletionTokens: 3, CachedTokens: 4, HasCached: true}},
		"chunks: the first model, the last usage": {docs: []string{`{"model":"a","choices":[]}`, `{"model":"b","usage":{"prompt_tokens":1,"completion_tokens":1}}`,
			`{"model":"c","usage":{"prompt_tokens":2,"completion_tokens":5}}`}, want: request.AnswerStats{Model: "a", HasUsage: true, PromptTokens: 2, CompletionTokens: 5}},
		"a worker's nonsense counts nothing wrong": {docs: []string{`{"usage":{"prompt_tokens":-5,"completion_tokens":-1,"prompt_tokens_details":{"cached_tokens":99}}}`},
			want: request.AnswerStats{HasUsage: true, HasCached: true}},
		"cached above the prompt is capped": {docs: []string{`{"usage":{"prompt_tokens":3,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":9}}}`},
			want: request.AnswerStats{HasUsage: true, PromptTokens: 3, CompletionTokens: 1, CachedTokens: 3, HasCached: true}},
		"cached 0 reported, as a decode that recomputed says it": {docs: []string{`{"usage":{"prompt_tokens":38,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}`},
			want: request.AnswerStats{HasUsage: true, PromptTokens: 38, CompletionTokens: 2, HasCached: true}},
		"details without a count, or a null one, report nothing cached": {docs: []string{`{"usage":{"prompt_tokens":4,"completion_tokens":1,"prompt_tokens_details":{}}}`,
			`{"usage":{"prompt_tokens":4,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":null}}}`},
			want: request.AnswerStats{HasUsage: true, PromptTokens: 4, CompletionTokens: 1}},
		"a later usage without details forgets the earlier count": {docs: []string{`{"usage":{"prompt_tokens":4,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":4}}}`,
			`{"usage":{"prompt_tokens":4,"completion_tokens":2}}`},
			want: request.AnswerStats{HasUsage: true, PromptTokens: 4, CompletionTokens: 2}},
		"usage null, a string, a number": {docs: []string{`{"usage":null}`, `{"usage":"many"}`, `{"usage":7}`}},
		"usage with the wrong types":     {docs: []string{`{"usage":{"prompt_tokens":"7"}}`}},
		"not JSON":                       {docs: []string{`{"model":`, `data: x`, ``}},
		"a model that is not a string":   {docs: []string{`{"model":7}`}},
		"a Responses answer": {docs: []string{`{"object":"response","model":"served","usage":{"input_tokens":9,"output_tokens":4,"input_tokens_details":{"cached_tokens":9}}}`},
			want: request.AnswerStats{Model: "served", HasUsage: true, PromptTokens: 9, CompletionTokens: 4, CachedTokens: 9, HasCached: true}},
		"Responses events: the model and usage in their response": {docs: []string{`{"type":"response.created","response":{"model":"served","usage":null}}`,
			`{"type":"response.output_text.delta","delta":"usage"}`, `{"type":"response.completed","response":{"model":"x","usage":{"input_tokens":5,"output_tokens":2}}}`},
			want: request.AnswerStats{Model: "served", HasUsage: true, PromptTokens: 5, CompletionTokens: 2}},
		"a huge model name is cut": {docs: []string{`{"model":"` + strings.Repeat("m", 1<<20) + `"}`}, want: request.AnswerStats{Model: strings.Repeat("m", maxModelLen)}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var a request.AnswerStats
			for _, d := range tc.docs {
				ReadStats(&a, []byte(d))
			}
			if a != tc.want {
				t.Fatalf("got %+v, want %+v", a, tc.want)
			}
		})
	}
	if !UsageOnly([]byte(`{"choices":[ ],"usage":{}}`)) || UsageOnly([]byte(`{"choices":[{"index":0}],"usage":{}}`)) || UsageOnly([]byte(`{"usage":{}}`)) {
		t.Fatal("UsageOnly: only an empty choices list")
	}
}

func TestAskUsage(t *testing.T) {
	tests := map[string]struct {
		api      request.API
		stream   bool
		body     string
		wantOpts string // stream_options afterwards ("" when absent)
		wantHide bool
	}{
		"a stream without stream_options":           {api: request.APIChat, stream: true, body: `{"stream":true}`, wantOpts: `{"include_usage":true}`, wantHide: true},
		"stream_options null":                       {api: request.APIChat, stream: true, body: `{"stream":true,"stream_options":null}`, wantOpts: `{"include_usage":true}`, wantHide: true},
		"other options kept":                        {api: request.APICompletions, stream: true, body: `{"stream":true,"stream_options":{"continuous_usage_stats":false}}`, wantOpts: `{"continuous_usage_stats":false,"include_usage":true}`, wantHide: true},
		"include_usage false":                       {api: request.APIChat, stream: true, body: `{"stream":true,"stream_options":{"include_usage":false}}`, wantOpts: `{"include_usage":true}`, wantHide: true},
		"the client asked: nothing to hide":         {api: request.APIChat, stream: true, body: `{"stream":true,"stream_options":{"include_usage":true}}`, wantOpts: `{"include_usage":true}`},
		"not a stream: the answer has usage":        {api: request.APIChat, body: `{}`},
		"generate: no usage chunk to ask for":       {api: request.APIGenerate, stream: true, body: `{"stream":true}`},
		"responses: usage is in response.completed": {api: request.APIResponses, stream: true, body: `{"stream":true}`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			obj, err := body.Parse([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			rc := &request.Context{API: tc.api, Stream: tc.stream, Body: obj}
			Of(tc.api).AskUsage(rc)
			raw, _ := rc.Body.Get("stream_options")
			if string(raw) != tc.wantOpts || rc.HideUsage != tc.wantHide {
				t.Fatalf("stream_options %s, hide %v; want %s, %v", raw, rc.HideUsage, tc.wantOpts, tc.wantHide)
			}
		})
	}
}

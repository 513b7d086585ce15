package wire

import (
	"fmt"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// TestGot: what a stream keeps of the events its client got, event by event, and why it stops
// being resumable (the events are not kept, only what a continuation needs).
func TestGot(t *testing.T) {
	data := func(s string) string { return "data: " + s + "\n\n" }
	tests := map[string]struct {
		api     request.API
		events  []string
		text    string
		ids     []int
		tokens  int
		id      string
		created string
		exotic  string
		refused string // state's error
	}{
		"chat: text with escapes, first id and created": {api: request.APIChat, events: []string{
			data(`{"id":"c\u0031","created":7,"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`),
			data(`{"id":"c1","created":7,"choices":[{"index":0,"delta":{"content":"a\"b\\n\u00e9\ud83d\ude00"},"finish_reason":null}]}`) +
				data(`{"id":"other","created":9,"choices":[{"index":0,"delta":{"content":" é"},"logprobs":null}]}`),
			data(`[DONE]`)}, text: "a\"b\\né😀 é", tokens: 2, id: "c1", created: "7"},
		"chat: a second choice":        {api: request.APIChat, events: []string{data(`{"id":"c","choices":[{"index":1,"delta":{"content":"x"}}]}`)}, text: "x", tokens: 1, id: "c", exotic: "several choices"},
		"chat: a tool call":            {api: request.APIChat, events: []string{data(`{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}`)}, id: "c", exotic: "a tool call was being streamed"},
		"chat: reasoning":              {api: request.APIChat, events: []string{data(`{"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}`)}, id: "c", exotic: "reasoning was being streamed"},
		"chat: null reasoning":         {api: request.APIChat, events: []string{data(`{"id":"c","choices":[{"index":0,"delta":{"reasoning":null,"content":"y"}}]}`)}, text: "y", tokens: 1, id: "c"},
		"chat: logprobs":               {api: request.APIChat, events: []string{data(`{"id":"c","choices":[{"index":0,"delta":{"content":"y"},"logprobs":{"content":[]}}]}`)}, text: "y", tokens: 1, id: "c", exotic: "logprobs were being streamed"},
		"chat: an event not JSON":      {api: request.APIChat, events: []string{data(`{"id":"c","choices":[]}`), data(`{"id":`)}, refused: "not JSON"},
		"chat: an id not a string":     {api: request.APIChat, events: []string{data(`{"id":7,"choices":[]}`)}, refused: "not a string"},
		"generate: ids":                {api: request.APIGenerate, events: []string{data(`{"request_id":"g","choices":[{"index":0,"token_ids":[5,6]}]}`), data(`{"request_id":"h","choices":[{"index":0,"token_ids":[7],"finish_reason":"length"}]}`)}, ids: []int{5, 6, 7}, tokens: 3, id: "g"},
		"generate: an id not a number": {api: request.APIGenerate, events: []string{data(`{"request_id":"g","choices":[{"index":0,"token_ids":["5"]}]}`)}, refused: "not an integer"},
		"an answer longer than kept": {api: request.APIChat, events: []string{
			data(`{"id":"c","choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", MaxTracked/2) + `"}}]}`),
			data(`{"id":"c","choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", MaxTracked/2+1) + `"}}]}`)}, refused: "longer than"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			st := Of(tc.api).Events().Got()
			for _, ev := range tc.events {
				st.Fold([]byte(ev))
			}
			var err error
			if st.err != nil || st.over {
				_, _, err = st.Continue(&body.Object{})
			}
			if tc.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("state err %v, want %q", err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(st.text) != tc.text || fmt.Sprint(st.ids) != fmt.Sprint(tc.ids) || st.tokens != tc.tokens || st.id != tc.id ||
				string(st.created) != tc.created || st.exotic != tc.exotic {
				t.Fatalf("state text %q ids %v tokens %d id %q created %s exotic %q", st.text, st.ids, st.tokens, st.id, st.created, st.exotic)
			}
		})
	}
}

package wire

import (
	"fmt"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/base/budget"
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
			data(`{"id":"c","choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 512) + `"}}]}`),
			data(`{"id":"c","choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 513) + `"}}]}`)},
			refused: "longer than the 1024 bytes kept to resume from (gateway.retry.max_resume_size)"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			st := Of(tc.api).Events().Got(Keep{Max: 1 << 10})
			for _, ev := range tc.events {
				st.Fold([]byte(ev))
			}
			var err error
			if st.err != nil || st.over != "" {
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

// TestGotKeep: what streams keep to be resumed from is reserved from the process's count within
// both bounds; a stream over either is no longer resumable, naming the key, and whatever ends it
// (its end, a client gone) gives its reservation back.
func TestGotKeep(t *testing.T) {
	chunk := func(n int) []byte {
		return []byte(`data: {"id":"c","choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", n) + `"}}]}` + "\n\n")
	}
	tests := map[string]struct {
		max, limit    int64
		other, chunks int // bytes another open stream keeps; 1 KiB chunks of the stream tested
		refused       string
	}{
		"within both bounds":         {max: 64 << 10, limit: 256 << 10, other: 8 << 10, chunks: 40},
		"at the stream's bound":      {max: 40 << 10, limit: 256 << 10, chunks: 40},
		"over the stream's bound":    {max: 40 << 10, limit: 256 << 10, chunks: 41, refused: "longer than the 40960 bytes kept to resume from (gateway.retry.max_resume_size)"},
		"over the process's bound":   {max: 64 << 10, limit: 48 << 10, other: 16 << 10, chunks: 40, refused: "gateway.retry.max_resume_memory (49152 bytes)"},
		"no process-wide count":      {max: 64 << 10, chunks: 60},
		"no bound of either (tests)": {chunks: 60},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			held := &budget.Bytes{}
			keep := Keep{Max: tc.max, Held: held, Limit: tc.limit}
			if tc.limit == 0 {
				keep.Held = nil
			}
			other := Chat.Events().Got(keep)
			if tc.other > 0 {
				other.Fold(chunk(tc.other))
			}
			g := Chat.Events().Got(keep)
			for range tc.chunks {
				g.Fold(chunk(1 << 10))
			}
			base, _ := body.Parse([]byte(`{"messages":[]}`))
			_, _, err := g.Continue(base)
			switch {
			case tc.refused == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)):
				t.Fatalf("err %v, want %q", err, tc.refused)
			case tc.refused != "" && (g.reserved != 0 || g.text != nil):
				t.Fatalf("a stream no longer resumable keeps %d bytes reserved, %d of text", g.reserved, len(g.text))
			case tc.refused == "" && keep.Held != nil && g.reserved < int64(cap(g.text)):
				t.Fatalf("%d bytes reserved for %d held", g.reserved, cap(g.text))
			}
			if want := other.reserved + g.reserved; held.Held() != want || (tc.limit > 0 && want > tc.limit) {
				t.Fatalf("the process holds %d, want %d within %d", held.Held(), want, tc.limit)
			}
			g.Release()
			other.Release()
			if held.Held() != 0 {
				t.Fatalf("%d bytes still held after the streams ended", held.Held())
			}
			if _, _, err := g.Continue(base); err == nil {
				t.Fatal("a released record continues")
			}
		})
	}
}

package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
	"github.com/epd-dev/coordinator/dataplane/wire"
)

// parts is a response body returning one part per Read, then end.
type parts struct {
	p   []string
	end error
}

func (b *parts) Read(p []byte) (int, error) {
	if len(b.p) == 0 {
		return 0, b.end
	}
	n := copy(p, b.p[0])
	b.p = b.p[1:]
	return n, nil
}

func (*parts) Close() error { return nil }

func eventStream(end error, events ...string) *http.Response {
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: &parts{p: events, end: end}}
}

func chunk(id, content string) string {
	b, _ := json.Marshal(map[string]any{"id": id, "object": "chat.completion.chunk", "created": 7, "model": "m",
		"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": content}, "finish_reason": nil}}})
	return "data: " + string(b) + "\n\n"
}

const role = `data: {"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n"

func chatRC(t *testing.T, raw string) *request.Context {
	t.Helper()
	obj, err := body.Parse([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	return &request.Context{ID: "rid", API: request.APIChat, Path: wire.Chat.Path(), Body: obj, Stream: true, Log: logr.Discard()}
}

// A break after tokens reached the client: the continuation carries the output so far as the
// assistant message to continue, fewer tokens, and its events are spliced in under the
// original id, without a second role event, with usage that adds up.
func TestChatResume(t *testing.T) {
	rec := httptest.NewRecorder()
	s := New(rec, "rid", wire.Chat, Limits{}, nil)
	err := s.Relay(eventStream(io.ErrUnexpectedEOF, role, chunk("c1", "Hello"), chunk("c1", " big"), `data: {"id":"c1","choi`))
	if !errors.Is(err, ErrBroken) || !s.Started() {
		t.Fatalf("err = %v, started %v; want a broken stream the client saw", err, s.Started())
	}
	if got := rec.Body.String(); got != role+chunk("c1", "Hello")+chunk("c1", " big") {
		t.Fatalf("the client got %q: a partial event must be held back", got)
	}
	rc := chatRC(t, `{"model":"m","messages":[{"role":"user","content":"Hello big world"}],"stream":true,"max_tokens":5,"stream_options":{"include_usage":true}}`)
	cont, err := s.Continuation(rc, rc.Body)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(cont.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	msgs := got["messages"].([]any)
	last := msgs[len(msgs)-1].(map[string]any)
	if len(msgs) != 2 || last["role"] != "assistant" || last["content"] != "Hello big" || got["continue_final_message"] != true ||
		got["add_generation_prompt"] != false || got["max_tokens"] != 3.0 {
		t.Fatalf("continuation %s", cont.Bytes())
	}
	contRole := strings.ReplaceAll(role, "c1", "c2")
	usage := `data: {"id":"c2","object":"chat.completion.chunk","created":9,"model":"m","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}` + "\n\n"
	if err := s.Relay(eventStream(io.EOF, contRole, chunk("c2", " world"), usage, "data: [DONE]\n\n")); err != nil {
		t.Fatal(err)
	}
	tail := strings.TrimPrefix(rec.Body.String(), role+chunk("c1", "Hello")+chunk("c1", " big"))
	wantTail := chunk("c1", " world") +
		`data: {"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[],"usage":{"completion_tokens":5,"prompt_tokens":10,"total_tokens":15}}` + "\n\n" +
		"data: [DONE]\n\n"
	if tail != wantTail {
		t.Fatalf("spliced tail\n%s\nwant\n%s", tail, wantTail)
	}
}

func TestGenerateResume(t *testing.T) {
	rec := httptest.NewRecorder()
	s := New(rec, "rid", wire.Generate, Limits{}, nil)
	ev := func(ids string) string {
		return `data: {"request_id":"g1","choices":[{"index":0,"token_ids":` + ids + `,"finish_reason":null}]}` + "\n\n"
	}
	if err := s.Relay(eventStream(io.ErrUnexpectedEOF, ev("[5]"), ev("[6,7]"))); !errors.Is(err, ErrBroken) {
		t.Fatal(err)
	}
	obj, _ := body.Parse([]byte(`{"token_ids":[1,2,3],"sampling_params":{"max_tokens":8,"temperature":0}}`))
	rc := &request.Context{API: request.APIGenerate, Body: obj, Stream: true}
	cont, err := s.Continuation(rc, rc.Body)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"token_ids":[1,2,3,5,6,7],"sampling_params":{"max_tokens":5,"temperature":0}}`; string(cont.Bytes()) != want {
		t.Fatalf("continuation %s, want %s", cont.Bytes(), want)
	}
	if err := s.Relay(eventStream(io.EOF, `data: {"request_id":"other","choices":[{"index":0,"token_ids":[8],"finish_reason":null}]}`+"\n\n", "data: [DONE]\n\n")); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(rec.Body.String(), `data: {"request_id":"g1","choices":[{"index":0,"token_ids":[8],"finish_reason":null}]}`+"\n\ndata: [DONE]\n\n") {
		t.Fatalf("stream %q", rec.Body.String())
	}
}

// What cannot be continued exactly is refused, naming why.
func TestContinuationRefused(t *testing.T) {
	tool := `data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a"}}]},"finish_reason":null}]}` + "\n\n"
	finished := `data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}` + "\n\n"
	tests := map[string]struct {
		api    request.API
		body   string
		events []string
		why    string
	}{
		"n > 1":             {body: `{"messages":[],"n":2}`, events: []string{chunk("c", "a")}, why: "n > 1"},
		"logprobs":          {body: `{"messages":[],"logprobs":true}`, events: []string{chunk("c", "a")}, why: "logprobs"},
		"json schema":       {body: `{"messages":[],"response_format":{"type":"json_schema"}}`, events: []string{chunk("c", "a")}, why: "structured output"},
		"guided regex":      {body: `{"messages":[],"guided_regex":"a+"}`, events: []string{chunk("c", "a")}, why: "guided_regex"},
		"tool call":         {body: `{"messages":[],"tools":[]}`, events: []string{tool}, why: "tool call"},
		"finished":          {body: `{"messages":[]}`, events: []string{finished}, why: "had finished"},
		"completions":       {api: request.APICompletions, body: `{"prompt":"a"}`, events: []string{chunk("c", "a")}, why: "not resumed"},
		"already continues": {body: `{"messages":[],"continue_final_message":true}`, events: []string{chunk("c", "a")}, why: "continues a message"},
		"limit used up":     {body: `{"messages":[{"role":"user","content":"a"}],"max_tokens":1}`, events: []string{chunk("c", "a")}, why: "max_tokens is used up"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := New(httptest.NewRecorder(), "rid", wire.Of(tc.api), Limits{}, nil)
			_ = s.Relay(eventStream(io.ErrUnexpectedEOF, tc.events...))
			rc := chatRC(t, tc.body)
			rc.API = tc.api
			if _, err := s.Continuation(rc, rc.Body); err == nil || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("err = %v, want one saying %q", err, tc.why)
			}
		})
	}
	// A plain text response_format is no constraint.
	s := New(httptest.NewRecorder(), "rid", wire.Chat, Limits{}, nil)
	_ = s.Relay(eventStream(io.ErrUnexpectedEOF, chunk("c", "a")))
	rc := chatRC(t, `{"messages":[{"role":"user","content":"a"}],"response_format":{"type":"text"}}`)
	if _, err := s.Continuation(rc, rc.Body); err != nil {
		t.Fatal(err)
	}
}

// A stream that fails before its first complete event writes nothing: the leg is retried.
func TestNotStarted(t *testing.T) {
	rec := httptest.NewRecorder()
	s := New(rec, "rid", wire.Chat, Limits{}, nil)
	err := s.Relay(eventStream(io.ErrUnexpectedEOF, `data: {"id":`))
	if !errors.Is(err, upstream.ErrNotStarted) || s.Started() || rec.Body.Len() != 0 || len(rec.Header()) != 0 {
		t.Fatalf("err = %v, started %v, wrote %q", err, s.Started(), rec.Body.String())
	}
}

// A clean end of the body without [DONE] is a break too: the answer is not complete.
func TestEOFWithoutDone(t *testing.T) {
	s := New(httptest.NewRecorder(), "rid", wire.Chat, Limits{}, nil)
	if err := s.Relay(eventStream(io.EOF, chunk("c", "a"))); !errors.Is(err, ErrBroken) {
		t.Fatalf("err = %v, want ErrBroken", err)
	}
}

// Fail sends an OpenAI error event and reports a truncated response, so the server aborts it.
func TestFail(t *testing.T) {
	rec := httptest.NewRecorder()
	s := New(rec, "rid", wire.Chat, Limits{}, nil)
	_ = s.Relay(eventStream(io.ErrUnexpectedEOF, chunk("c", "a")))
	err := s.Fail("n > 1", io.ErrUnexpectedEOF)
	if !errors.Is(err, upstream.ErrResponseTruncated) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err = %v", err)
	}
	ev := strings.TrimPrefix(rec.Body.String(), chunk("c", "a"))
	var got struct {
		Error struct{ Message, Type, Code, RequestID string } `json:"error"`
	}
	payload, ok := strings.CutPrefix(ev, "data: ")
	if !ok || !strings.HasSuffix(ev, "\n\n") || json.Unmarshal([]byte(payload), &got) != nil ||
		got.Error.Code != "stream_interrupted" || !strings.Contains(got.Error.Message, "n > 1") {
		t.Fatalf("error event %q", ev)
	}
}

// Finish ends a stream whose choice finished but whose [DONE] was lost, unless usage was asked.
func TestFinish(t *testing.T) {
	finished := `data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}` + "\n\n"
	for _, tc := range []struct {
		body string
		want bool
	}{{`{"messages":[]}`, true}, {`{"messages":[],"stream_options":{"include_usage":true}}`, false}} {
		rec := httptest.NewRecorder()
		s := New(rec, "rid", wire.Chat, Limits{}, nil)
		_ = s.Relay(eventStream(io.ErrUnexpectedEOF, finished))
		rc := chatRC(t, tc.body)
		if got := s.Finish(rc, rc.Body); got != tc.want || tc.want != strings.HasSuffix(rec.Body.String(), "data: [DONE]\n\n") {
			t.Fatalf("%s: Finish = %v, body %q", tc.body, got, rec.Body.String())
		}
	}
}

// Events split across reads are forwarded whole; nothing is lost or repeated.
func TestSplitEvents(t *testing.T) {
	all := role + chunk("c1", "a") + chunk("c1", " b") + "data: [DONE]\n\n"
	for size := 1; size < len(all); size += 7 {
		var p []string
		for i := 0; i < len(all); i += size {
			p = append(p, all[i:min(i+size, len(all))])
		}
		rec := httptest.NewRecorder()
		if err := New(rec, "rid", wire.Chat, Limits{}, nil).Relay(eventStream(io.EOF, p...)); err != nil {
			t.Fatalf("reads of %d: %v", size, err)
		}
		if !bytes.Equal(rec.Body.Bytes(), []byte(all)) {
			t.Fatalf("reads of %d: got %q", size, rec.Body.String())
		}
	}
}

// A watched stream reports its token events and the answer's model and usage; with HideUsage
// the usage chunk is read but never reaches the client, wherever it falls in a read.
func TestWatch(t *testing.T) {
	usage := `data: {"id":"c1","object":"chat.completion.chunk","created":7,"model":"served","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14,"prompt_tokens_details":{"cached_tokens":8}}}` + "\n\n"
	done := "data: [DONE]\n\n"
	tests := map[string]struct {
		parts      []string
		hide       bool
		wantClient string
	}{
		"usage shown": {parts: []string{role, chunk("c1", "a"), chunk("c1", " b"), usage, done}, wantClient: role + chunk("c1", "a") + chunk("c1", " b") + usage + done},
		"usage hidden": {parts: []string{role, chunk("c1", "a"), chunk("c1", " b"), usage, done}, hide: true,
			wantClient: role + chunk("c1", "a") + chunk("c1", " b") + done},
		"usage hidden inside one read with other events": {parts: []string{role + chunk("c1", "a"), chunk("c1", " b") + usage + done}, hide: true,
			wantClient: role + chunk("c1", "a") + chunk("c1", " b") + done},
		"usage hidden split across reads": {parts: []string{role, chunk("c1", "a"), chunk("c1", " b"), usage[:40], usage[40:] + done}, hide: true,
			wantClient: role + chunk("c1", "a") + chunk("c1", " b") + done},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			s := New(rec, "rid", wire.Chat, Limits{}, nil)
			rc := chatRC(t, `{"model":"m","messages":[],"stream":true}`)
			rc.HideUsage = tc.hide
			var writes []int
			rc.OnEvents = func(n int) { writes = append(writes, n) }
			s.Watch(rc)
			if err := s.Relay(eventStream(io.EOF, tc.parts...)); err != nil {
				t.Fatal(err)
			}
			if got := rec.Body.String(); got != tc.wantClient {
				t.Fatalf("the client got\n%s\nwant\n%s", got, tc.wantClient)
			}
			total := 0
			for _, n := range writes {
				total += n
			}
			if total != 3 { // the role event and two tokens; not the usage chunk, not [DONE]
				t.Fatalf("token events %v, want 3 in all", writes)
			}
			want := request.AnswerStats{Model: "m", HasUsage: true, PromptTokens: 12, CompletionTokens: 2, CachedTokens: 8, HasCached: true}
			if rc.Answer != want {
				t.Fatalf("answer stats %+v, want %+v (the first model seen, the usage)", rc.Answer, want)
			}
		})
	}
}

// A stream whose last choice finished but whose [DONE] was lost is finished in place, also when
// the coordinator (not the client) asked for usage: the hidden usage is not the client's to miss.
// A client that asked for usage gets a continuation instead (only it can give the usage).
func TestFinishWithAskedUsage(t *testing.T) {
	finished := `data: {"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}` + "\n\n"
	for name, tc := range map[string]struct {
		body string
		want bool
	}{
		"the client did not ask":  {body: `{"model":"m","messages":[],"stream":true}`, want: true},
		"the client asked for it": {body: `{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true}}`, want: false},
	} {
		t.Run(name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			s := New(rec, "rid", wire.Chat, Limits{}, nil)
			rc := chatRC(t, tc.body)
			wire.Of(rc.API).AskUsage(rc)
			s.Watch(rc)
			if err := s.Relay(eventStream(io.ErrUnexpectedEOF, role, finished)); !errors.Is(err, ErrBroken) {
				t.Fatalf("err = %v, want a broken stream", err)
			}
			if got := s.Finish(rc, rc.Body); got != tc.want {
				t.Fatalf("Finish = %v, want %v", got, tc.want)
			}
			if tc.want && !strings.HasSuffix(rec.Body.String(), "data: [DONE]\n\n") {
				t.Fatalf("the client got %q", rec.Body.String())
			}
		})
	}
}

func responsesEvent(typ, rest string) string {
	return "event: " + typ + "\ndata: {\"type\":\"" + typ + "\"" + rest + "}\n\n"
}

// A Responses stream ends with its response's last event (there is no [DONE]); its token events
// are its deltas; a break is never resumed and ends with the API's own error event, numbered
// after the events the client got.
func TestResponsesStream(t *testing.T) {
	created := responsesEvent("response.created", `,"sequence_number":0,"response":{"model":"served","usage":null}`)
	delta := func(n int, text string) string {
		return responsesEvent("response.output_text.delta", fmt.Sprintf(`,"sequence_number":%d,"delta":%q`, n, text))
	}
	completed := responsesEvent("response.completed", `,"sequence_number":3,"response":{"model":"served","usage":{"input_tokens":4,"output_tokens":2}}`)
	for _, final := range []string{"response.completed", "response.incomplete", "response.failed"} {
		t.Run("ends with "+final, func(t *testing.T) {
			rec := httptest.NewRecorder()
			s := New(rec, "rid", wire.Responses, Limits{}, nil)
			end := strings.ReplaceAll(completed, "response.completed", final)
			if err := s.Relay(eventStream(io.EOF, created, delta(1, "a"), delta(2, " b"), end)); err != nil {
				t.Fatalf("a finished Responses stream: %v", err)
			}
			if rec.Body.String() != created+delta(1, "a")+delta(2, " b")+end {
				t.Fatalf("the events were changed: %q", rec.Body.String())
			}
		})
	}
	t.Run("watched: deltas are the token events, usage from the response", func(t *testing.T) {
		rec := httptest.NewRecorder()
		s := New(rec, "rid", wire.Responses, Limits{}, nil)
		rc := &request.Context{API: request.APIResponses, Stream: true}
		events := 0
		rc.OnEvents = func(n int) { events += n }
		s.Watch(rc)
		if err := s.Relay(eventStream(io.EOF, created, delta(1, "usage"), delta(2, " b"), completed)); err != nil {
			t.Fatal(err)
		}
		if events != 2 || rc.Answer != (request.AnswerStats{Model: "served", HasUsage: true, PromptTokens: 4, CompletionTokens: 2}) {
			t.Fatalf("%d token events, stats %+v; want 2 and the completed response's usage", events, rc.Answer)
		}
	})
	t.Run("a break is not resumed", func(t *testing.T) {
		rec := httptest.NewRecorder()
		s := New(rec, "rid", wire.Responses, Limits{}, nil)
		err := s.Relay(eventStream(io.EOF, created, delta(1, "a"), delta(2, " b")))
		if !errors.Is(err, ErrBroken) {
			t.Fatalf("a stream without its final event: %v, want ErrBroken", err)
		}
		rc := &request.Context{API: request.APIResponses, Body: &body.Object{}, Stream: true, Log: logr.Discard()}
		if _, why := s.Continuation(rc, rc.Body); why == nil || !strings.Contains(why.Error(), "responses streams are not resumed") {
			t.Fatalf("continuation: %v", why)
		}
		if s.Finish(rc, rc.Body) {
			t.Fatal("Finish ended a Responses stream")
		}
		if err := s.Fail("the worker died", io.EOF); !errors.Is(err, upstream.ErrResponseTruncated) {
			t.Fatal(err)
		}
		tail := strings.TrimPrefix(rec.Body.String(), created+delta(1, "a")+delta(2, " b"))
		ev, ok := strings.CutPrefix(tail, "event: error\ndata: ")
		var got map[string]any
		if !ok || json.Unmarshal([]byte(ev), &got) != nil || got["type"] != "error" || got["code"] != "stream_interrupted" ||
			got["sequence_number"] != 3.0 || !strings.Contains(got["message"].(string), "the worker died") {
			t.Fatalf("the client's last event %q, want the Responses error event numbered 3", tail)
		}
	})
}

// TestFoldInBatches: the events a client got are folded in batches as they fill (a short answer
// is never parsed), and a continuation sees all of them; a format whose streams are not continued
// keeps nothing.
func TestFoldInBatches(t *testing.T) {
	data := func(s string) string { return "data: " + s + "\n\n" }
	s := New(httptest.NewRecorder(), "rid", wire.Chat, Limits{}, nil)
	for i := range 100 { // ~9 KiB: two batches folded as they fill, the rest when asked
		ev := data(`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"word` + fmt.Sprint(i%10) + ` "},"finish_reason":null}]}`)
		if err := s.feed(&http.Response{StatusCode: http.StatusOK, Header: http.Header{}}, []byte(ev)); err != nil {
			t.Fatal(err)
		}
	}
	rc := chatRC(t, `{"messages":[{"role":"user","content":"go"}],"max_tokens":500}`)
	cont, err := s.Continuation(rc, rc.Body)
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Messages []struct{ Content string } `json:"messages"`
		Max      int                        `json:"max_tokens"`
	}
	if err := json.Unmarshal(cont.Bytes(), &c); err != nil || len(c.Messages) != 2 ||
		c.Messages[1].Content != strings.Repeat("word0 word1 word2 word3 word4 word5 word6 word7 word8 word9 ", 10) || c.Max != 400 {
		t.Fatalf("continuation %s (%v)", cont.Bytes(), err)
	}
	cs := New(httptest.NewRecorder(), "rid", wire.Completions, Limits{}, nil)
	if err := cs.feed(&http.Response{StatusCode: http.StatusOK, Header: http.Header{}}, []byte(data(`{"id":"c","choices":[{"index":0,"text":"x"}]}`))); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Continuation(rc, rc.Body); err == nil || !strings.Contains(err.Error(), "not resumed") {
		t.Fatalf("a completions stream continued: %v", err)
	}
}

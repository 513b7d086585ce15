package steps

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
)

// streamWords answers a chat stream of words[from:] (one token per event, as vLLM streams);
// die, when positive, cuts the connection after that many tokens (a killed worker).
func streamWords(w http.ResponseWriter, words []string, from, die int) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	_, _ = io.WriteString(w, `data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`+"\n\n")
	for i := from; i < len(words); i++ {
		if die > 0 && i-from == die {
			fl.Flush()
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		piece := words[i]
		if i > 0 {
			piece = " " + piece
		}
		finish := "null"
		if i == len(words)-1 {
			finish = `"length"`
		}
		fmt.Fprintf(w, `data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":%q},"finish_reason":%s}]}`+"\n\n", piece, finish)
		fl.Flush()
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

// contentOf concatenates the content deltas of a relayed chat stream and counts its [DONE]s.
func contentOf(t *testing.T, stream string) (string, int) {
	t.Helper()
	var sb strings.Builder
	done := 0
	for _, ev := range strings.Split(strings.TrimSuffix(stream, "\n\n"), "\n\n") {
		d := strings.TrimPrefix(ev, "data: ")
		if d == "[DONE]" {
			done++
			continue
		}
		if strings.Contains(d, `"error"`) {
			t.Fatalf("error event in the stream: %s", d)
		}
		if i := strings.Index(d, `"content":"`); i >= 0 {
			rest := d[i+len(`"content":"`):]
			end, _, _ := strings.Cut(rest, `"`)
			sb.WriteString(end)
		}
	}
	return sb.String(), done
}

// A decode worker that dies mid-stream: the rest comes from another pick, asked to continue the
// assistant message; the client sees one uninterrupted answer.
func TestDecodeStreamResumes(t *testing.T) {
	words := strings.Fields("one two three four five six seven eight")
	var legs atomic.Int32
	gw := newFakeGateway(t, func(w http.ResponseWriter, c captured) {
		switch legs.Add(1) {
		case 1:
			streamWords(w, words, 0, 3)
		default:
			msgs := c.Body["messages"].([]any)
			last := msgs[len(msgs)-1].(map[string]any)
			if last["role"] != "assistant" || last["content"] != "one two three" || c.Body["continue_final_message"] != true ||
				c.Body["max_tokens"] != 5.0 || c.Body["kv_transfer_params"] != nil {
				t.Errorf("continuation leg %s", c.Raw)
			}
			streamWords(w, words, 3, 0)
		}
	})
	s := newStep(t, DecodeStep, gw, nil)
	rc, rec := newRC(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":8}`, nil)
	if err := s.Execute(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	text, done := contentOf(t, rec.Body.String())
	if text != strings.Join(words, " ") || done != 1 || legs.Load() != 2 {
		t.Fatalf("client got %q with %d [DONE] over %d legs", text, done, legs.Load())
	}
}

// A stream that cannot be resumed exactly (n > 1 here) ends with an error event and a
// truncated response (the server aborts it).
func TestDecodeStreamNotResumable(t *testing.T) {
	gw := newFakeGateway(t, func(w http.ResponseWriter, c captured) { streamWords(w, []string{"a", "b", "c"}, 0, 1) })
	s := newStep(t, DecodeStep, gw, nil)
	rc, rec := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true,"n":2}`, nil)
	err := s.Execute(context.Background(), rc)
	if !errors.Is(err, upstream.ErrResponseTruncated) || !strings.Contains(rec.Body.String(), `"code":"stream_interrupted"`) ||
		len(gw.requests()) != 1 {
		t.Fatalf("err = %v, body %q, legs %d", err, rec.Body.String(), len(gw.requests()))
	}
}

// A decode leg that fails before the client got anything is simply sent again: connection
// reset before headers, 503 from the gateway, a worker that hangs after its headers.
func TestDecodeRetriedBeforeFirstByte(t *testing.T) {
	var release chan struct{}
	tests := map[string]func(w http.ResponseWriter){
		"reset before headers": func(w http.ResponseWriter) {
			conn, _, _ := http.NewResponseController(w).Hijack()
			_ = conn.Close()
		},
		"503 no healthy upstream": func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "no healthy upstream")
		},
		"hang after headers": func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-release // the idle timeout gives up on this worker long before
		},
	}
	for name, fail := range tests {
		t.Run(name, func(t *testing.T) {
			var legs atomic.Int32
			gw := newFakeGateway(t, func(w http.ResponseWriter, c captured) {
				if legs.Add(1) == 1 {
					fail(w)
					return
				}
				streamWords(w, []string{"a", "b"}, 0, 0)
			})
			release = make(chan struct{})
			t.Cleanup(func() { close(release) }) // before the gateway's Close, which waits for its handlers
			gw.tune = func(g *config.Gateway) { g.IdleTimeout = config.Duration(50 * time.Millisecond) }
			s := newStep(t, DecodeStep, gw, nil)
			rc, rec := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true}`, nil)
			start := time.Now()
			if err := s.Execute(context.Background(), rc); err != nil {
				t.Fatal(err)
			}
			if text, done := contentOf(t, rec.Body.String()); text != "a b" || done != 1 || legs.Load() != 2 {
				t.Fatalf("client got %q (%d [DONE]) over %d legs", text, done, legs.Load())
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("took %s: a hung worker must cost at most its idle timeout", d)
			}
		})
	}
}

// A gateway's plain-text error reaches the client as OpenAI JSON with its status kept.
func TestDecodePlainTextError(t *testing.T) {
	gw := newFakeGateway(t, func(w http.ResponseWriter, c captured) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		_, _ = io.WriteString(w, "Payload Too Large")
	})
	s := newStep(t, DecodeStep, gw, nil)
	rc, rec := newRC(t, "/v1/chat/completions", `{"messages":[]}`, nil)
	err := s.Execute(context.Background(), rc)
	if e := apierror.From(err); e.Status != 413 || rec.Body.Len() != 0 {
		t.Fatalf("err = %v (%d), body %q", err, e.Status, rec.Body.String())
	}
}

// The decode steps bound a worker's events by gateway.max_event_size and what a stream keeps to
// be resumed from by gateway.retry.max_resume_size: an event over the first breaks the stream
// (here not resumed: max_resumes 0) with an error event naming the key; an answer over the second
// still streams whole.
func TestDecodeStreamLimits(t *testing.T) {
	long := strings.Fields(strings.Repeat("word ", 3000)) // ~15 KiB of content
	tests := map[string]struct {
		tune     func(*config.Gateway)
		answer   func(w http.ResponseWriter)
		errEvent string
	}{
		"an event over gateway.max_event_size": {tune: func(g *config.Gateway) { g.MaxEventSize = 1 },
			answer: func(w http.ResponseWriter) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, `data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"}}]}`+"\n\n"+"data: "+strings.Repeat("x", 4<<10))
			}, errEvent: "over gateway.max_event_size (1024 bytes)"},
		"an answer over gateway.retry.max_resume_size": {tune: func(g *config.Gateway) { g.Retry.MaxResumeSize = 4 },
			answer: func(w http.ResponseWriter) { streamWords(w, long, 0, 0) }},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			gw := newFakeGateway(t, func(w http.ResponseWriter, _ captured) { tc.answer(w) })
			gw.tune = tc.tune
			s := newStep(t, DecodeStep, gw, map[string]any{"max_resumes": 0})
			rc, rec := newRC(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`, nil)
			err := s.Execute(context.Background(), rc)
			if tc.errEvent == "" {
				if text, done := contentOf(t, rec.Body.String()); err != nil || text != strings.Join(long, " ") || done != 1 {
					t.Fatalf("err %v, the client got %d bytes, %d [DONE]", err, len(text), done)
				}
				return
			}
			if !errors.Is(err, upstream.ErrResponseTruncated) || !strings.Contains(rec.Body.String(), tc.errEvent) {
				t.Fatalf("err %v, the client got %q", err, rec.Body.String())
			}
		})
	}
}

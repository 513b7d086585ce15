package simworker

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/epd-dev/coordinator/dataplane/transport/retry"
)

// ChatCompletionChunk is one streamed chat event ("chat.completion.chunk").
type ChatCompletionChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []ChatChunkChoice `json:"choices"`
	Usage   *Usage            `json:"usage,omitempty"`
}

// ChatChunkChoice is one choice of a ChatCompletionChunk.
type ChatChunkChoice struct {
	Index        int       `json:"index"`
	Delta        ChatDelta `json:"delta"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

// ChatDelta is the message delta of a ChatChunkChoice.
type ChatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// stream answers g as server-sent events: headers at once, the first token
// after TTFT, one event per token every ITL (each carries exactly one token),
// an optional usage event, then [DONE]. It stops as soon as ctx is done or a
// write fails, and strikes with a claimed FaultDieMidStream or
// FaultHangAfterHeaders once Fault.AfterTokens token events are flushed.
func (w *Worker) stream(ctx context.Context, rw http.ResponseWriter, g *generation) {
	fault := claimFault(ctx)
	if fault != nil {
		rw = fault.rw
	}
	h := rw.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	rw.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(rw)
	_ = rc.Flush()
	var buf bytes.Buffer // one event: stamp, "data: ", JSON, blank line
	enc := json.NewEncoder(&buf)
	send := func(v any) bool {
		buf.Reset()
		buf.WriteString(w.stamp())
		if ev, ok := v.(respEvent); ok {
			buf.WriteString("event: " + ev["type"].(string) + "\n")
		}
		buf.WriteString("data: ")
		if enc.Encode(v) != nil { // the JSON and a newline
			return false
		}
		buf.WriteByte('\n')
		if _, err := rw.Write(buf.Bytes()); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	n := g.usage.CompletionTokens
	if fault != nil && fault.fault.AfterTokens == 0 {
		fault.strike(ctx)
		return
	}
	for i := range n {
		delay := w.cfg.ITL
		if i == 0 {
			delay = w.cfg.TTFT
		}
		if !retry.Sleep(ctx, delay) {
			return
		}
		if i == 0 && g.in.kind == kindChat && !send(g.chatChunk(ChatDelta{Role: "assistant", Content: ptr("")}, nil)) {
			return
		}
		if i == 0 && g.in.kind == kindResponses {
			for _, ev := range g.openingEvents() {
				if !send(ev) {
					return
				}
			}
		}
		if !send(g.tokenChunk(i, i == n-1)) {
			return
		}
		if fault != nil && i+1 == fault.fault.AfterTokens {
			fault.strike(ctx)
			return
		}
	}
	if fault != nil { // more tokens asked than the stream has: it dies before its end
		fault.strike(ctx)
		return
	}
	if g.in.kind == kindResponses { // no [DONE]: the response's last event ends it
		for _, ev := range g.closingEvents() {
			if !send(ev) {
				return
			}
		}
		return
	}
	if g.in.includeUsage && !send(g.usageChunk()) {
		return
	}
	_, _ = io.WriteString(rw, w.stamp()+"data: [DONE]\n\n")
	_ = rc.Flush()
}

// stamp returns the comment line that precedes an event when
// Config.StampEvents is set ("" otherwise), with the current wall-clock time.
func (w *Worker) stamp() string {
	if !w.cfg.StampEvents {
		return ""
	}
	return EventStampPrefix + strconv.FormatInt(time.Now().UnixNano(), 10) + "\n"
}

// tokenChunk returns the event carrying token i.
func (g *generation) tokenChunk(i int, last bool) any {
	var finish *string
	if last {
		finish = ptr(finishLength)
	}
	switch g.in.kind {
	case kindChat:
		if g.in.tool != nil {
			return g.toolTokenChunk(i, last)
		}
		return g.chatChunk(ChatDelta{Content: ptr(g.piece(i))}, finish)
	case kindCompletion:
		return TextCompletion{
			ID: g.id, Object: "text_completion", Created: g.created, Model: g.model,
			Choices: []TextChoice{{Text: g.piece(i), FinishReason: finish}},
		}
	case kindResponses:
		return g.deltaEvent(i)
	default:
		return GenerateResponse{
			RequestID: g.id,
			Choices:   []GenerateChoice{{TokenIDs: []int{g.ids[i]}, FinishReason: finish}},
		}
	}
}

// piece returns the text of token i: its word, preceded by a space unless it
// is the first of a text that continues nothing, so that the pieces
// concatenate to the full text (and, for a continuation, to the rest of the
// continued message).
func (g *generation) piece(i int) string {
	if i == 0 && !g.continues {
		return g.words[0]
	}
	return " " + g.words[i]
}

// chatChunk returns a chat event with one choice.
func (g *generation) chatChunk(delta ChatDelta, finish *string) ChatCompletionChunk {
	return ChatCompletionChunk{
		ID: g.id, Object: "chat.completion.chunk", Created: g.created, Model: g.model,
		Choices: []ChatChunkChoice{{Delta: delta, FinishReason: finish}},
	}
}

// usageChunk returns the final usage event (no choices).
func (g *generation) usageChunk() any {
	switch g.in.kind {
	case kindChat:
		return ChatCompletionChunk{
			ID: g.id, Object: "chat.completion.chunk", Created: g.created, Model: g.model,
			Choices: []ChatChunkChoice{}, Usage: &g.usage,
		}
	case kindCompletion:
		return TextCompletion{
			ID: g.id, Object: "text_completion", Created: g.created, Model: g.model,
			Choices: []TextChoice{}, Usage: &g.usage,
		}
	default:
		return GenerateResponse{RequestID: g.id, Choices: []GenerateChoice{}, Usage: &g.usage}
	}
}

package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/budget"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/wire/sse"
)

// Events is how a format's answers stream (server-sent events): what ends a stream, which of
// its events are tokens, what ends one that broke for good, and, for the formats whose broken
// streams are continued or whose streams are folded into one answer, the record that does it.
type Events interface {
	// Ended reports whether events, complete events as the client gets them, end the stream, and
	// how many data events they hold when the format numbers its events (0 otherwise).
	Ended(events []byte) (ended bool, numbered int)
	// Token reports whether data, the data of one event that does not end the stream, is a
	// token event (the inter-token latency clock).
	Token(data []byte) bool
	// Broken is the event that ends a stream broken for good after n numbered events: e, in the
	// format's own error shape (the server then aborts the body).
	Broken(e *apierror.Error, requestID string, n int) []byte
	// Got returns a record of what a client gets, from which a broken stream is continued, that
	// keeps what keep allows; nil when the format's streams are not continued.
	Got(keep Keep) *Got
	// Fold returns a record that folds a stream into the unstreamed answer (force_stream); nil
	// when the format's streams are not folded.
	Fold() *Fold
}

// openAI are the streams of chat, completions and generate: data events that end with
// "data: [DONE]", errors in OpenAI's shape.
type openAI struct {
	// resume is the format whose broken streams are continued (nil: not continued).
	resume resumable
	// answer builds the unstreamed answer of a fold.
	answer func(f *Fold) map[string]any
}

// Pointers: a format hands its Events out per stream, and a pointer fits an interface without
// a copy on the heap.
var (
	chatEvents       = &openAI{resume: chat{}, answer: chatAnswer}
	completionEvents = &openAI{answer: completionsAnswer}
	generateEvents   = &openAI{resume: generate{}, answer: generateAnswer}
)

var dataDone = []byte("[DONE]")

// Ended is [DONE] as the last data line (only parsed when the events hold it).
func (openAI) Ended(events []byte) (bool, int) {
	if !bytes.Contains(events, dataDone) {
		return false, 0
	}
	var last []byte
	for d := range sse.Data(events) {
		last = d
	}
	return bytes.Equal(last, dataDone), 0
}

func (openAI) Token([]byte) bool { return true }

// Broken is the OpenAI error object as a data event: no [DONE] follows.
func (openAI) Broken(e *apierror.Error, requestID string, _ int) []byte {
	return sse.AppendEvent(nil, bytes.TrimSuffix(e.Body(requestID), []byte("\n")))
}

func (o openAI) Got(keep Keep) *Got {
	if o.resume == nil {
		return nil
	}
	return &Got{format: o.resume, keep: keep}
}

func (o openAI) Fold() *Fold { return &Fold{answer: o.answer} }

// responsesStream are the Responses API's streams: named events, numbered by sequence_number,
// that end with the response's terminal event; never continued nor folded.
type responsesStream struct{}

var responsesEvents responsesStream

// terminalTypes are the Responses stream events that end a response.
var terminalTypes = []string{"response.completed", "response.incomplete", "response.failed"}

func (responsesStream) Ended(events []byte) (bool, int) {
	ended, n := false, 0
	for d := range sse.Data(events) {
		n++
		ended = ended || terminal(d)
	}
	return ended, n
}

// Token is a delta event: a Responses stream's token events are its deltas.
func (responsesStream) Token(data []byte) bool {
	return bytes.HasSuffix([]byte(eventType(data)), []byte(".delta"))
}

// Broken is the API's own error event, numbered after the last event the client got.
func (responsesStream) Broken(e *apierror.Error, _ string, n int) []byte {
	ev, _ := json.Marshal(map[string]any{"type": "error", "code": e.Code, "message": e.Message, "param": nil, "sequence_number": n})
	return sse.AppendNamed(nil, "error", ev)
}

func (responsesStream) Got(Keep) *Got { return nil }
func (responsesStream) Fold() *Fold   { return nil }

// terminal reports whether d, a Responses stream event, ends the response: only an event that
// names a terminal type anywhere is parsed to be sure it is its own.
func terminal(d []byte) bool {
	for _, t := range terminalTypes {
		if bytes.Contains(d, []byte(t)) {
			return slices.Contains(terminalTypes, eventType(d))
		}
	}
	return false
}

// eventType is the type member of a Responses stream event ("" when it has none).
func eventType(d []byte) string {
	o, err := body.Parse(d)
	if err != nil {
		return ""
	}
	t, _, _ := o.String("type")
	return t
}

// Keep bounds the output a Got keeps to continue from: a longer answer still streams but is no
// longer continued, and what it kept is let go at once.
type Keep struct {
	// Max bounds the output of one stream, in bytes (gateway.retry.max_resume_size; 0: no bound).
	Max int64
	// Held counts the bytes every stream of the process keeps, within Limit
	// (gateway.retry.max_resume_memory); nil: no process-wide bound.
	Held  *budget.Bytes
	Limit int64
}

// keepGrain is the step in which a Got reserves from the process's count.
const keepGrain = 4 << 10

// resumable is a format whose broken streams are continued: what its events carry and how the
// rest of its answer is asked for.
type resumable interface {
	Format
	// idKey names the stream's id member; created says whether its created time is kept too.
	idKey() string
	created() bool
	// output folds one choice's output into g: its delta's content (chat) or its token_ids
	// (generate).
	output(g *Got, content, tokenIDs []byte) error
	// exotic says what in a choice's delta (its members) makes the output not continuable exactly
	// ("" when nothing does).
	exotic(toolCalls, reasoning []byte) string
	// continueBody makes obj, a copy of base (the body the stream was asked with), ask for the
	// rest of the answer: the output so far after the prompt, the token limits lowered by what
	// was produced.
	continueBody(base, obj *body.Object, g *Got) error
	// opening reports the opening event of a continuation that the client had from the first
	// stream already (dropped when spliced).
	opening(o *body.Object) bool
}

// Got is what the client of a continuable stream got, folded from the events as they pass: the
// text or token ids so far and the facts a continuation needs, not the events themselves, so
// an open stream holds a few bytes per token.
type Got struct {
	format   resumable
	id       string
	created  json.RawMessage
	text     []byte // chat: the content so far
	ids      []int  // generate: the token ids so far
	tokens   int    // content events (one token each, as vLLM streams)
	finished bool   // a finish_reason was sent
	exotic   string // why the output cannot be continued exactly, when it cannot
	err      error  // an event that could not be read: the stream is no longer continued
	over     string // why the output is no longer kept (too long, or released): not continued
	keep     Keep
	reserved int64 // bytes reserved of keep.Held
}

// Fold adds the data events of events, complete events the client got.
func (g *Got) Fold(events []byte) {
	if g.over != "" || g.err != nil {
		return
	}
	for d := range sse.Data(events) {
		if g.err != nil || bytes.Equal(d, dataDone) {
			continue
		}
		if !body.Valid(d) {
			g.err = errors.New("an event the client got is not JSON")
			continue
		}
		g.err = g.add(d)
	}
	g.account()
}

// account checks the output kept against the stream's bound and reserves the memory it holds
// from the process's count; over either, the output is let go and the stream is no longer
// continued.
func (g *Got) account() {
	if size := int64(len(g.text) + 8*len(g.ids)); g.keep.Max > 0 && size > g.keep.Max {
		g.drop(fmt.Sprintf("the answer is longer than the %d bytes kept to resume from (gateway.retry.max_resume_size)", g.keep.Max))
		return
	}
	held := int64(cap(g.text) + 8*cap(g.ids))
	if g.keep.Held == nil || held <= g.reserved {
		return
	}
	need := (held - g.reserved + keepGrain - 1) / keepGrain * keepGrain
	if !g.keep.Held.Reserve(need, g.keep.Limit) {
		g.drop(fmt.Sprintf("the answer is longer than the %d bytes kept to resume from: the streams in flight hold "+
			"gateway.retry.max_resume_memory (%d bytes)", g.reserved, g.keep.Limit))
		return
	}
	g.reserved += need
}

// drop lets the output go: the stream is no longer continued, for why.
func (g *Got) drop(why string) {
	g.over, g.text, g.ids = why, nil, nil
	if g.reserved > 0 {
		g.keep.Held.Release(g.reserved)
		g.reserved = 0
	}
}

// Release lets go of what the record keeps, and gives its reservation back: the stream ended.
func (g *Got) Release() { g.drop("the stream ended") }

// Finished reports whether the answer's last choice finished (only its end can have been lost).
func (g *Got) Finished() bool { return g.err == nil && g.over == "" && g.finished }

// add folds in one event, d (valid JSON).
func (g *Got) add(d []byte) error {
	var id, created []byte
	idKey := g.format.idKey()
	for k, v := range body.Members(d) {
		switch k {
		case idKey:
			id = v
		case "created":
			created = v
		case "choices":
			for ch := range body.Elements(v) {
				if err := g.addChoice(ch); err != nil {
					return err
				}
			}
		}
	}
	if g.id == "" && len(id) > 0 {
		raw, err := body.AppendString(nil, id)
		if err != nil {
			return fmt.Errorf("an event the client got has an id that is not a string: %w", err)
		}
		g.id = string(raw)
		if g.format.created() {
			g.created = bytes.Clone(created)
		}
	}
	return nil
}

// addChoice folds in one choice of an event.
func (g *Got) addChoice(ch []byte) error {
	var index int64
	var delta, logprobs, tokenIDs []byte
	for k, v := range body.Members(ch) {
		switch k {
		case "index":
			index, _ = body.ParseInt(v)
		case "delta":
			delta = v
		case "token_ids":
			tokenIDs = v
		case "logprobs":
			logprobs = v
		case "finish_reason":
			g.finished = g.finished || present(v)
		}
	}
	var content, toolCalls, reasoning []byte
	for k, v := range body.Members(delta) {
		switch k {
		case "content":
			content = v
		case "tool_calls":
			toolCalls = v
		case "reasoning", "reasoning_content":
			if present(v) {
				reasoning = v
			}
		}
	}
	switch why := g.format.exotic(toolCalls, reasoning); {
	case index != 0:
		g.exotic = "several choices"
	case why != "":
		g.exotic = why
	case present(logprobs):
		g.exotic = "logprobs were being streamed"
	}
	return g.format.output(g, content, tokenIDs)
}

func present(raw []byte) bool { return len(raw) > 0 && string(raw) != "null" }

// Continue returns the body of a request for the rest of the answer, from base (the body the
// stream was asked with), to send on the request's path with the decode profile (the decode
// worker prefills the longer prompt itself: no KV transfer parameters), and the splice its
// events go through. It returns an error saying why when the rest cannot be produced exactly
// (docs/operations.md).
func (g *Got) Continue(base *body.Object) (*body.Object, *Splice, error) {
	if why := notExact(g.format.sampling(base)); why != "" {
		return nil, nil, errors.New(why)
	}
	switch {
	case g.over != "":
		return nil, nil, errors.New(g.over)
	case g.err != nil:
		return nil, nil, g.err
	case g.exotic != "":
		return nil, nil, errors.New(g.exotic)
	case g.finished:
		return nil, nil, errors.New("the answer had finished; only its end was lost")
	}
	obj := base.Clone()
	if err := g.format.continueBody(base, obj, g); err != nil {
		return nil, nil, err
	}
	return obj, &Splice{format: g.format, id: g.id, created: g.created, tokens: g.tokens}, nil
}

// notExact names what in o, a request's sampling settings, makes a continuation differ from the
// uninterrupted answer, or "" when nothing does (nil: no settings).
func notExact(o *body.Object) string {
	if o == nil {
		return ""
	}
	if n, ok, _ := o.Int("n"); ok && n != 1 {
		return "n > 1"
	}
	for _, k := range []string{"logprobs", "top_logprobs", "prompt_logprobs"} {
		if raw, ok := o.Get(k); ok && string(raw) != "null" && string(raw) != "false" {
			return k + " was requested"
		}
	}
	for _, k := range []string{"response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
		"structured_outputs", "guided_decoding", "json_schema"} {
		raw, ok := o.Get(k)
		if !ok || string(raw) == "null" {
			continue
		}
		if k == "response_format" {
			if t, _ := responseFormatType(raw); t == "text" {
				continue
			}
		}
		return "structured output (" + k + ") was requested"
	}
	if b, ok, _ := o.Bool("continue_final_message"); ok && b {
		return "the request itself continues a message"
	}
	return ""
}

func responseFormatType(raw json.RawMessage) (string, error) {
	o, err := body.Parse(raw)
	if err != nil {
		return "", err
	}
	t, _, err := o.String("type")
	return t, err
}

// IncludeUsage reports whether a request body asked for its stream's usage chunk
// (stream_options.include_usage).
func IncludeUsage(obj *body.Object) bool {
	so, _, err := obj.Object("stream_options")
	if err != nil || so == nil {
		return false
	}
	b, _, _ := so.Bool("include_usage")
	return b
}

// lowerLimits lowers each present limit by produced tokens.
func lowerLimits(o *body.Object, produced int, keys ...string) error {
	for _, k := range keys {
		n, ok, err := o.Int(k)
		if err != nil || !ok {
			continue
		}
		left := n - int64(produced)
		if left < 1 {
			return fmt.Errorf("%s is used up", k)
		}
		o.Set(k, strconv.AppendInt(nil, left, 10))
	}
	return nil
}

// Splice is what a continuation's events are rewritten to: the original stream's id and created
// time, and the tokens produced before the break.
type Splice struct {
	format  resumable
	id      string
	created json.RawMessage
	tokens  int
}

// Rewrite makes a continuation's events the original stream's: its opening event is dropped
// (the client has had one), the id and created time are the original's, and a usage event
// counts the tokens produced before the break as completion tokens, not prompt.
func (sp *Splice) Rewrite(events []byte) []byte {
	out := make([]byte, 0, len(events)+32)
	for ev := range sse.Events(events) {
		out = append(out, sp.rewriteEvent(ev)...)
	}
	return out
}

func (sp *Splice) rewriteEvent(ev []byte) []byte {
	var out []byte
	keep := true
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i+1], ev[i+1:]
		} else {
			ev = nil
		}
		d, isData := sse.DataOf(bytes.TrimRight(line, "\r\n"))
		if !isData || bytes.Equal(d, dataDone) {
			out = append(out, line...)
			continue
		}
		o, err := body.Parse(d)
		if err != nil {
			out = append(out, line...)
			continue
		}
		if sp.format.opening(o) {
			keep = false
			continue
		}
		o.Set(sp.format.idKey(), body.AppendQuote(nil, sp.id))
		if len(sp.created) > 0 {
			o.Set("created", sp.created)
		}
		sp.fixUsage(o)
		out = append(append(append(out, "data: "...), o.Bytes()...), '\n')
	}
	if !keep && len(bytes.TrimSpace(out)) == 0 {
		return nil
	}
	return out
}

// fixUsage moves the tokens produced before the break from the continuation's prompt count to
// its completion count: the totals are those of the uninterrupted answer.
func (sp *Splice) fixUsage(o *body.Object) {
	raw, ok := o.Get("usage")
	if !ok || sp.tokens == 0 || string(raw) == "null" {
		return
	}
	var u map[string]json.RawMessage
	if json.Unmarshal(raw, &u) != nil {
		return
	}
	num := func(k string) int64 { n, _ := strconv.ParseInt(string(u[k]), 10, 64); return n }
	prompt, completion := num("prompt_tokens"), num("completion_tokens")
	moved := min(int64(sp.tokens), prompt)
	u["prompt_tokens"] = strconv.AppendInt(nil, prompt-moved, 10)
	u["completion_tokens"] = strconv.AppendInt(nil, completion+moved, 10)
	u["total_tokens"] = strconv.AppendInt(nil, prompt+completion, 10)
	b, err := json.Marshal(u)
	if err == nil {
		o.Set("usage", b)
	}
}

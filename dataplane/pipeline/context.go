package pipeline

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/body"
	"github.com/epd-dev/coordinator/dataplane/gateway"
	"github.com/epd-dev/coordinator/dataplane/logging"
)

// API is the client-facing request format.
type API int

// Request formats.
const (
	APIChat API = iota
	APICompletions
	APIGenerate
)

// String names the format.
func (a API) String() string {
	switch a {
	case APIChat:
		return "chat"
	case APICompletions:
		return "completions"
	}
	return "generate"
}

// APIForPath returns the format of a client path.
func APIForPath(path string) API {
	switch path {
	case gateway.PathChat:
		return APIChat
	case gateway.PathCompletions:
		return APICompletions
	}
	return APIGenerate
}

// Format is the wire format of the encode and prefill legs: the client's own OpenAI format, or
// tokens-in generate when useOpenAI is false (completions always stay completions, as upstream).
func (a API) Format(useOpenAI bool) API {
	if a == APICompletions {
		return APICompletions
	}
	if !useOpenAI {
		return APIGenerate
	}
	return a
}

// Path is the worker path of the format.
func (a API) Path() string {
	switch a {
	case APIChat:
		return gateway.PathChat
	case APICompletions:
		return gateway.PathCompletions
	}
	return gateway.PathGenerate
}

// Placeholder is where an item's placeholder tokens sit in the prompt.
type Placeholder struct {
	Offset int `json:"offset"`
	Length int `json:"length"`
}

// MediaEntry is one multimodal item of the request, in document order.
type MediaEntry struct {
	// Message and Part locate the item in messages[Message].content[Part] (chat only; -1 otherwise).
	Message, Part int
	// Kind is the content-part type, e.g. image_url.
	Kind string
	// URL is the item's URL after media inlining (a data: URL), shared with the body.
	URL string
	// ContentType is the media type of the inlined data.
	ContentType string
	// Hash is the multimodal hash from render (mm_hash).
	Hash string
	// Placeholder is set by render.
	Placeholder Placeholder
	// Kwargs is the raw JSON of the item's kwargs_data (a base64 string, or null for a cache hit).
	Kwargs json.RawMessage
}

// StepTiming records how long one step took.
type StepTiming struct {
	Step     string
	Duration time.Duration
	// Outcome is ok, done (served the response early) or error.
	Outcome string
}

// RequestContext is the state of one request as it moves through the pipeline. It is created by
// the server after the body was parsed once; steps read it and enrich it.
type RequestContext struct {
	// ID is the effective request id, stamped on every leg and response.
	ID string
	// API is the client's request format; Path its original path.
	API  API
	Path string
	// Header holds the client's headers; Forwarded the subset every leg carries.
	Header    http.Header
	Forwarded http.Header
	// Body is the parsed client body. Steps that change what every later leg must see (media
	// inlining) replace its members; legs clone it before their own edits.
	Body *body.Object
	// Model and Stream are read from the body.
	Model  string
	Stream bool

	// TokenIDs is the tokenized prompt (render, or the client's own tokens).
	TokenIDs []int
	// Rendered is true once render ran and TokenIDs/Media hashes are authoritative.
	Rendered bool
	// Media are the multimodal items in document order.
	Media []MediaEntry
	// MediaScanned is true once a step collected Media from the body (replace-media-urls).
	MediaScanned bool
	// ECParams are the merged ec_transfer_params for prefill (keyed by mm_hash).
	ECParams map[string]any
	// PrefillKV is the kv_transfer_params object the prefill worker answered (raw JSON; nil when
	// it sent none). Decode derives its own params from it through its KV connector.
	PrefillKV json.RawMessage
	// Prefilled is true once a prefill leg succeeded.
	Prefilled bool

	// Writer is the client response; only response-producing steps write to it.
	Writer http.ResponseWriter
	// OnResponse, when set, is called by a response-producing step with the status and headers
	// just before they are written (the server adds Server-Timing there).
	OnResponse func(status int, h http.Header)
	// Log carries the request id.
	Log logr.Logger
	// Timings is filled by the executor.
	Timings []StepTiming

	tokenJSON json.RawMessage
	// step and stepStart are the running step, for a Server-Timing header sent mid-step.
	step      string
	stepStart time.Time
	// openBodies counts leg bodies not yet read to the end.
	openBodies atomic.Int32
}

// BodiesSettled reports whether every leg body was read to its end (so the client body they
// share may be reused).
func (rc *RequestContext) BodiesSettled() bool { return rc.openBodies.Load() == 0 }

// trackedBody is a leg body (the pieces of a body.Object) that counts as open until it has been
// read or written to its end. It implements gateway.WholeBody, so the leg goes out in one
// vectored write.
type trackedBody struct {
	bufs net.Buffers
	rc   *RequestContext
	done bool
}

func (t *trackedBody) finish() {
	if !t.done {
		t.done = true
		t.rc.openBodies.Add(-1)
	}
}

func (t *trackedBody) Read(p []byte) (int, error) {
	n, err := t.bufs.Read(p)
	if err == io.EOF {
		t.finish()
	}
	return n, err
}

// WriteTo writes the remaining pieces to w (a writev on a TCP connection).
func (t *trackedBody) WriteTo(w io.Writer) (int64, error) {
	n, err := t.bufs.WriteTo(w)
	if err == nil {
		t.finish()
	}
	return n, err
}

// Len is the number of bytes left.
func (t *trackedBody) Len() int64 {
	var n int64
	for _, b := range t.bufs {
		n += int64(len(b))
	}
	return n
}

// Close is a no-op: the body is in memory. (Being a ReadCloser keeps net/http from wrapping it.)
func (t *trackedBody) Close() error { return nil }

// TokenIDsJSON returns TokenIDs encoded once and cached (they go into several legs).
func (rc *RequestContext) TokenIDsJSON() json.RawMessage {
	if rc.tokenJSON == nil {
		b := make([]byte, 0, 8*len(rc.TokenIDs)+2)
		b = append(b, '[')
		for i, t := range rc.TokenIDs {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(t), 10)
		}
		rc.tokenJSON = append(b, ']')
	}
	return rc.tokenJSON
}

// SetTokenIDs replaces the token ids (and drops the cached encoding).
func (rc *RequestContext) SetTokenIDs(ids []int) {
	rc.TokenIDs = ids
	rc.tokenJSON = nil
}

// Leg returns a gateway leg with this request's forwarded headers and id, named after its profile
// (or phase, for legs without a profile). At trace level the body is logged, redacted.
func (rc *RequestContext) Leg(profile, path string, obj *body.Object) gateway.Leg {
	bufs, n := obj.Buffers()
	body := func() *trackedBody {
		rc.openBodies.Add(1)
		return &trackedBody{bufs: append(net.Buffers(nil), bufs...), rc: rc}
	}
	if l := rc.Log.V(5); l.Enabled() {
		l.Info("leg request", "profile", profile, "path", path, "body", logging.RedactJSON(obj.Bytes()))
	}
	return gateway.Leg{Path: path, Profile: profile, Phase: profile, Header: rc.Forwarded, RequestID: rc.ID, Body: body(), Size: n,
		GetBody: func() (io.ReadCloser, error) { return body(), nil }}
}

// TimingSummary formats the step timings as step=duration pairs for a log line.
func (rc *RequestContext) TimingSummary() []any {
	kv := make([]any, 0, 2*len(rc.Timings))
	for _, t := range rc.Timings {
		kv = append(kv, t.Step, t.Duration.String())
	}
	return kv
}

// ServerTiming formats the step timings as a Server-Timing header value (milliseconds). A step
// still running (the one writing the response) is included with its time so far, i.e. its time to
// first byte.
func (rc *RequestContext) ServerTiming() string {
	var sb strings.Builder
	add := func(name string, d time.Duration) {
		if sb.Len() > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString(strings.ReplaceAll(name, "-", "_"))
		sb.WriteString(";dur=")
		sb.WriteString(strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 3, 64))
	}
	for _, t := range rc.Timings {
		add(t.Step, t.Duration)
	}
	if rc.step != "" {
		add(rc.step, time.Since(rc.stepStart))
	}
	return sb.String()
}

// Package request is the state of one client request as it moves through a pipeline: its API
// format and path, the parsed body and the buffer it lives in, what the steps learn (tokens,
// media, transfer parameters), the headers its legs carry and how long each step took. It is
// data: what the formats mean is package wire's, how a leg is sent package gateway's.
package request

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/bodybuf"
)

// API names the format a request runs in; package wire's Of is the format itself.
type API int

// Request formats.
const (
	APIChat API = iota
	APICompletions
	APIGenerate
	// APIResponses is OpenAI's Responses API, stateless: the workers serve it themselves, and
	// its input items carry the chat messages' content parts.
	APIResponses
)

var apiNames = [...]string{APIChat: "chat", APICompletions: "completions", APIGenerate: "generate", APIResponses: "responses"}

// String names the format.
func (a API) String() string { return apiNames[a] }

// Placeholder is where an item's placeholder tokens sit in the prompt.
type Placeholder struct {
	Offset int `json:"offset"`
	Length int `json:"length"`
}

// MediaEntry is one multimodal item of the request, in document order.
type MediaEntry struct {
	// Message and Part locate the item in messages[Message].content[Part] (input[Message] for the
	// Responses API; -1 for the other formats).
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
	// Metadata is the raw JSON of the item's mm_metadata from render (a base64 string of the light
	// fields, e.g. image_grid_thw, without pixel values; vllm-project/vllm#54659), nil when render
	// sent none for it.
	Metadata json.RawMessage
}

// StepTiming records how long one step took.
type StepTiming struct {
	Step     string
	Duration time.Duration
	// Outcome is ok, done (served the response early) or error.
	Outcome string
}

// Context is the state of one request as it moves through the pipeline. It is created by the
// server after the body was parsed once; steps read it and enrich it.
type Context struct {
	// ID is the effective request id, stamped on every leg and response.
	ID string
	// API is the format the request runs in (wire.Of gives its behaviour); Path its client path.
	API  API
	Path string
	// Header holds the client's headers; Forwarded the subset every leg carries (read it with
	// LegHeader once legs run).
	Header    http.Header
	Forwarded http.Header
	// ForwardResponse are the canonical names of pipeline.forward_response_headers: a value an
	// answer carries joins Forwarded for every later leg.
	ForwardResponse []string
	// Body is the parsed client body. Steps that change what every later leg must see (media
	// inlining) replace its members; legs clone it before their own edits.
	Body *body.Object
	// Buffer holds the bytes Body was parsed from; every leg body holds a reference on it (nil:
	// Body's bytes are not pooled).
	Buffer *bodybuf.Buffer
	// Model and Stream are read from the body.
	Model  string
	Stream bool

	// Rendered is true once render ran and the token ids (TokenIDs) and Media hashes are
	// authoritative.
	Rendered bool
	// Media are the multimodal items in document order.
	Media []MediaEntry
	// MediaScanned is true once a step collected Media from the body (replace-media-urls).
	MediaScanned bool
	// ECParams are the merged ec_transfer_params for prefill (keyed by mm_hash).
	ECParams map[string]any
	// PrefillKV is the kv_transfer_params object the prefill worker answered (raw JSON taken
	// from the validated answer; nil when it sent none). Decode derives its own params from it
	// through its KV connector, which does not validate it again.
	PrefillKV json.RawMessage
	// Prefilled is true once a prefill leg succeeded.
	Prefilled bool
	// Degraded names the phase whose pool could not serve the request (pipeline.on_pool_failure
	// aggregate): the later disaggregated phases are skipped and decode serves it alone.
	Degraded string
	// Hints are the endpoints a conditional decode's 412 named for later phases, by profile
	// (encode, prefill), best first, when the step reads hints: their legs are pinned to them.
	Hints map[string][]string

	// PrefillEnd is when the prefill leg's answer was read (zero: no prefill leg succeeded):
	// with the first byte of the answer it gives what the KV transfer cost.
	PrefillEnd time.Time
	// Answer is what the relay read of the answer for the metrics (usage, served model).
	Answer AnswerStats
	// ReadAnswer has the relay read Answer even without metrics: the rate limiter settles the
	// tenant's tokens on its usage.
	ReadAnswer bool
	// HideUsage is set when the coordinator asked the decode worker for usage in a stream the
	// client did not ask it in (stream_options.include_usage): the relay keeps the usage chunk
	// from the client.
	HideUsage bool
	// OnEvents, when set, is called by the stream relay each time it wrote n token events
	// (data events other than [DONE]) to the client: the inter-token latency clock.
	OnEvents func(n int)

	// Writer is the client response; only response-producing steps write to it.
	Writer http.ResponseWriter
	// Log carries the request id.
	Log logr.Logger
	// Timings is filled by the executor (StartStep, EndStep).
	Timings []StepTiming

	tokens tokenIDs // the tokenized prompt (render's, or the client's own tokens)
	// fwdMu guards Forwarded once legs run (encode legs answer concurrently).
	fwdMu sync.Mutex
	// step and stepStart are the running step, for a Server-Timing header sent mid-step.
	step      string
	stepStart time.Time
}

// StartStep records that the named step starts now.
func (rc *Context) StartStep(name string) {
	rc.step, rc.stepStart = name, time.Now()
}

// EndStep records the end of the running step with its outcome and returns its timing.
func (rc *Context) EndStep(outcome string) StepTiming {
	t := StepTiming{Step: rc.step, Duration: time.Since(rc.stepStart), Outcome: outcome}
	rc.Timings = append(rc.Timings, t)
	rc.step = ""
	return t
}

// LegHeader is the header set the next leg carries: Forwarded, with the values earlier answers
// gave to pipeline.forward_response_headers. Callers must not modify it.
func (rc *Context) LegHeader() http.Header {
	rc.fwdMu.Lock()
	defer rc.fwdMu.Unlock()
	return rc.Forwarded
}

// KeepForwarded records the forward_response_headers values an answer carries (copy on write:
// legs in flight keep the header set they were sent with). Safe for concurrent use (encode's
// legs answer in parallel).
func (rc *Context) KeepForwarded(h http.Header) {
	rc.fwdMu.Lock()
	defer rc.fwdMu.Unlock()
	var next http.Header
	for _, name := range rc.ForwardResponse {
		v := h.Values(name)
		if len(v) == 0 || slices.Equal(v, rc.Forwarded[name]) {
			continue
		}
		if next == nil {
			next = rc.Forwarded.Clone()
			if next == nil {
				next = http.Header{}
			}
		}
		next[name] = slices.Clone(v)
	}
	if next != nil {
		rc.Forwarded = next
	}
}

// TimingSummary formats the step timings as step=duration pairs for a log line.
func (rc *Context) TimingSummary() []any {
	kv := make([]any, 0, 2*len(rc.Timings))
	for _, t := range rc.Timings {
		kv = append(kv, t.Step, t.Duration.String())
	}
	return kv
}

// ServerTiming formats the step timings as a Server-Timing header value (milliseconds). A step
// still running (the one writing the response) is included with its time so far, i.e. its time to
// first byte.
func (rc *Context) ServerTiming() string {
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

package simworker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// FaultKind names a way a Worker fails (see Worker.InjectFault).
type FaultKind string

// The faults a Worker can be made to show.
const (
	// FaultStatus answers Fault.Status with Fault.Body (see FailNext for how
	// the body is sent) and, when Fault.RetryAfter is set, a Retry-After
	// header.
	FaultStatus FaultKind = "status"
	// FaultDieMidStream serves the request and cuts the connection with a TCP
	// reset partway through the answer, as the peer of a SIGKILL'd or
	// OOM-killed vLLM sees it: a stream right after its Fault.AfterTokens-th
	// token event was flushed (0: right after the headers; at least the
	// stream's length: after its last token, before the usage event and
	// [DONE]); any other answer after its headers (with the full
	// Content-Length) and the first half of its body.
	FaultDieMidStream FaultKind = "die-mid-stream"
	// FaultHangAfterHeaders serves the request up to the same point as
	// FaultDieMidStream (a stream's first Fault.AfterTokens token events,
	// otherwise the headers alone), then sends nothing until the request's
	// context ends (the client left or the worker closes) and resets the
	// connection.
	FaultHangAfterHeaders FaultKind = "hang-after-headers"
	// FaultResetBeforeHeaders reads the request and resets the connection
	// without answering.
	FaultResetBeforeHeaders FaultKind = "reset-before-headers"
	// FaultHangBeforeHeaders reads the request and answers nothing until the
	// request's context ends, then resets the connection.
	FaultHangBeforeHeaders FaultKind = "hang-before-headers"
	// FaultRecompute makes a decode leg with a remote prefill ignore its kv_transfer_params, as
	// vLLM does after a failed KV load with kv_load_failure_policy=recompute (or with a decode
	// connector that never loads): it neither pulls nor frees the prefill's KV, computes the
	// prompt itself and answers with usage.prompt_tokens_details.cached_tokens 0. Other
	// requests that draw it are served as usual.
	FaultRecompute FaultKind = "recompute"
)

// StatusNoAnswer is the Request.Status of a faulted request the worker
// answered nothing to (it reset or hung up before the headers).
const StatusNoAnswer = -1

// PathFaults is the fault-control endpoint (Config.FaultControl).
const PathFaults = "/sim/faults"

// Fault is a failure injected into the next Count inference or render
// requests (POST to the chat, completions, generate or render endpoints).
// Its JSON form is the body of POST /sim/faults.
type Fault struct {
	// Kind is the failure.
	Kind FaultKind `json:"kind"`
	// Count is the number of requests it applies to. Default: 1.
	Count int `json:"count,omitempty"`
	// AfterTokens is the number of token events a stream delivers before
	// FaultDieMidStream or FaultHangAfterHeaders strikes.
	AfterTokens int `json:"after_tokens,omitempty"`
	// Status is the status of FaultStatus (200 to 599).
	Status int `json:"status,omitempty"`
	// Body is the body of FaultStatus; empty means a vLLM-style error.
	Body string `json:"body,omitempty"`
	// RetryAfter, when positive, is the Retry-After of FaultStatus, in seconds.
	RetryAfter int `json:"retry_after,omitempty"`
	// Match, when set, limits the fault to requests whose body contains it, for example
	// `"input_audio"` for the encode legs of input_audio items: a request without it passes,
	// unfaulted, and uses none of Count (nor do the faults queued behind this one apply to it).
	Match string `json:"match,omitempty"`
}

// Validate reports whether f describes a fault a Worker can inject.
func (f Fault) Validate() error {
	switch f.Kind {
	case FaultStatus:
		if f.Status < 200 || f.Status > 599 {
			return fmt.Errorf("fault %s: status %d is not between 200 and 599", f.Kind, f.Status)
		}
	case FaultDieMidStream, FaultHangAfterHeaders, FaultResetBeforeHeaders, FaultHangBeforeHeaders, FaultRecompute:
	default:
		return fmt.Errorf("unknown fault kind %q (want %s, %s, %s, %s, %s or %s)", f.Kind,
			FaultStatus, FaultDieMidStream, FaultHangAfterHeaders, FaultResetBeforeHeaders, FaultHangBeforeHeaders, FaultRecompute)
	}
	if f.Count < 0 || f.AfterTokens < 0 || f.RetryAfter < 0 {
		return fmt.Errorf("fault %s: count, after_tokens and retry_after must not be negative", f.Kind)
	}
	return nil
}

// InjectFault queues f: once the faults queued before it are used up, it
// applies to the next f.Count (default 1) inference or render requests.
// Side channels, /health, /v1/models and the fault endpoint are unaffected.
// It fails when f does not Validate.
func (w *Worker) InjectFault(f Fault) error {
	if err := f.Validate(); err != nil {
		return err
	}
	f.Count = max(f.Count, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.faults = append(w.faults, f)
	return nil
}

// ClearFaults drops the queued faults.
func (w *Worker) ClearFaults() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.faults = nil
}

// Faults returns the queued faults, the first one with the count it has
// left.
func (w *Worker) Faults() []Fault {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Fault{}, w.faults...)
}

// FailNext makes the worker answer the next n inference or render requests
// (side channels, /health and /v1/models are unaffected) with status and
// body, dropping any queued fault: ClearFaults, then InjectFault of a
// FaultStatus. An empty body is replaced by a vLLM-style error; a body
// starting with '{' or '[' is sent as JSON, anything else as text.
func (w *Worker) FailNext(n int, status int, body string) {
	w.ClearFaults()
	if n > 0 {
		_ = w.InjectFault(Fault{Kind: FaultStatus, Count: n, Status: status, Body: body})
	}
}

// faultable reports whether faults apply to r: POST to an inference or render endpoint.
func faultable(r *http.Request) bool {
	if r.Method != http.MethodPost {
		return false
	}
	switch r.URL.Path {
	case PathChatCompletions, PathCompletions, PathGenerate, PathResponses, PathChatRender, PathCompletionRender:
		return true
	}
	return false
}

// takeFaultLocked uses up one request of the first queued fault, if r (whose body is body) is
// faultable and matches it. w.mu must be held.
func (w *Worker) takeFaultLocked(r *http.Request, body []byte) (Fault, bool) {
	if len(w.faults) == 0 || !faultable(r) || !bytes.Contains(body, []byte(w.faults[0].Match)) {
		return Fault{}, false
	}
	f := w.faults[0]
	if w.faults[0].Count--; w.faults[0].Count == 0 {
		w.faults = w.faults[1:]
	}
	return f, true
}

// handleFaults serves the fault-control endpoint: POST queues the Fault in the body, DELETE
// clears the queue, GET lists it; each answers {"faults": [...]}, the queue afterwards.
func (w *Worker) handleFaults(rw http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPost:
		var f Fault
		dec := json.NewDecoder(http.MaxBytesReader(rw, r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			writeError(rw, http.StatusBadRequest, "invalid fault: "+err.Error())
			return
		}
		if err := w.InjectFault(f); err != nil {
			writeError(rw, http.StatusBadRequest, err.Error())
			return
		}
	case http.MethodDelete:
		w.ClearFaults()
	case http.MethodGet:
	default:
		rw.Header().Set("Allow", "GET, POST, DELETE")
		writeError(rw, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	writeJSON(rw, http.StatusOK, struct {
		Faults []Fault `json:"faults"`
	}{w.Faults()})
}

// serveFault answers a request that drew fault f; dispatch serves it for the faults that strike
// partway through an answer.
func (w *Worker) serveFault(rw http.ResponseWriter, r *http.Request, f Fault, dispatch func(http.ResponseWriter, *http.Request)) {
	ctx := r.Context()
	switch f.Kind {
	case FaultStatus:
		writeInjected(rw, f.Status, f.Body, f.RetryAfter)
	case FaultResetBeforeHeaders:
		resetConn(rw)
	case FaultHangBeforeHeaders:
		<-ctx.Done()
		resetConn(rw)
	case FaultRecompute:
		dispatch(rw, r.WithContext(context.WithValue(ctx, recomputeKey{}, true)))
	default:
		af := &activeFault{fault: f, rw: rw}
		rec := &recorder{header: rw.Header()}
		dispatch(rec, r.WithContext(context.WithValue(ctx, faultKey{}, af)))
		if !af.claimed {
			af.strikeBuffered(ctx, rec)
		}
	}
}

// writeInjected answers an injected status.
func writeInjected(rw http.ResponseWriter, status int, body string, retryAfter int) {
	if retryAfter > 0 {
		rw.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	if body == "" {
		writeError(rw, status, fmt.Sprintf("injected failure (%d)", status))
		return
	}
	ct := "text/plain; charset=utf-8"
	if body[0] == '{' || body[0] == '[' {
		ct = "application/json"
	}
	rw.Header().Set("Content-Type", ct)
	rw.WriteHeader(status)
	_, _ = io.WriteString(rw, body)
}

// faultKey carries an activeFault through the request context.
type faultKey struct{}

// recomputeKey marks a request that drew FaultRecompute.
type recomputeKey struct{}

// recomputes reports whether the request of ctx drew FaultRecompute.
func recomputes(ctx context.Context) bool { return ctx.Value(recomputeKey{}) != nil }

// activeFault is a fault that strikes partway through an answer. A stream claims it and writes
// to rw itself; any other answer is recorded first and cut afterwards.
type activeFault struct {
	fault   Fault
	rw      http.ResponseWriter // the connection's writer
	claimed bool
}

// claimFault returns the fault a stream must strike with, if any.
func claimFault(ctx context.Context) *activeFault {
	af, _ := ctx.Value(faultKey{}).(*activeFault)
	if af != nil {
		af.claimed = true
	}
	return af
}

// strike ends a claimed stream whose events so far are flushed: at once, or after a hang.
func (af *activeFault) strike(ctx context.Context) {
	if af.fault.Kind == FaultHangAfterHeaders {
		<-ctx.Done()
	}
	resetConn(af.rw)
}

// strikeBuffered sends the headers of a recorded answer (and for FaultDieMidStream half of its
// body), then strikes.
func (af *activeFault) strikeBuffered(ctx context.Context, rec *recorder) {
	body := rec.body.Bytes()
	af.rw.Header().Set("Content-Length", strconv.Itoa(len(body)))
	af.rw.WriteHeader(max(rec.status, http.StatusOK))
	if af.fault.Kind == FaultDieMidStream {
		_, _ = af.rw.Write(body[:len(body)/2])
	}
	_ = http.NewResponseController(af.rw).Flush()
	af.strike(ctx)
}

// recorder keeps an answer for strikeBuffered. Its header is the connection writer's.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

// Header implements http.ResponseWriter.
func (r *recorder) Header() http.Header { return r.header }

// WriteHeader implements http.ResponseWriter.
func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

// Write implements http.ResponseWriter.
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}

// Flush implements http.Flusher (the answer is sent later).
func (*recorder) Flush() {}

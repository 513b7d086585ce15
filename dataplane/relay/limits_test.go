package relay

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/budget"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
	"github.com/epd-dev/coordinator/dataplane/wire"
	"github.com/epd-dev/coordinator/dataplane/wire/sse"
)

// counted is a worker's answer read in the relay's 2 KiB reads, counting the bytes read.
type counted struct {
	rest string
	read int
	end  error
}

func (c *counted) Read(p []byte) (int, error) {
	if c.rest == "" {
		return 0, c.end
	}
	n := copy(p, c.rest)
	c.rest, c.read = c.rest[n:], c.read+n
	return n, nil
}

func (*counted) Close() error { return nil }

func answer(c *counted) *http.Response {
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: c}
}

// TestEventLimit: an event of a worker's stream over gateway.max_event_size breaks the stream
// once the limit is passed (never read further), as a worker fault: resumed when it can be,
// else an error event naming the key; before the client got anything, a 502 naming it.
func TestEventLimit(t *testing.T) {
	const limit = 1 << 10
	huge := "data: " + strings.Repeat("x", 4*limit)
	done := "data: [DONE]\n\n"
	tests := map[string]struct {
		api         request.API
		stream      string // the first worker's answer
		resumes     int
		resend      string // every continuation's answer
		want        string // the client's events, before an error event
		wantErr     error
		errEvent    string // in the error event (or the 502) the client gets
		notStarted  bool
		maxReadOver int // bytes the first answer may be read past its first event and the limit
	}{
		"no blank line": {stream: chunk("c", "Hello") + huge, want: chunk("c", "Hello"), wantErr: upstream.ErrResponseTruncated,
			errEvent: "over gateway.max_event_size (1024 bytes)", maxReadOver: 2 << 10},
		"with its blank line": {stream: chunk("c", "Hello") + huge + "\n\n" + done, want: chunk("c", "Hello"), wantErr: upstream.ErrResponseTruncated,
			errEvent: "over gateway.max_event_size (1024 bytes)", maxReadOver: 2 << 10},
		"resumed on another pick": {stream: chunk("c", "Hello") + huge, resumes: 1, resend: chunk("d", " world") + done,
			want: chunk("c", "Hello") + chunk("c", " world") + done},
		"the continuations too": {stream: chunk("c", "Hello") + huge, resumes: 2, resend: chunk("d", " again") + huge,
			want: chunk("c", "Hello") + chunk("c", " again") + chunk("c", " again"), wantErr: upstream.ErrResponseTruncated,
			errEvent: "broke off too many times (an event of the worker's stream is over gateway.max_event_size (1024 bytes))"},
		"the first event": {stream: huge, resumes: 2, wantErr: upstream.ErrNotStarted, notStarted: true,
			errEvent: "over gateway.max_event_size (1024 bytes)", maxReadOver: 2 << 10},
		"a Responses stream": {api: request.APIResponses, resumes: 2,
			stream: "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0}\n\n" + huge,
			want:   "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0}\n\n", wantErr: upstream.ErrResponseTruncated,
			errEvent: "responses streams are not resumed (only chat and tokens-in generate) (an event of the worker's stream is over gateway.max_event_size (1024 bytes))"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rc := chatRC(t, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":50}`)
			rc.API = tc.api // APIChat when unset
			first := &counted{rest: tc.stream, end: io.EOF}
			a := Answerer{MaxResumes: tc.resumes, Limits: Limits{MaxEvent: limit}, Resend: func(context.Context, *request.Context, *body.Object) (*http.Response, error) {
				return answer(&counted{rest: tc.resend, end: io.EOF}), nil
			}}
			rec := httptest.NewRecorder()
			err := a.Respond(context.Background(), rc, Target{W: rec, Stream: true, Body: rc.Body}, answer(first), "decode")
			if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if tc.maxReadOver > 0 && first.read > len(tc.want)+limit+tc.maxReadOver {
				t.Errorf("%d bytes of the answer read: the limit did not stop the reads", first.read)
			}
			if tc.notStarted {
				e := apierror.From(err)
				if rec.Body.Len() != 0 || e.Status != http.StatusBadGateway || !strings.Contains(e.Message, tc.errEvent) || !errors.Is(err, sse.ErrTooLarge) {
					t.Fatalf("wrote %q; error %d %q, want a 502 naming the limit", rec.Body.String(), e.Status, e.Message)
				}
				return
			}
			got, ok := strings.CutPrefix(rec.Body.String(), tc.want)
			if !ok {
				t.Fatalf("the client got %q, want it to start with %q", rec.Body.String(), tc.want)
			}
			if tc.errEvent == "" {
				if got != "" {
					t.Fatalf("the client got %q after the answer", got)
				}
				return
			}
			var ev struct {
				Error   struct{ Message string } `json:"error"`
				Message string                   `json:"message"` // a Responses error event
			}
			_, data, _ := strings.Cut(got, "data: ")
			if err := json.Unmarshal([]byte(data), &ev); err != nil || !strings.Contains(ev.Error.Message+ev.Message, tc.errEvent) {
				t.Fatalf("the client's last event %q, want an error naming %q", got, tc.errEvent)
			}
		})
	}
}

// failing is a client that goes away after its first write.
type failing struct {
	*httptest.ResponseRecorder
	writes int
}

func (f *failing) Write(p []byte) (int, error) {
	if f.writes++; f.writes > 1 {
		return 0, errors.New("client gone")
	}
	return f.ResponseRecorder.Write(p)
}

// TestResumeKeep: what a stream keeps to be resumed from is reserved from the process's count
// while it streams, and given back however the stream ends: its end, a break that is not resumed,
// a client gone, its own bound passed.
func TestResumeKeep(t *testing.T) {
	var events strings.Builder
	for range 40 { // 40 KiB of content: folded, reserved
		events.WriteString(chunk("c", strings.Repeat("w", 1<<10)))
	}
	tests := map[string]struct {
		stream    string
		end       error
		max       int64
		clientEnd bool // the client goes away after its first write
		errEvent  string
	}{
		"the stream ends":       {stream: events.String() + "data: [DONE]\n\n", end: io.EOF},
		"a break not resumed":   {stream: events.String(), end: io.ErrUnexpectedEOF, errEvent: "broke off too many times"},
		"the client goes away":  {stream: events.String() + "data: [DONE]\n\n", end: io.EOF, clientEnd: true},
		"over the stream's cap": {stream: events.String(), end: io.ErrUnexpectedEOF, max: 16 << 10, errEvent: "longer than the 16384 bytes kept to resume from (gateway.retry.max_resume_size)"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			held := &budget.Bytes{}
			most := int64(0)
			rec := httptest.NewRecorder()
			var w http.ResponseWriter = &watching{ResponseRecorder: rec, after: func() { most = max(most, held.Held()) }}
			if tc.clientEnd {
				w = &failing{ResponseRecorder: rec}
			}
			rc := chatRC(t, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":500000}`)
			a := Answerer{Limits: Limits{MaxEvent: 1 << 20, Keep: wire.Keep{Max: cmp.Or(tc.max, 1<<20), Held: held, Limit: 64 << 20}}}
			_ = a.Respond(context.Background(), rc, Target{W: w, Stream: true, Body: rc.Body}, answer(&counted{rest: tc.stream, end: tc.end}), "decode")
			if held.Held() != 0 {
				t.Fatalf("%d bytes still reserved after the stream", held.Held())
			}
			if !tc.clientEnd && tc.max == 0 && most < 32<<10 {
				t.Fatalf("at most %d bytes reserved while 40 KiB were kept", most)
			}
			if tc.errEvent != "" && !strings.Contains(rec.Body.String(), tc.errEvent) {
				t.Fatalf("the client's answer ends %q, want an error event naming %q", rec.Body.String()[max(0, rec.Body.Len()-300):], tc.errEvent)
			}
		})
	}
}

// watching is a client that calls after each write.
type watching struct {
	*httptest.ResponseRecorder
	after func()
}

func (w *watching) Write(p []byte) (int, error) {
	n, err := w.ResponseRecorder.Write(p)
	w.after()
	return n, err
}

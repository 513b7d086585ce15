package anthropic

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
)

func TestWriter(t *testing.T) {
	o := Options{RequestID: "rid", Model: "asked"}
	tests := []struct {
		name        string
		status      int
		contentType string
		writes      []string
		pipelineErr error
		wantStatus  int
		wantType    string // the response's Content-Type
		wantBody    string // JSON compared as values; "" for an event stream checked by wantEvents
		wantEvents  int
		wantErr     string // the error Finish returns, "" for none
	}{
		{
			name: "a JSON answer, written in pieces", status: 200, contentType: "application/json",
			writes:     []string{`{"id":"chatcmpl-1","model":"m","choices":[{"message":{"content":"hi"},`, `"finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":1}}`},
			wantStatus: 200, wantType: "application/json",
			wantBody: `{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"hi"}],"stop_reason":"max_tokens","stop_sequence":null,
				"usage":{"input_tokens":2,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}`,
		},
		{
			name: "a worker's 400", status: 400, contentType: "application/json",
			writes:     []string{`{"error":{"message":"This model's maximum context length is 10 tokens (10.1.2.3:8000)","type":"BadRequestError","param":"messages","code":400}}`},
			wantStatus: 400, wantType: "application/json",
			wantBody: `{"type":"error","error":{"type":"invalid_request_error","message":"This model's maximum context length is 10 tokens (<redacted>)"},"request_id":"rid"}`,
		},
		{
			name: "a worker's 404 in FastAPI's shape", status: 404, contentType: "application/json", writes: []string{`{"detail":"Not Found"}`},
			wantStatus: 404, wantType: "application/json", wantBody: `{"type":"error","error":{"type":"not_found_error","message":"Not Found"},"request_id":"rid"}`,
		},
		{
			name: "a worker's 500 keeps its status", status: 500, contentType: "application/json", writes: []string{`{"error":{"message":"boom"}}`},
			wantStatus: 500, wantType: "application/json", wantBody: `{"type":"error","error":{"type":"api_error","message":"decode failed: HTTP 500"},"request_id":"rid"}`,
		},
		{
			name: "an async broker's 202 passes through", status: 202, contentType: "application/json", writes: []string{`{"id":"rid","status":"pending"}`},
			wantStatus: 202, wantType: "application/json", wantBody: `{"id":"rid","status":"pending"}`,
		},
		{
			name: "a stream", status: 200, contentType: "text/event-stream",
			writes:     []string{chatSSE(roleChunk, textChunk("a", "length")), chatSSE(usageChunk, "[DONE]")},
			wantStatus: 200, wantType: "text/event-stream", wantEvents: 7,
		},
		{
			name: "a stream cut by the pipeline", status: 200, contentType: "text/event-stream",
			writes: []string{chatSSE(roleChunk, textChunk("a", ""))}, pipelineErr: upstream.ErrResponseTruncated,
			wantStatus: 200, wantType: "text/event-stream", wantEvents: 5, wantErr: upstream.ErrResponseTruncated.Error(),
		},
		{
			name: "an answer that fails to relay is the pipeline's error", status: 200, contentType: "application/json",
			writes: []string{`{"choices":`}, pipelineErr: errors.New("relay failed"), wantErr: "relay failed",
		},
		{
			name: "an answer that cannot be translated", status: 200, contentType: "application/json",
			writes: []string{`{"choices":[]}`}, wantErr: "cannot be translated",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			w := NewWriter(rec, o)
			w.Header().Set("Content-Type", tc.contentType)
			w.Header().Set("Content-Length", "999")
			w.WriteHeader(tc.status)
			for _, p := range tc.writes {
				if _, err := w.Write([]byte(p)); err != nil {
					t.Fatal(err)
				}
				w.Flush()
			}
			err := w.Finish(tc.pipelineErr)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Finish: %v", err)
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Finish: %v, want %q", err, tc.wantErr)
				}
				if tc.wantStatus == 0 {
					if rec.Code != 200 || rec.Body.Len() != 0 || w.Started() {
						t.Errorf("wrote %d %q for a failed answer", rec.Code, rec.Body.String())
					}
					var e *apierror.Error
					if tc.pipelineErr == nil && (!errors.As(err, &e) || e.Status != http.StatusBadGateway) {
						t.Errorf("%v: want a 502", err)
					}
					return
				}
			}
			if rec.Code != tc.wantStatus || rec.Header().Get("Content-Type") != tc.wantType {
				t.Errorf("HTTP %d %s, want %d %s", rec.Code, rec.Header().Get("Content-Type"), tc.wantStatus, tc.wantType)
			}
			if tc.wantEvents > 0 {
				if evs := parseEvents(t, rec.Body.String()); len(evs) != tc.wantEvents {
					t.Errorf("%d events, want %d: %s", len(evs), tc.wantEvents, rec.Body.String())
				}
				if rec.Header().Get("Content-Length") != "" || !rec.Flushed {
					t.Errorf("Content-Length %q, flushed %v", rec.Header().Get("Content-Length"), rec.Flushed)
				}
				return
			}
			equalJSON(t, rec.Body.Bytes(), tc.wantBody)
			if tc.status != 202 && rec.Header().Get("Content-Length") != strconv.Itoa(rec.Body.Len()) {
				t.Errorf("Content-Length %q for %d bytes", rec.Header().Get("Content-Length"), rec.Body.Len())
			}
		})
	}
}

// TestWriterAnswerTooLarge: a JSON answer over MaxAnswerBytes is a 502, not held.
func TestWriterAnswerTooLarge(t *testing.T) {
	rec := httptest.NewRecorder()
	w := NewWriter(rec, Options{})
	w.Header().Set("Content-Type", "application/json")
	chunk := make([]byte, 1<<20)
	for range MaxAnswerBytes>>20 + 1 {
		_, _ = w.Write(chunk)
	}
	var e *apierror.Error
	if err := w.Finish(nil); !errors.As(err, &e) || e.Status != http.StatusBadGateway || e.Code != "answer_too_large" {
		t.Fatalf("%v", err)
	}
	if len(w.buf) > MaxAnswerBytes {
		t.Errorf("held %d bytes", len(w.buf))
	}
}

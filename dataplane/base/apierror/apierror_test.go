package apierror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"testing"
	"time"
)

func TestFrom(t *testing.T) {
	client := InvalidField("messages", "messages must be %s", "an array")
	errTransport := errors.New("connection refused")
	tests := []struct {
		name    string
		err     error
		same    *Error // From must return this very *Error
		status  int
		typ     string
		code    string
		message string
	}{
		{name: "client error", err: client, same: client},
		{name: "wrapped client error", err: fmt.Errorf("step render: %w", client), same: client},
		{name: "too large", err: TooLarge(1024), status: 413, typ: TypeInvalidRequest, code: "request_too_large",
			message: "request body too large: the limit is 1024 bytes"},
		{name: "upstream 400", err: &UpstreamError{Phase: "prefill", Status: 400, Body: []byte("secret")},
			status: 400, typ: TypeInvalidRequest, code: "upstream_rejected", message: "prefill rejected the request: HTTP 400"},
		{name: "upstream 404", err: &UpstreamError{Phase: "decode", Status: 404},
			status: 404, typ: TypeInvalidRequest, code: "upstream_rejected", message: "decode rejected the request: HTTP 404"},
		{name: "upstream 499", err: &UpstreamError{Phase: "encode[1]", Status: 499},
			status: 499, typ: TypeInvalidRequest, code: "upstream_rejected", message: "encode[1] rejected the request: HTTP 499"},
		{name: "wrapped upstream 422", err: fmt.Errorf("leg: %w", &UpstreamError{Phase: "prefill", Status: 422}),
			status: 422, typ: TypeInvalidRequest, code: "upstream_rejected", message: "prefill rejected the request: HTTP 422"},
		{name: "upstream 4xx wins over a cancellation it wraps", err: &UpstreamError{Phase: "render", Status: 400, Err: context.Canceled},
			status: 400, typ: TypeInvalidRequest, code: "upstream_rejected", message: "render rejected the request: HTTP 400"},
		{name: "upstream 500", err: &UpstreamError{Phase: "prefill", Status: 500, Body: []byte("trace")},
			status: 502, typ: TypeAPI, code: "upstream_error", message: "prefill failed: HTTP 500"},
		{name: "upstream 503", err: &UpstreamError{Phase: "decode", Status: 503, Body: []byte("no healthy upstream")},
			status: 503, typ: TypeUnavailable, code: "upstream_unavailable", message: "decode: no endpoint served the request (HTTP 503: the pool has no endpoint, or the one picked could not be reached)"},
		{name: "upstream 429 without a message (the endpoint picker's)", err: &UpstreamError{Phase: "decode", Status: 429, Body: []byte("no ready pods")},
			status: 429, typ: TypeRateLimit, code: "rate_limit_exceeded", message: "decode: no endpoint can take the request now (HTTP 429: the endpoint picker found no ready pod for the profile, or the pod is saturated)"},
		{name: "upstream 429", err: &UpstreamError{Phase: "prefill", Status: 429, Body: []byte(`{"error":{"message":"too many requests at 10.1.2.3:8000"}}`)},
			status: 429, typ: TypeRateLimit, code: "rate_limit_exceeded", message: "too many requests at <redacted>"},
		{name: "upstream 504", err: &UpstreamError{Phase: "prefill", Status: 504, Body: []byte("upstream request timeout")},
			status: 504, typ: TypeTimeout, code: "upstream_timeout", message: "prefill timed out: HTTP 504"},
		{name: "worker's own message", err: &UpstreamError{Phase: "prefill", Status: 400, Body: []byte(
			`{"error":{"message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.","type":"BadRequestError","code":400}}`)},
			status: 400, typ: TypeInvalidRequest, code: "upstream_rejected",
			message: "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens."},
		{name: "FastAPI detail", err: &UpstreamError{Phase: "render", Status: 422, Body: []byte(`{"detail":"messages: field required"}`)},
			status: 422, typ: TypeInvalidRequest, code: "upstream_rejected", message: "messages: field required"},
		{name: "addresses redacted", err: &UpstreamError{Phase: "decode", Status: 400, Body: []byte(
			`{"error":{"message":"KV transfer failed: GET http://10.0.0.7:8001/kv/abc: dial tcp [fd00::7]:8001 and prefill-0.pool:9000 refused"}}`)},
			status: 400, typ: TypeInvalidRequest, code: "upstream_rejected",
			message: "KV transfer failed: GET <redacted> dial tcp <redacted> and <redacted> refused"},
		{name: "empty message falls back", err: &UpstreamError{Phase: "prefill", Status: 400, Body: []byte(`{"error":{"message":"\u0000"}}`)},
			status: 400, typ: TypeInvalidRequest, code: "upstream_rejected", message: "prefill rejected the request: HTTP 400"},
		{name: "upstream 3xx", err: &UpstreamError{Phase: "media[0]", Status: 302},
			status: 502, typ: TypeAPI, code: "upstream_error", message: "media[0] failed: HTTP 302"},
		{name: "transport error", err: &UpstreamError{Phase: "encode[0]", Err: errTransport},
			status: 502, typ: TypeAPI, code: "upstream_error", message: "encode[0] failed"},
		{name: "wrapped transport error", err: fmt.Errorf("x: %w", &UpstreamError{Phase: "render", Err: errTransport}),
			status: 502, typ: TypeAPI, code: "upstream_error", message: "render failed"},
		{name: "plain error", err: errTransport, status: 502, typ: TypeAPI, code: "upstream_error", message: "upstream error"},
		{name: "canceled", err: context.Canceled,
			status: 499, typ: TypeInvalidRequest, code: "client_closed_request", message: "client closed the request"},
		{name: "wrapped canceled", err: fmt.Errorf("prefill: %w", context.Canceled),
			status: 499, typ: TypeInvalidRequest, code: "client_closed_request", message: "client closed the request"},
		{name: "upstream transport canceled", err: &UpstreamError{Phase: "decode", Err: context.Canceled},
			status: 499, typ: TypeInvalidRequest, code: "client_closed_request", message: "client closed the request"},
		{name: "deadline exceeded", err: context.DeadlineExceeded,
			status: 502, typ: TypeAPI, code: "upstream_error", message: "upstream error"},
		{name: "upstream deadline exceeded", err: &UpstreamError{Phase: "prefill", Err: context.DeadlineExceeded},
			status: 502, typ: TypeAPI, code: "upstream_error", message: "prefill failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := From(tt.err)
			if tt.same != nil {
				if got != tt.same {
					t.Fatalf("From = %+v, want the client error itself %+v", got, tt.same)
				}
				return
			}
			if got.Status != tt.status || got.Type != tt.typ || got.Code != tt.code || got.Message != tt.message || got.Param != "" {
				t.Errorf("From = {%d %q %q %q param %q}, want {%d %q %q %q}", got.Status, got.Type, got.Code, got.Message, got.Param,
					tt.status, tt.typ, tt.code, tt.message)
			}
			// A mapped error keeps what it maps as its cause (for logs); a made one has none.
			// Identity, not errors.As / errors.Is: the cases' errors are unwrapped on purpose.
			if _, made := tt.err.(*Error); made { //nolint:errorlint // see above
				if got.Cause != nil {
					t.Errorf("cause %v", got.Cause)
				}
			} else if got.Cause != tt.err { //nolint:errorlint // see above
				t.Errorf("cause = %v, want %v", got.Cause, tt.err)
			}
		})
	}
}

func TestErrorStrings(t *testing.T) {
	cause := errors.New("boom")
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"message", BadRequest("bad", "bad %d", 1), "bad 1"},
		{"with cause", &Error{Message: "m", Cause: cause}, "m: boom"},
		{"upstream status", &UpstreamError{Phase: "prefill", Status: 500}, "prefill: HTTP 500"},
		{"upstream status and error", &UpstreamError{Phase: "decode", Status: 200, Err: cause}, "decode: HTTP 200: boom"},
		{"upstream transport", &UpstreamError{Phase: "render", Err: cause}, "render: boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("Error() = %q, want %q", got, tt.want)
			}
		})
	}
	if !errors.Is(&Error{Cause: cause}, cause) || !errors.Is(&UpstreamError{Err: cause}, cause) {
		t.Error("Unwrap does not reach the cause")
	}
}

func TestConstructors(t *testing.T) {
	tests := []struct {
		name string
		got  *Error
		want Error
	}{
		{"BadRequest", BadRequest("bad_json", "invalid %s", "JSON"),
			Error{Status: 400, Type: TypeInvalidRequest, Code: "bad_json", Message: "invalid JSON"}},
		{"InvalidField", InvalidField("max_tokens", "must be positive, got %d", -1),
			Error{Status: 400, Type: TypeInvalidRequest, Code: "invalid_field", Message: "must be positive, got -1", Param: "max_tokens"}},
		{"TooLarge", TooLarge(8),
			Error{Status: 413, Type: TypeInvalidRequest, Code: "request_too_large", Message: "request body too large: the limit is 8 bytes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if *tt.got != tt.want {
				t.Errorf("got %+v, want %+v", *tt.got, tt.want)
			}
		})
	}
}

func TestWrite(t *testing.T) {
	tests := []struct {
		name      string
		err       *Error
		requestID string
		status    int
		want      string // the exact body
	}{
		{
			name: "with request id and param", err: InvalidField("messages", "messages must be an array"), requestID: "req-1", status: 400,
			want: `{"error":{"message":"messages must be an array (request_id: req-1)","type":"invalid_request_error","param":"messages","code":"invalid_field","request_id":"req-1"}}` + "\n",
		},
		{
			name: "without request id or param", err: &Error{Status: 502, Type: TypeAPI, Code: "upstream_error", Message: "prefill failed: HTTP 500"}, status: 502,
			want: `{"error":{"message":"prefill failed: HTTP 500","type":"api_error","param":null,"code":"upstream_error"}}` + "\n",
		},
		{
			name: "mapped upstream 4xx hides the upstream body", err: From(&UpstreamError{Phase: "decode", Status: 422, Body: []byte("secret")}),
			requestID: "r", status: 422,
			want: `{"error":{"message":"decode rejected the request: HTTP 422 (request_id: r)","type":"invalid_request_error","param":null,"code":"upstream_rejected","request_id":"r"}}` + "\n",
		},
		{
			name: "escaping", err: BadRequest("bad", `"quoted" <tag>`), requestID: `id"1`, status: 400,
			want: `{"error":{"message":"\"quoted\" \u003ctag\u003e (request_id: id\"1)","type":"invalid_request_error","param":null,"code":"bad","request_id":"id\"1"}}` + "\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			Write(rec, tt.err, tt.requestID)
			resp := rec.Result()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tt.status || resp.Header.Get("Content-Type") != "application/json" ||
				resp.Header.Get("X-Content-Type-Options") != "nosniff" {
				t.Errorf("status %d, headers %v", resp.StatusCode, resp.Header)
			}
			if string(body) != tt.want {
				t.Errorf("body\n %s\nwant\n %s", body, tt.want)
			}
			if string(tt.err.Body(tt.requestID)) != tt.want {
				t.Errorf("Body(%q) differs from what Write sent", tt.requestID)
			}
			// What an OpenAI client parses.
			var parsed struct {
				Error struct {
					Message   string  `json:"message"`
					Type      string  `json:"type"`
					Param     *string `json:"param"`
					Code      string  `json:"code"`
					RequestID *string `json:"request_id"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &parsed); err != nil {
				t.Fatalf("body is not JSON: %v", err)
			}
			e := parsed.Error
			if e.Type != tt.err.Type || e.Code != tt.err.Code || (e.Param == nil) != (tt.err.Param == "") ||
				(e.RequestID == nil) != (tt.requestID == "") || (e.RequestID != nil && *e.RequestID != tt.requestID) {
				t.Errorf("parsed %+v", e)
			}
		})
	}
}

func TestWriteRetryAfter(t *testing.T) {
	for _, tt := range []struct {
		retryAfter time.Duration
		want       string
	}{
		{0, ""},
		{-time.Second, ""},
		{time.Millisecond, "1"},
		{time.Second, "1"},
		{1500 * time.Millisecond, "2"},
		{time.Minute, "60"},
	} {
		rec := httptest.NewRecorder()
		Write(rec, &Error{Status: 429, Type: TypeUnavailable, Code: "busy", Message: "busy", RetryAfter: tt.retryAfter}, "")
		if got := rec.Result().Header.Get("Retry-After"); got != tt.want || rec.Code != 429 {
			t.Errorf("RetryAfter %v: status %d, Retry-After %q, want %q", tt.retryAfter, rec.Code, got, tt.want)
		}
	}
}

// TestWriteAs: another format writes its own body, with the status and headers Write sends.
func TestWriteAs(t *testing.T) {
	rec := httptest.NewRecorder()
	e := &Error{Status: 503, Type: TypeUnavailable, Code: "c", Message: "busy", RetryAfter: 2 * time.Second}
	WriteAs(rec, e, "rid", func(e *Error, id string) []byte { return []byte(e.Message + "/" + id) })
	if rec.Code != 503 || rec.Body.String() != "busy/rid" || rec.Header().Get("Retry-After") != "2" || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("HTTP %d %q %v", rec.Code, rec.Body.String(), rec.Header())
	}
	rec = httptest.NewRecorder()
	WriteAs(rec, e, "rid", nil)
	if rec.Body.String() != string(e.Body("rid")) {
		t.Fatalf("nil format wrote %q", rec.Body.String())
	}
}

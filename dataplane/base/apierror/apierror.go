// Package apierror defines the errors a coordinator request can end with and writes them as
// OpenAI-style JSON: {"error":{"message","type","code"}} plus the request id. Steps create them;
// the server maps whatever a pipeline returns with From.
package apierror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// OpenAI error types.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeNotFound       = "not_found_error"
	TypeAPI            = "api_error"
	TypeUnavailable    = "service_unavailable_error"
)

// Error is a client-facing error with its HTTP status and OpenAI type and code.
type Error struct {
	// Status is the HTTP status.
	Status int
	// Type is the OpenAI error type.
	Type string
	// Code is a short machine-readable code.
	Code string
	// Message is safe to show to the client: it never carries upstream bodies.
	Message string
	// Param names the offending request field, when there is one.
	Param string
	// Cause is kept for logs only.
	Cause error
	// RetryAfter, when positive, is sent as the Retry-After header (whole seconds, at least 1).
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Cause != nil {
		return e.Message + ": " + e.Cause.Error()
	}
	return e.Message
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Cause }

// BadRequest is a 400 for invalid client input.
func BadRequest(code, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Code: code, Message: fmt.Sprintf(format, args...)}
}

// TooLarge is the 413 for a request body over limit bytes.
func TooLarge(limit int64) *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Type: TypeInvalidRequest, Code: "request_too_large",
		Message: fmt.Sprintf("request body too large: the limit is %d bytes", limit)}
}

// InvalidField is a 400 naming the request field at fault.
func InvalidField(param, format string, args ...any) *Error {
	e := BadRequest("invalid_field", format, args...)
	e.Param = param
	return e
}

// UpstreamError is a failed call to a worker (through the gateway) or to a side service.
type UpstreamError struct {
	// Phase names the leg, e.g. prefill, encode[1], render, media[0].
	Phase string
	// Status is the upstream HTTP status, 0 for a transport error.
	Status int
	// Body holds the start of the upstream body: logged, and its error message (sanitised) is
	// what the client is told of a rejection.
	Body []byte
	// ContentType is the upstream body's media type.
	ContentType string
	// RetryAfter is the upstream answer's Retry-After, 0 when absent.
	RetryAfter time.Duration
	// Err is the transport or decoding error, if any.
	Err error
}

func (e *UpstreamError) Error() string {
	switch {
	case e.Status != 0 && e.Err != nil:
		return fmt.Sprintf("%s: HTTP %d: %v", e.Phase, e.Status, e.Err)
	case e.Status != 0:
		return fmt.Sprintf("%s: HTTP %d", e.Phase, e.Status)
	default:
		return fmt.Sprintf("%s: %v", e.Phase, e.Err)
	}
}

// Unwrap returns the transport or decoding error.
func (e *UpstreamError) Unwrap() error { return e.Err }

// More OpenAI error types, for what a worker or the gateway answered.
const (
	TypeRateLimit = "rate_limit_error"
	TypeTimeout   = "timeout_error"
)

// From maps any pipeline error to the client-facing error: an *Error as is; a worker's
// rejection (4xx) with its own status and its own message (Sanitize'd; it names the phase when
// the worker gave none); a 429 or 503 that survived the retries with its status and
// Retry-After (their messages say what the llm-d endpoint picker means by them: 429, no ready
// pod for the profile; 503, an empty pool; a worker's own message is kept); a 504 as 504; a cancelled request as 499 (nobody reads it); everything else as
// 502.
func From(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	var up *UpstreamError
	isUp := errors.As(err, &up)
	switch {
	case isUp && up.Status == http.StatusTooManyRequests:
		return &Error{Status: up.Status, Type: TypeRateLimit, Code: "rate_limit_exceeded", Cause: err, RetryAfter: up.RetryAfter,
			Message: up.message(fmt.Sprintf("%s: no endpoint can take the request now (HTTP 429: the endpoint picker found no ready pod for the profile, or the pod is saturated)", up.Phase))}
	case isUp && up.Status >= 400 && up.Status < 500:
		return &Error{Status: up.Status, Type: TypeInvalidRequest, Code: "upstream_rejected", Cause: err, Param: up.param(),
			Message: up.message(fmt.Sprintf("%s rejected the request: HTTP %d", up.Phase, up.Status))}
	case isUp && up.Status == http.StatusServiceUnavailable:
		return &Error{Status: up.Status, Type: TypeUnavailable, Code: "upstream_unavailable", Cause: err, RetryAfter: max(up.RetryAfter, time.Second),
			Message: fmt.Sprintf("%s: no endpoint served the request (HTTP 503: the pool has no endpoint, or the one picked could not be reached)", up.Phase)}
	case isUp && up.Status == http.StatusGatewayTimeout:
		return &Error{Status: up.Status, Type: TypeTimeout, Code: "upstream_timeout", Cause: err,
			Message: fmt.Sprintf("%s timed out: HTTP 504", up.Phase)}
	case errors.Is(err, context.Canceled):
		return &Error{Status: 499, Type: TypeInvalidRequest, Code: "client_closed_request", Message: "client closed the request", Cause: err}
	}
	msg := "upstream error"
	if isUp {
		msg = up.Phase + " failed"
		if up.Status != 0 {
			msg = fmt.Sprintf("%s failed: HTTP %d", up.Phase, up.Status)
		}
	}
	return &Error{Status: http.StatusBadGateway, Type: TypeAPI, Code: "upstream_error", Message: msg, Cause: err}
}

// workerError is the error body of vLLM, SGLang and OpenAI-compatible servers
// ({"error":{"message","param"}}), or FastAPI's {"detail": "..."}, or a bare {"message"}.
type workerError struct {
	Error *struct {
		Message string          `json:"message"`
		Param   json.RawMessage `json:"param"`
	} `json:"error"`
	Detail  json.RawMessage `json:"detail"`
	Message string          `json:"message"`
}

func (e *UpstreamError) decode() (workerError, bool) {
	var w workerError
	if len(e.Body) == 0 || json.Unmarshal(e.Body, &w) != nil {
		return w, false
	}
	return w, true
}

// message is the worker's own error message, sanitised, or fallback when it sent none (or
// not as JSON).
func (e *UpstreamError) message(fallback string) string {
	w, ok := e.decode()
	if !ok {
		return fallback
	}
	var msg string
	switch {
	case w.Error != nil:
		msg = w.Error.Message
	case len(w.Detail) > 0:
		if err := json.Unmarshal(w.Detail, &msg); err != nil {
			msg = string(w.Detail) // pydantic's list of validation errors
		}
	default:
		msg = w.Message
	}
	if msg = Sanitize(msg); msg == "" {
		return fallback
	}
	return msg
}

// param is the request field the worker named, when it named one.
func (e *UpstreamError) param() string {
	w, ok := e.decode()
	if !ok || w.Error == nil {
		return ""
	}
	var p string
	if json.Unmarshal(w.Error.Param, &p) != nil {
		return ""
	}
	return Sanitize(p)
}

// MaxMessageLen bounds a forwarded worker message, in bytes.
const MaxMessageLen = 1024

var (
	// URLs, then IPv6 and IPv4 addresses (with a port or zone), then host:port pairs.
	urlPattern      = regexp.MustCompile(`(?i)\b[a-z][a-z0-9+.-]*://[^\s"'<>]*`)
	ipv6Pattern     = regexp.MustCompile(`\[?\b(?:[0-9a-fA-F]{0,4}:){2,7}[0-9a-fA-F]{0,4}(?:%[0-9A-Za-z._-]+)?\]?(?::\d{1,5})?`)
	ipv4Pattern     = regexp.MustCompile(`\b(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?\b`)
	hostPortPattern = regexp.MustCompile(`\b[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*:\d{2,5}\b`)
)

// Sanitize makes a worker's message safe to show to a client: URLs, IP addresses and host:port
// pairs (pods, side channels, the gateway) become "<redacted>", control characters and invalid
// UTF-8 are dropped, and the result is at most MaxMessageLen bytes.
func Sanitize(msg string) string {
	msg = strings.ToValidUTF8(msg, "")
	msg = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\t' {
			return ' '
		}
		if unicode.IsControl(r) {
			return -1
		}
		return r
	}, msg)
	for _, re := range []*regexp.Regexp{urlPattern, ipv6Pattern, ipv4Pattern, hostPortPattern} {
		msg = re.ReplaceAllString(msg, "<redacted>")
	}
	msg = strings.TrimSpace(msg)
	if len(msg) > MaxMessageLen {
		cut := MaxMessageLen
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut]
	}
	return msg
}

type wireError struct {
	Message   string  `json:"message"`
	Type      string  `json:"type"`
	Param     *string `json:"param"`
	Code      string  `json:"code"`
	RequestID string  `json:"request_id,omitempty"`
}

// Body encodes e as the OpenAI error JSON. The request id is appended to the message and given as
// its own field.
func (e *Error) Body(requestID string) []byte {
	w := wireError{Message: e.Message, Type: e.Type, Code: e.Code, RequestID: requestID}
	if requestID != "" {
		w.Message += " (request_id: " + requestID + ")"
	}
	if e.Param != "" {
		w.Param = &e.Param
	}
	b, _ := json.Marshal(struct {
		Error wireError `json:"error"`
	}{w})
	return append(b, '\n')
}

// Format encodes an error as a response body; Error.Body is the OpenAI one. A route whose
// clients speak another API's errors has its own (anthropic.ErrorBody).
type Format func(e *Error, requestID string) []byte

// Write sends e as the response, as OpenAI JSON.
func Write(w http.ResponseWriter, e *Error, requestID string) { WriteAs(w, e, requestID, nil) }

// WriteAs sends e as the response with its body encoded by format (nil: OpenAI JSON).
func WriteAs(w http.ResponseWriter, e *Error, requestID string, format Format) {
	if format == nil {
		format = (*Error).Body
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(max(1, int64(math.Ceil(e.RetryAfter.Seconds()))), 10))
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(format(e, requestID))
}

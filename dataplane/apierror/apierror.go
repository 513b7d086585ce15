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
	"strconv"
	"time"
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
	// Body holds the start of the upstream body, for logs only.
	Body []byte
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

// From maps any pipeline error to the client-facing error: an *Error as is, an upstream 4xx with
// its own status, a cancelled request as 499 (nobody reads it), everything else as 502.
func From(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	var up *UpstreamError
	if errors.As(err, &up) && up.Status >= 400 && up.Status < 500 {
		return &Error{
			Status:  up.Status,
			Type:    TypeInvalidRequest,
			Code:    "upstream_rejected",
			Message: fmt.Sprintf("%s rejected the request: HTTP %d", up.Phase, up.Status),
			Cause:   err,
		}
	}
	if errors.Is(err, context.Canceled) {
		return &Error{Status: 499, Type: TypeInvalidRequest, Code: "client_closed_request", Message: "client closed the request", Cause: err}
	}
	msg := "upstream error"
	if errors.As(err, &up) {
		msg = up.Phase + " failed"
		if up.Status != 0 {
			msg = fmt.Sprintf("%s failed: HTTP %d", up.Phase, up.Status)
		}
	}
	return &Error{Status: http.StatusBadGateway, Type: TypeAPI, Code: "upstream_error", Message: msg, Cause: err}
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

// Write sends e as the response.
func Write(w http.ResponseWriter, e *Error, requestID string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(max(1, int64(math.Ceil(e.RetryAfter.Seconds()))), 10))
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(e.Body(requestID))
}

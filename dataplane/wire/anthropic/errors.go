package anthropic

import (
	"encoding/json"
	"net/http"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
)

// Anthropic error types.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypePermission     = "permission_error"
	TypeNotFound       = "not_found_error"
	TypeTooLarge       = "request_too_large"
	TypeRateLimit      = "rate_limit_error"
	TypeAPI            = "api_error"
	TypeTimeout        = "timeout_error"
	TypeOverloaded     = "overloaded_error"
)

// StatusOverloaded is Anthropic's own status for an overloaded API; the coordinator keeps its
// 503 and names it with TypeOverloaded.
const StatusOverloaded = 529

// ErrorType is the Anthropic error type of an HTTP status.
func ErrorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return TypeAuthentication
	case http.StatusForbidden:
		return TypePermission
	case http.StatusNotFound:
		return TypeNotFound
	case http.StatusRequestEntityTooLarge:
		return TypeTooLarge
	case http.StatusTooManyRequests:
		return TypeRateLimit
	case http.StatusServiceUnavailable, StatusOverloaded:
		return TypeOverloaded
	case http.StatusGatewayTimeout:
		return TypeTimeout
	}
	if status >= 500 {
		return TypeAPI
	}
	return TypeInvalidRequest
}

type wireError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
	RequestID string `json:"request_id,omitempty"`
}

// errorJSON is the Anthropic error document.
func errorJSON(typ, message, requestID string) []byte {
	w := wireError{Type: "error", RequestID: requestID}
	w.Error.Type, w.Error.Message = typ, message
	b, _ := json.Marshal(w)
	return b
}

// ErrorBody encodes e in Anthropic's error shape, {"type":"error","error":{"type","message"},
// "request_id"}, the type following e's status (an apierror.Format).
func ErrorBody(e *apierror.Error, requestID string) []byte {
	return append(errorJSON(ErrorType(e.Status), e.Message, requestID), '\n')
}

// errorEvent is an Anthropic stream error event.
func errorEvent(dst []byte, typ, message, requestID string) []byte {
	dst = append(dst, "event: error\ndata: "...)
	dst = append(dst, errorJSON(typ, message, requestID)...)
	return append(dst, "\n\n"...)
}

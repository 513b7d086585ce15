package redisbroker

import (
	"encoding/json"
	"net/http"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
)

// OpenAI error types and statuses of async answers that apierror has no constant for.
const (
	TypeTimeout   = "timeout_error"
	TypeRateLimit = "rate_limit_error"
	TypeCancelled = "cancelled"
	// StatusClientClosed (nginx's 499) answers a cancelled request.
	StatusClientClosed = 499
)

// mapResult turns a stored result into the client's answer: an HTTP result is replayed with its
// own status and its payload verbatim as application/json; an error result becomes an OpenAI
// error (GATE_DROPPED 429, DEADLINE_EXCEEDED 504, INVALID_REQUEST 400, CANCELLED 499, any other
// code 502). A result that is not valid JSON, has a status outside 200-599, or carries neither
// a status nor an error code is a 502 MALFORMED_RESULT.
func mapResult(raw string) (status int, body []byte, e *apierror.Error) {
	var r Result
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		return 0, nil, malformed("the stored result is not valid JSON")
	}
	if r.StatusCode != 0 {
		if r.StatusCode < 200 || r.StatusCode > 599 {
			return 0, nil, malformed("the stored result has an invalid HTTP status")
		}
		return r.StatusCode, []byte(r.Payload), nil
	}
	msg := r.ErrorMessage
	switch r.ErrorCode {
	case "":
		return 0, nil, malformed("the stored result has neither an HTTP status nor an error code")
	case ErrCodeGateDropped:
		return 0, nil, resultError(http.StatusTooManyRequests, TypeRateLimit, r.ErrorCode, msg, "the broker dropped the request (capacity); retry later")
	case ErrCodeDeadlineExceeded:
		return 0, nil, resultError(http.StatusGatewayTimeout, TypeTimeout, r.ErrorCode, msg, "the request did not complete before its deadline")
	case ErrCodeInvalidRequest:
		return 0, nil, resultError(http.StatusBadRequest, apierror.TypeInvalidRequest, r.ErrorCode, msg, "the broker rejected the request")
	case ErrCodeCancelled:
		return 0, nil, resultError(StatusClientClosed, TypeCancelled, r.ErrorCode, msg, "the request was cancelled")
	default:
		return 0, nil, resultError(http.StatusBadGateway, apierror.TypeAPI, truncate(r.ErrorCode, 64), msg, "the request failed in the broker")
	}
}

func resultError(status int, typ, code, msg, def string) *apierror.Error {
	if msg == "" {
		msg = def
	}
	return &apierror.Error{Status: status, Type: typ, Code: code, Message: truncate(msg, 1024)}
}

func malformed(msg string) *apierror.Error {
	return &apierror.Error{Status: http.StatusBadGateway, Type: apierror.TypeAPI, Code: "MALFORMED_RESULT", Message: msg}
}

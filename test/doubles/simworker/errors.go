package simworker

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// apiError is an error answered to the client with a vLLM-style body.
type apiError struct {
	status int
	msg    string
	param  string // the request field at fault, when vLLM names one
}

// Error implements error.
func (e *apiError) Error() string { return e.msg }

// badRequest returns a 400 apiError with a formatted message.
func badRequest(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

// errorType names the vLLM error type of an HTTP status.
func errorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusPreconditionFailed:
		return "PreconditionFailedError"
	case http.StatusRequestEntityTooLarge:
		return "RequestEntityTooLargeError"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	default:
		if status >= 500 {
			return "InternalServerError"
		}
		return "Error"
	}
}

// ErrorBody is the JSON body of every error a Worker answers.
type ErrorBody struct {
	Error ErrorInfo `json:"error"`
}

// ErrorInfo describes one error, the way vLLM does.
type ErrorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// writeError answers status with a vLLM-style error body.
func writeError(rw http.ResponseWriter, status int, msg string) {
	writeAPIError(rw, &apiError{status: status, msg: msg})
}

// writeAPIError answers err.
func writeAPIError(rw http.ResponseWriter, err *apiError) {
	info := ErrorInfo{Message: err.msg, Type: errorType(err.status), Code: err.status}
	if err.param != "" {
		info.Param = &err.param
	}
	writeJSON(rw, err.status, ErrorBody{Error: info})
}

// writeJSON answers status with v encoded as JSON.
func writeJSON(rw http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"message":"cannot encode response","type":"InternalServerError","param":null,"code":500}}`)
	}
	writeBody(rw, status, b)
}

// writeBody answers status with b, a JSON document.
func writeBody(rw http.ResponseWriter, status int, b []byte) {
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(status)
	_, _ = rw.Write(b)
}

// appendMarshaled appends v encoded by encoding/json (small values only:
// strings, maps of raw values, which always encode).
func appendMarshaled(dst []byte, v any) []byte {
	b, _ := json.Marshal(v)
	return append(dst, b...)
}

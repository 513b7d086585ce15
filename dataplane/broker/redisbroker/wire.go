package redisbroker

import (
	"encoding/json"
	"strings"
)

// Redis key names shared with the consumer (docs/async-broker.md). The request queue is a sorted
// set named by routes/default_queue (default broker.DefaultQueue); everything else is keyed by
// tenant and request id.
const (
	// ResultKeyPrefix starts a request's mailbox: results:req:<tenant>:<id>, a list whose head
	// (LINDEX 0) is the result.
	ResultKeyPrefix = "results:req:"
	// ActiveKeyPrefix starts the live-generation marker: request-active:<tenant>:<id> holds the
	// request token of the copy that may run.
	ActiveKeyPrefix = "request-active:"
	// CancelKeyPrefix starts the cancellation marker: request-cancel:<tenant>:<id> holds the
	// token of the cancelled copy.
	CancelKeyPrefix = "request-cancel:"
)

// RequestKindPlain is the envelope's request_kind (llm-d-async's tagged envelope).
const RequestKindPlain = "plain"

// Result error codes (llm-d-async ResultMessage.error_code).
const (
	ErrCodeDeadlineExceeded = "DEADLINE_EXCEEDED"
	ErrCodeCancelled        = "CANCELLED"
	ErrCodeGateDropped      = "GATE_DROPPED"
	ErrCodeGateError        = "GATE_ERROR"
	ErrCodeInferenceError   = "INFERENCE_ERROR"
	ErrCodeInvalidRequest   = "INVALID_REQUEST"
)

// EnvelopeID is the id a queued request carries: <tenant>:<id>.
func EnvelopeID(tenant, id string) string { return tenant + ":" + id }

// SplitEnvelopeID splits <tenant>:<id> at the first colon (tenants never contain one).
func SplitEnvelopeID(envID string) (tenant, id string, ok bool) {
	return strings.Cut(envID, ":")
}

// ResultKey is the mailbox of a request: results:req:<tenant>:<id>.
func ResultKey(tenant, id string) string { return ResultKeyPrefix + tenant + ":" + id }

// ActiveKey is the live-generation marker of an envelope id.
func ActiveKey(envID string) string { return ActiveKeyPrefix + envID }

// CancelKey is the cancellation marker of an envelope id.
func CancelKey(envID string) string { return CancelKeyPrefix + envID }

// Message is the caller-visible part of a queued request (llm-d-async RequestMessage).
type Message struct {
	// ID is <tenant>:<id>.
	ID string `json:"id"`
	// Created and Deadline are Unix seconds. A consumer must not start the request at or after
	// Deadline, and must abandon it (DEADLINE_EXCEEDED) when the deadline passes.
	Created  int64 `json:"created"`
	Deadline int64 `json:"deadline"`
	// Payload is the client's JSON body, verbatim.
	Payload json.RawMessage `json:"payload"`
	// Metadata carries the tenant under the quota attribute (default userid) and, when the
	// client sent one, the W3C traceparent.
	Metadata map[string]string `json:"metadata,omitempty"`
	// Headers are the client headers named by forward_headers (lower-case names).
	Headers map[string]string `json:"headers,omitempty"`
	// Endpoint is the client's path, e.g. /v1/chat/completions.
	Endpoint string `json:"endpoint,omitempty"`
}

// Routing is the infrastructure part of the envelope (llm-d-async InternalRouting).
type Routing struct {
	RequestQueueName string `json:"request_queue_name,omitempty"`
	ResultQueueName  string `json:"result_queue_name,omitempty"`
	// RequestToken identifies this copy of the request: it runs only while the active marker
	// holds the same token, and is cancelled when the cancel marker does.
	RequestToken string `json:"request_token,omitempty"`
}

// Envelope is one member of the request sorted set (scored by Message.Deadline).
type Envelope struct {
	Internal    Routing `json:"internal"`
	RequestKind string  `json:"request_kind"`
	Data        Message `json:"data"`
}

// Result is what a consumer pushes onto the mailbox (llm-d-async ResultMessage). StatusCode > 0
// means an HTTP answer whose body is Payload; otherwise ErrorCode says why there is none.
type Result struct {
	ID           string `json:"id"`
	StatusCode   int    `json:"status_code,omitempty"`
	Payload      string `json:"payload"`
	ErrorCode    string `json:"error_code,omitempty"`
	ErrorMessage string `json:"error_message,omitempty"`
}

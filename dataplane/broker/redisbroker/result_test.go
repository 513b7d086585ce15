package redisbroker

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestMapResult(t *testing.T) {
	for _, tc := range []struct {
		name         string
		raw          string
		status       int
		body         string
		errType      string
		errCode      string
		errMsgSubstr string
	}{
		{name: "http 200", raw: `{"id":"t:1","status_code":200,"payload":"{\"ok\":true}"}`, status: 200, body: `{"ok":true}`},
		{name: "http 400 replayed", raw: `{"id":"t:1","status_code":400,"payload":"{\"error\":{}}"}`, status: 400, body: `{"error":{}}`},
		{name: "http 503 replayed", raw: `{"id":"t:1","status_code":503,"payload":"busy"}`, status: 503, body: `busy`},
		{name: "empty payload", raw: `{"id":"t:1","status_code":204,"payload":""}`, status: 204, body: ``},
		{name: "status too high", raw: `{"id":"t:1","status_code":600,"payload":"x"}`, status: 502, errType: "api_error", errCode: "MALFORMED_RESULT"},
		{name: "informational status", raw: `{"id":"t:1","status_code":100,"payload":"x"}`, status: 502, errType: "api_error", errCode: "MALFORMED_RESULT"},
		{name: "negative status", raw: `{"id":"t:1","status_code":-1,"payload":"x"}`, status: 502, errType: "api_error", errCode: "MALFORMED_RESULT"},
		{name: "status as string", raw: `{"id":"t:1","status_code":"200","payload":"x"}`, status: 502, errType: "api_error", errCode: "MALFORMED_RESULT"},
		{name: "not json", raw: `OK`, status: 502, errType: "api_error", errCode: "MALFORMED_RESULT"},
		{name: "neither status nor code", raw: `{"id":"t:1","payload":"x"}`, status: 502, errType: "api_error", errCode: "MALFORMED_RESULT"},
		{name: "gate dropped", raw: `{"id":"t:1","payload":"","error_code":"GATE_DROPPED","error_message":"Pool gating dropped request"}`, status: 429, errType: "rate_limit_error", errCode: "GATE_DROPPED", errMsgSubstr: "Pool gating"},
		{name: "deadline", raw: `{"id":"t:1","payload":"","error_code":"DEADLINE_EXCEEDED"}`, status: 504, errType: "timeout_error", errCode: "DEADLINE_EXCEEDED", errMsgSubstr: "deadline"},
		{name: "invalid", raw: `{"id":"t:1","payload":"","error_code":"INVALID_REQUEST","error_message":"bad body"}`, status: 400, errType: "invalid_request_error", errCode: "INVALID_REQUEST", errMsgSubstr: "bad body"},
		{name: "cancelled", raw: `{"id":"t:1","payload":"","error_code":"CANCELLED"}`, status: 499, errType: "cancelled", errCode: "CANCELLED"},
		{name: "inference error", raw: `{"id":"t:1","payload":"","error_code":"INFERENCE_ERROR","error_message":"connection refused"}`, status: 502, errType: "api_error", errCode: "INFERENCE_ERROR", errMsgSubstr: "refused"},
		{name: "unknown code", raw: `{"id":"t:1","payload":"","error_code":"SOMETHING_NEW"}`, status: 502, errType: "api_error", errCode: "SOMETHING_NEW"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body, e := mapResult(tc.raw)
			if tc.errCode == "" {
				if e != nil {
					t.Fatalf("error %v, want status %d", e, tc.status)
				}
				if status != tc.status || string(body) != tc.body {
					t.Fatalf("= %d %q, want %d %q", status, body, tc.status, tc.body)
				}
				return
			}
			if e == nil {
				t.Fatalf("= %d %q, want error %s", status, body, tc.errCode)
			}
			if e.Status != tc.status || e.Type != tc.errType || e.Code != tc.errCode {
				t.Fatalf("error = %d %s %s, want %d %s %s", e.Status, e.Type, e.Code, tc.status, tc.errType, tc.errCode)
			}
			var wire struct {
				Error struct{ Message, Type, Code string }
			}
			if err := json.Unmarshal(e.Body("rid"), &wire); err != nil || wire.Error.Code != tc.errCode {
				t.Fatalf("wire body %s (%v)", e.Body("rid"), err)
			}
			if tc.errMsgSubstr != "" && !strings.Contains(wire.Error.Message, tc.errMsgSubstr) {
				t.Fatalf("message %q does not mention %q", wire.Error.Message, tc.errMsgSubstr)
			}
		})
	}
}

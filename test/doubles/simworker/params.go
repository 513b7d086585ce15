package simworker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
)

// NixlKVParams is the kv_transfer_params a kv-nixl prefill worker answers and
// a kv-nixl decode worker expects (vLLM NixlConnector wire format).
type NixlKVParams struct {
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	RemoteBlockIDs  [][]int `json:"remote_block_ids"`
	RemoteEngineID  string  `json:"remote_engine_id"`
	RemoteRequestID string  `json:"remote_request_id"`
	RemoteHost      string  `json:"remote_host"`
	RemotePort      int     `json:"remote_port"`
	TPSize          int     `json:"tp_size"`
	RemoteNumTokens int     `json:"remote_num_tokens"`
	// RemoteDPRank is the data-parallel rank the prefill ran on: the worker
	// has no ranks and echoes the prefill leg's X-Data-Parallel-Rank (absent
	// without one).
	RemoteDPRank *int `json:"remote_dp_rank,omitempty"`
}

// SGLangKVParams is the kv_transfer_params a kv-sglang prefill worker answers.
type SGLangKVParams struct {
	BootstrapHost string `json:"bootstrap_host"`
	BootstrapPort int    `json:"bootstrap_port"`
	BootstrapRoom string `json:"bootstrap_room"`
}

// KVHandle is what a kv-nixl prefill worker serves at GET /kv/{remote_request_id}
// until a decode has pulled it (then 410 Gone).
type KVHandle struct {
	RemoteRequestID string  `json:"remote_request_id"`
	RemoteEngineID  string  `json:"remote_engine_id"`
	RemoteBlockIDs  [][]int `json:"remote_block_ids"`
	PromptKey       string  `json:"prompt_key"`
	NumTokens       int     `json:"num_tokens"`
}

// ECDescriptor is one entry of ec_transfer_params (keyed by mm_hash), as an
// ec-nixl encode worker answers it and serves it at GET /ec/{mm_hash}.
type ECDescriptor struct {
	PeerHost             string `json:"peer_host"`
	PeerPort             int    `json:"peer_port"`
	SizeBytes            int    `json:"size_bytes"`
	NixlAgentMetadataB64 string `json:"nixl_agent_metadata_b64"`
}

// rawParams is a decoded-on-demand JSON object such as kv_transfer_params.
// A JSON null decodes to a nil map.
type rawParams map[string]json.RawMessage

// isNull reports whether a raw JSON value is absent or null.
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// boolean returns the boolean at key; absent or null is false.
func (p rawParams) boolean(name, key string) (bool, error) {
	raw, ok := p[key]
	if !ok || isNull(raw) {
		return false, nil
	}
	var v bool
	if err := json.Unmarshal(raw, &v); err != nil {
		return false, fmt.Errorf("%s.%s must be a boolean", name, key)
	}
	return v, nil
}

// str returns the string at key and whether it was present and non-null.
func (p rawParams) str(name, key string) (string, bool, error) {
	raw, ok := p[key]
	if !ok || isNull(raw) {
		return "", false, nil
	}
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", true, fmt.Errorf("%s.%s must be a string", name, key)
	}
	return v, true, nil
}

// integer returns the integer at key and whether it was present and non-null.
func (p rawParams) integer(name, key string) (int, bool, error) {
	raw, ok := p[key]
	if !ok || isNull(raw) {
		return 0, false, nil
	}
	var v int
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0, true, fmt.Errorf("%s.%s must be an integer", name, key)
	}
	return v, true, nil
}

// requireString returns the non-empty string at key.
func (p rawParams) requireString(name, key string) (string, error) {
	v, ok, err := p.str(name, key)
	if err != nil {
		return "", err
	}
	if !ok || v == "" {
		return "", fmt.Errorf("missing %s.%s", name, key)
	}
	return v, nil
}

// requirePort returns the TCP port at key.
func (p rawParams) requirePort(name, key string) (int, error) {
	v, ok, err := p.integer(name, key)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("missing %s.%s", name, key)
	}
	if v < 1 || v > 65535 {
		return 0, fmt.Errorf("%s.%s %d is not a valid port", name, key, v)
	}
	return v, nil
}

// safeNamePattern matches names usable as a single file-name component.
var safeNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// validHash reports whether an mm_hash is safe to use as a file name and URL
// path segment.
func validHash(h string) bool {
	return len(h) <= 255 && safeNamePattern.MatchString(h)
}

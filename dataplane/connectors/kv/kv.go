// Package kv implements the KV-cache transfer protocols: the kv_transfer_params a prefill leg
// carries and how the decode leg's params derive from the prefill worker's answer. The wire shapes
// match the upstream coordinator (llm-d) and the vLLM / SGLang connectors they drive.
package kv

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/epd-dev/coordinator/dataplane/state/body"
)

// Connector names.
const (
	NIXL          = "kv-nixl"
	SGLang        = "kv-sglang"
	SharedStorage = "kv-shared-storage"
)

// SGLangBootstrapPortEnv overrides the bootstrap port advertised to SGLang prefill workers.
const SGLangBootstrapPortEnv = "SGLANG_BOOTSTRAP_PORT"

// DefaultSGLangBootstrapPort is SGLang's own default.
const DefaultSGLangBootstrapPort = 8998

// Connector is one KV transfer protocol. Params are raw JSON objects: the prefill worker's answer
// (for NIXL, thousands of block ids on a long prompt) is passed to decode without being decoded
// into maps and encoded again; only the two flags are rewritten.
type Connector interface {
	// Name is the configuration name, e.g. kv-nixl.
	Name() string
	// PrefillParams returns the kv_transfer_params of a prefill leg (fresh bytes per call).
	PrefillParams() json.RawMessage
	// DecodeParams returns the kv_transfer_params of the decode leg that follows a prefill whose
	// answer carried fromPrefill (nil when it carried no object). fromPrefill must be a value
	// taken from a validated answer (body.Parse): it is not validated again.
	DecodeParams(fromPrefill json.RawMessage) (json.RawMessage, error)
}

// Names lists the known connectors.
func Names() []string {
	n := []string{NIXL, SGLang, SharedStorage}
	sort.Strings(n)
	return n
}

// New returns the connector called name. getenv (os.Getenv when nil) supplies
// SGLANG_BOOTSTRAP_PORT; an invalid port is an error rather than a silent fallback.
func New(name string, getenv func(string) string) (Connector, error) {
	switch name {
	case NIXL:
		return nixl{}, nil
	case SharedStorage:
		return sharedStorage{}, nil
	case SGLang:
		if getenv == nil {
			getenv = os.Getenv
		}
		port, err := bootstrapPort(getenv(SGLangBootstrapPortEnv))
		if err != nil {
			return nil, err
		}
		return sglang{port: port}, nil
	}
	return nil, fmt.Errorf("unknown KV connector %q (known: %s)", name, strings.Join(Names(), ", "))
}

func bootstrapPort(v string) (int, error) {
	if v == "" {
		return DefaultSGLangBootstrapPort, nil
	}
	p, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || p < 1 || p > 65535 {
		return 0, fmt.Errorf("%s=%q is not a port number (1-65535)", SGLangBootstrapPortEnv, v)
	}
	return p, nil
}

var (
	jsonTrue  = json.RawMessage("true")
	jsonFalse = json.RawMessage("false")
	// decodeFlags are the params of a decode leg whose prefill answered none.
	decodeFlags = `{"do_remote_decode":false,"do_remote_prefill":true}`
)

// decodeFrom copies the prefill worker's params and marks them for a remote-prefilled decode:
// do_remote_decode=false and do_remote_prefill=true overwritten (appended when absent).
// fromPrefill is split without being validated again: the prefill step validated the whole
// answer it was taken from, and with a long prompt it is tens of KB of block ids (24 KB at
// 256 KiB of text, whose second validation was ~0.5M instructions a request, issue 34).
func decodeFrom(fromPrefill json.RawMessage) (json.RawMessage, error) {
	if body.KindOf(fromPrefill) != body.KindObject {
		return json.RawMessage(decodeFlags), nil
	}
	o, err := body.ParseNested(fromPrefill)
	if err != nil {
		return nil, fmt.Errorf("kv_transfer_params: %w", err)
	}
	o.Set("do_remote_decode", jsonFalse)
	o.Set("do_remote_prefill", jsonTrue)
	return o.Bytes(), nil
}

// nixl is vLLM's NixlConnector: prefill keeps the KV blocks for a remote decode, which pulls them
// over RDMA using the engine id, block ids, host and port the prefill worker returned.
type nixl struct{}

func (nixl) Name() string { return NIXL }

func (nixl) PrefillParams() json.RawMessage {
	return json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_block_ids":null,"remote_engine_id":null,"remote_host":null,"remote_port":null}`)
}

func (nixl) DecodeParams(fromPrefill json.RawMessage) (json.RawMessage, error) {
	return decodeFrom(fromPrefill)
}

// sglang is SGLang's bootstrap protocol: prefill gets a bootstrap port and a fresh room; the
// worker's answer names the bootstrap host the decode side connects to.
type sglang struct{ port int }

func (sglang) Name() string { return SGLang }

func (s sglang) PrefillParams() json.RawMessage {
	return json.RawMessage(`{"bootstrap_port":` + strconv.Itoa(s.port) + `,"bootstrap_room":"` + uuid.NewString() +
		`","do_remote_decode":true,"do_remote_prefill":false}`)
}

func (sglang) DecodeParams(fromPrefill json.RawMessage) (json.RawMessage, error) {
	return decodeFrom(fromPrefill)
}

// sharedStorage is a shared filesystem or object store: prefill writes the KV, decode reads it;
// nothing but the two flags is on the wire and the prefill answer is ignored.
type sharedStorage struct{}

func (sharedStorage) Name() string { return SharedStorage }

func (sharedStorage) PrefillParams() json.RawMessage {
	return json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false}`)
}

func (sharedStorage) DecodeParams(json.RawMessage) (json.RawMessage, error) {
	return json.RawMessage(decodeFlags), nil
}

// Bootstrap is SGLang's own transfer rendezvous, which upstream's prefill-decode step sends at
// the top level of both legs in place of kv_transfer_params: the decode worker joins room Room
// on the prefill worker's bootstrap server at Host:Port while the prefill waits for it.
type Bootstrap struct {
	Host string
	Port int
	Room int64
}

// BootstrapPort returns the bootstrap port kv-sglang advertises (SGLANG_BOOTSTRAP_PORT); ok is
// false when c is not kv-sglang.
func BootstrapPort(c Connector) (port int, ok bool) {
	s, ok := c.(sglang)
	return s.port, ok
}

// sglangRankFields are client body fields that pin SGLang data-parallel ranks: they would
// route one leg of the pair to a rank the other does not use.
var sglangRankFields = []string{"routed_dp_rank", "data_parallel_rank", "disagg_prefill_dp_rank"}

// Apply sets bootstrap_host, bootstrap_port and bootstrap_room on o and removes the client's
// data-parallel rank fields and kv_transfer_params (the bootstrap replaces them).
func (b Bootstrap) Apply(o *body.Object) {
	for _, k := range sglangRankFields {
		o.Delete(k)
	}
	o.Delete("kv_transfer_params")
	host, _ := json.Marshal(b.Host)
	o.Set("bootstrap_host", host)
	o.Set("bootstrap_port", json.RawMessage(strconv.Itoa(b.Port)))
	o.Set("bootstrap_room", json.RawMessage(strconv.FormatInt(b.Room, 10)))
}

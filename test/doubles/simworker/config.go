package simworker

import (
	"errors"
	"fmt"
	"time"
)

// Role selects which disaggregation legs a Worker serves.
type Role string

// The roles a Worker can play.
const (
	// RolePrefill accepts only prefill legs (kv_transfer_params.do_remote_decode=true).
	RolePrefill Role = "prefill"
	// RoleDecode accepts everything except prefill legs.
	RoleDecode Role = "decode"
	// RoleBoth accepts every leg: prefill legs like RolePrefill, the rest like RoleDecode.
	RoleBoth Role = "both"
	// RoleEncode accepts only encode legs (one media item plus its rendered tokens).
	RoleEncode Role = "encode"
)

// KVConnector selects how KV caches move from prefill to decode workers.
type KVConnector string

// The supported KV connectors.
const (
	// KVNixl mimics vLLM's NixlConnector: remote block ids plus a handle that
	// the decode worker looks up on the prefill worker.
	KVNixl KVConnector = "kv-nixl"
	// KVSGLang mimics SGLang's bootstrap-server protocol.
	KVSGLang KVConnector = "kv-sglang"
	// KVSharedStorage mimics vLLM's SharedStorageConnector: files in KVDir.
	KVSharedStorage KVConnector = "kv-shared-storage"
	// KVAuto infers the protocol of each request from its kv_transfer_params, like a vLLM
	// worker configured with a MultiConnector: bootstrap_room means SGLang, the remote_* keys
	// NIXL, bare flags shared storage (which needs KVDir). It lets one pool follow a coordinator
	// whose connector changes.
	KVAuto KVConnector = "kv-auto"
)

// ECConnector selects how encoder caches move from encode to prefill workers.
type ECConnector string

// The supported EC connectors.
const (
	// ECNixl publishes per-item descriptors that consumers look up on the
	// encode worker.
	ECNixl ECConnector = "ec-nixl"
	// ECSharedStorage writes one file per media item hash into ECDir.
	ECSharedStorage ECConnector = "ec-shared-storage"
)

// Defaults applied by New for zero Config fields.
const (
	DefaultModelName = "sim-model"
	DefaultMaxTokens = 16
	DefaultCacheSize = 1024
)

// Config configures a Worker. The zero value is a usable "both" worker with
// the NIXL connectors.
type Config struct {
	// Name identifies the worker in logs, engine ids and shared-storage files.
	// Default: "simworker-<role>".
	Name string
	// Role is the disaggregation role. Default: RoleBoth.
	Role Role
	// KVConnector is the KV transfer protocol. Default: KVNixl.
	KVConnector KVConnector
	// ECConnector is the encoder-cache transfer protocol. Default: ECNixl.
	ECConnector ECConnector
	// KVDir is the shared directory of KVSharedStorage (required by the
	// prefill, decode and both roles with that connector).
	KVDir string
	// ECDir is the shared directory of ECSharedStorage (required by the
	// encode, prefill and both roles with that connector).
	ECDir string
	// TTFT is the delay before the first generated token.
	TTFT time.Duration
	// ITL is the delay between two generated tokens. A response of n tokens
	// takes TTFT + (n-1)*ITL, streamed or not.
	ITL time.Duration
	// DefaultMaxTokens is the completion length when a request sets none.
	// Default: 16.
	DefaultMaxTokens int
	// CacheSize is the capacity of the LRU prefix cache, in prompts.
	// Default: 1024.
	CacheSize int
	// ModelName is the model served: listed by /v1/models and named in every
	// inference answer. An inference request naming another model is answered 404, as
	// vLLM does. Default: "sim-model".
	ModelName string
	// Addr is the listen address used by Start. Default: "127.0.0.1:0".
	Addr string
	// AdvertiseHost is the host put in transfer parameters (remote_host,
	// bootstrap_host, peer_host). Default: the local address the request
	// arrived on, or 127.0.0.1 when that is unspecified.
	AdvertiseHost string
	// StampEvents precedes every SSE event with a comment line
	// EventStampPrefix + the wall-clock time (time.Now().UnixNano()) taken
	// just before the event is written, so that a client on the same machine
	// can measure per-event latency. SSE clients ignore comment lines.
	StampEvents bool
	// DisableRecording stops the worker from keeping a copy of every request
	// (Requests then returns none), so that load tests run in bounded memory.
	DisableRecording bool
	// RenderWithoutMetadata makes the render endpoints answer features without mm_metadata, as
	// vLLM before vllm-project/vllm#54659 does. By default each media item's features carry its
	// mm_metadata (MediaMetadata) beside its kwargs_data, as the current vLLM render does.
	RenderWithoutMetadata bool
	// FaultControl serves the fault-control endpoint PathFaults (POST a
	// Fault to queue it, DELETE to clear the queue, GET to list it), so that
	// a test can inject faults into a worker process.
	FaultControl bool
	// BootstrapTimeout bounds SGLang's bootstrap waits (KVSGLang): a prefill waiting for its
	// decode to join the room, a decode waiting for its prefill. Default: 300s, SGLang's.
	BootstrapTimeout time.Duration
	// BootstrapAddr, when set, also serves the bootstrap server (POST /bootstrap/{room}) on its
	// own listener, as SGLang's --disaggregation-bootstrap-port does: decodes reach it at
	// bootstrap_host:bootstrap_port. It is always served on the worker's own listener too.
	BootstrapAddr string
	// SideChannelTimeout bounds one look-up of a KV or EC transfer on the worker that holds it
	// (NIXL: the decode checks the prefill's handle). Default: 5s; a load test that runs the box
	// far behind its offered rate sets it longer, so that the double's own checks do not fail
	// requests the coordinator served right.
	SideChannelTimeout time.Duration
}

// DefaultSideChannelTimeout is SideChannelTimeout's default.
const DefaultSideChannelTimeout = 5 * time.Second

// EventStampPrefix starts the comment line of a stamped SSE event (see
// Config.StampEvents): ": sent_ns=<UnixNano>\n" precedes the event's data line.
const EventStampPrefix = ": sent_ns="

// withDefaults returns c with zero fields replaced by their defaults.
func (c Config) withDefaults() Config {
	if c.Role == "" {
		c.Role = RoleBoth
	}
	if c.Name == "" {
		c.Name = "simworker-" + string(c.Role)
	}
	if c.KVConnector == "" {
		c.KVConnector = KVNixl
	}
	if c.ECConnector == "" {
		c.ECConnector = ECNixl
	}
	if c.DefaultMaxTokens <= 0 {
		c.DefaultMaxTokens = DefaultMaxTokens
	}
	if c.CacheSize <= 0 {
		c.CacheSize = DefaultCacheSize
	}
	if c.ModelName == "" {
		c.ModelName = DefaultModelName
	}
	if c.BootstrapTimeout <= 0 {
		c.BootstrapTimeout = DefaultBootstrapTimeout
	}
	if c.SideChannelTimeout <= 0 {
		c.SideChannelTimeout = DefaultSideChannelTimeout
	}
	return c
}

// Validate reports whether c, after defaults are applied, describes a worker
// that can serve requests.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	switch c.Role {
	case RolePrefill, RoleDecode, RoleBoth, RoleEncode:
	default:
		errs = append(errs, fmt.Errorf("unknown role %q (want prefill, decode, both or encode)", c.Role))
	}
	switch c.KVConnector {
	case KVNixl, KVSGLang, KVSharedStorage, KVAuto:
	default:
		errs = append(errs, fmt.Errorf("unknown KV connector %q (want kv-nixl, kv-sglang or kv-shared-storage)", c.KVConnector))
	}
	switch c.ECConnector {
	case ECNixl, ECSharedStorage:
	default:
		errs = append(errs, fmt.Errorf("unknown EC connector %q (want ec-nixl or ec-shared-storage)", c.ECConnector))
	}
	if (c.KVConnector == KVSharedStorage || c.KVConnector == KVAuto) && c.Role != RoleEncode && c.KVDir == "" {
		errs = append(errs, errors.New("KVDir is required with kv-shared-storage"))
	}
	if c.ECConnector == ECSharedStorage && c.Role != RoleDecode && c.ECDir == "" {
		errs = append(errs, errors.New("ECDir is required with ec-shared-storage"))
	}
	if c.TTFT < 0 || c.ITL < 0 {
		errs = append(errs, errors.New("TTFT and ITL must not be negative"))
	}
	return errors.Join(errs...)
}

// Package stack starts, on loopback, the pieces around a coordinator: an encode, prefill and
// decode pool of simworkers, a render service and the gateway double that routes by EPP-Profile.
// Integration tests, end-to-end tests, benchmarks and `make demo` share it, and it can start an
// in-process coordinator on a given configuration.
package stack

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/broker/redisbroker"
	"github.com/epd-dev/coordinator/dataplane/connectors/kv"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/server"
	_ "github.com/epd-dev/coordinator/dataplane/steps" // the built-in step types
	"github.com/epd-dev/coordinator/test/doubles/gateway"
	"github.com/epd-dev/coordinator/test/doubles/simworker"
)

// Options shape the worker pool.
type Options struct {
	// KVConnector and ECConnector are what the workers run (the coordinator must match).
	KVConnector string
	ECConnector string
	// Encoders, Prefillers and Decoders size each pool (default 1 each).
	Encoders, Prefillers, Decoders int
	// TTFT and ITL set the workers' generation latency; EncodeDelay the encoders' TTFT.
	TTFT, ITL, EncodeDelay time.Duration
	// Dir holds the shared-storage directories (a temporary directory when empty).
	Dir string
	// BootstrapTimeout is the kv-sglang workers' bootstrap wait (simworker's default when 0).
	BootstrapTimeout time.Duration
	// Gateway configures the gateway (its Pools are the stack's).
	Gateway gateway.Config
}

// Stack is a running worker pool behind a gateway.
type Stack struct {
	Encode, Prefill, Decode []*simworker.Worker
	// Render serves the render endpoints (vLLM's render service).
	Render  *simworker.Worker
	Gateway *gateway.Gateway
	// BootstrapPort is the port of every kv-sglang prefill worker's bootstrap server (each
	// worker has a loopback address of its own, as pods have IPs); the coordinator's
	// SGLANG_BOOTSTRAP_PORT. 0 with other connectors.
	BootstrapPort int
	dir           string
	ownDir        bool
}

// Start launches the pool. Close stops it.
func Start(o Options) (st *Stack, err error) {
	if o.KVConnector == "" {
		o.KVConnector = string(simworker.KVNixl)
	}
	if o.ECConnector == "" {
		o.ECConnector = string(simworker.ECNixl)
	}
	o.Encoders, o.Prefillers, o.Decoders = atLeastOne(o.Encoders), atLeastOne(o.Prefillers), atLeastOne(o.Decoders)
	st = &Stack{dir: o.Dir}
	if st.dir == "" {
		if st.dir, err = os.MkdirTemp("", "epd-stack-"); err != nil {
			return nil, err
		}
		st.ownDir = true
	}
	defer func() {
		if err != nil {
			st.Close()
		}
	}()
	kvDir, ecDir := filepath.Join(st.dir, "kv"), filepath.Join(st.dir, "ec")
	for _, d := range []string{kvDir, ecDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	start := func(role simworker.Role, i int, ttft time.Duration) (*simworker.Worker, error) {
		cfg := simworker.Config{
			Name: fmt.Sprintf("%s-%d", role, i), Role: role,
			KVConnector: simworker.KVConnector(o.KVConnector), ECConnector: simworker.ECConnector(o.ECConnector),
			KVDir: kvDir, ECDir: ecDir, TTFT: ttft, ITL: o.ITL, BootstrapTimeout: o.BootstrapTimeout,
		}
		if role != simworker.RolePrefill || cfg.KVConnector != simworker.KVSGLang {
			return simworker.Start(cfg)
		}
		return st.startSGLangPrefill(cfg)
	}
	pools := map[string][]string{}
	for _, p := range []struct {
		profile string
		role    simworker.Role
		n       int
		ttft    time.Duration
		dst     *[]*simworker.Worker
	}{
		{"encode", simworker.RoleEncode, o.Encoders, o.EncodeDelay, &st.Encode},
		{"prefill", simworker.RolePrefill, o.Prefillers, o.TTFT, &st.Prefill},
		{"decode", simworker.RoleDecode, o.Decoders, o.TTFT, &st.Decode},
	} {
		for i := 0; i < p.n; i++ {
			w, err := start(p.role, i, p.ttft)
			if err != nil {
				return nil, fmt.Errorf("starting %s worker: %w", p.profile, err)
			}
			*p.dst = append(*p.dst, w)
			pools[p.profile] = append(pools[p.profile], w.URL())
		}
	}
	if st.Render, err = simworker.Start(simworker.Config{Name: "render", Role: simworker.RoleBoth}); err != nil {
		return nil, fmt.Errorf("starting the render service: %w", err)
	}
	gw := o.Gateway
	gw.Pools = pools
	if st.Gateway, err = gateway.Start(gw); err != nil {
		return nil, fmt.Errorf("starting the gateway: %w", err)
	}
	return st, nil
}

func atLeastOne(n int) int { return max(n, 1) }

// Getenv is the environment a coordinator in front of the stack runs with: SGLANG_BOOTSTRAP_PORT
// is the stack's bootstrap port when it has one; the rest is os.Getenv.
func (s *Stack) Getenv(name string) string {
	if name == kv.SGLangBootstrapPortEnv && s.BootstrapPort != 0 {
		return strconv.Itoa(s.BootstrapPort)
	}
	return os.Getenv(name)
}

// startSGLangPrefill starts a kv-sglang prefill worker on a loopback address of its own
// (127.x.y.z: Linux routes all of 127/8 to lo) with its bootstrap server on the stack's
// bootstrap port there, chosen by the first such worker.
func (s *Stack) startSGLangPrefill(cfg simworker.Config) (*simworker.Worker, error) {
	var last error
	for range 16 {
		ip := netip.AddrFrom4([4]byte{127, byte(1 + rand.IntN(254)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))})
		cfg.Addr = net.JoinHostPort(ip.String(), "0")
		cfg.BootstrapAddr = net.JoinHostPort(ip.String(), strconv.Itoa(s.BootstrapPort))
		w, err := simworker.Start(cfg)
		if errors.Is(err, syscall.EADDRINUSE) {
			last = err // another address
			continue
		}
		if err != nil {
			return nil, err
		}
		if s.BootstrapPort == 0 {
			u, err := url.Parse(w.BootstrapURL())
			if err == nil {
				s.BootstrapPort, err = strconv.Atoi(u.Port())
			}
			if err != nil {
				_ = w.Close()
				return nil, fmt.Errorf("bootstrap server address %q: %w", w.BootstrapURL(), err)
			}
		}
		return w, nil
	}
	return nil, last
}

// Workers lists every worker of the pools.
func (s *Stack) Workers() []*simworker.Worker {
	var all []*simworker.Worker
	all = append(all, s.Encode...)
	all = append(all, s.Prefill...)
	return append(all, s.Decode...)
}

// Reset forgets recorded requests and legs (not the decode prefix caches).
func (s *Stack) Reset() {
	for _, w := range append(s.Workers(), s.Render) {
		if w != nil {
			w.Reset()
		}
	}
	if s.Gateway != nil {
		s.Gateway.Reset()
	}
}

// Close stops every process of the stack.
func (s *Stack) Close() {
	if s.Gateway != nil {
		s.Gateway.Close()
	}
	for _, w := range append(s.Workers(), s.Render) {
		if w != nil {
			_ = w.Close()
		}
	}
	if s.ownDir {
		_ = os.RemoveAll(s.dir)
	}
}

// Coordinator is an in-process coordinator server on loopback.
type Coordinator struct {
	Server   *server.Server
	Holder   *pipeline.Holder
	Pipeline *pipeline.Pipeline
	url      string
	done     chan error
}

// URL is the coordinator's base URL (no trailing slash).
func (c *Coordinator) URL() string { return c.url }

// Close stops the server at once and closes its pipeline: its pooled connections to the gateway
// and the media hosts are dropped, so that a double shutting down after it does not wait for a
// connection the coordinator dialled and never used (net/http's Shutdown gives those 5 seconds).
func (c *Coordinator) Close() {
	_ = c.Server.Close()
	<-c.done //nolint:errcheck // Serve's nil after Close
	c.Holder.Swap(nil)
}

// HintNetworks is gateway.allowed_hint_networks for a coordinator in front of a stack (or of any
// workers on loopback): the endpoint picker's 412 hints and reservations name the workers'
// 127/8 addresses, which a coordinator refuses otherwise (no pod has one).
const HintNetworks = "127.0.0.0/8"

// LoopbackMedia lets replace-media-urls download from loopback media servers (tests only).
var LoopbackMedia = builder.Overrides{MediaAllowAddr: netip.Addr.IsLoopback}

// CoordinatorOptions tune StartCoordinatorWith.
type CoordinatorOptions struct {
	Log       logr.Logger
	Overrides builder.Overrides
	// Broker tunes the async broker's runtime, which the coordinator hands its pipelines as the
	// binary does.
	Broker    redisbroker.Options
	Telemetry observe.Telemetry
	// Getenv supplies the pipeline's environment (SGLANG_BOOTSTRAP_PORT); os.Getenv when nil.
	Getenv func(string) string
}

// StartCoordinator builds the pipeline of cfg and serves it on 127.0.0.1 (any port).
func StartCoordinator(cfg config.Config, log logr.Logger, o builder.Overrides) (*Coordinator, error) {
	return StartCoordinatorWith(cfg, CoordinatorOptions{Log: log, Overrides: o})
}

// StartCoordinatorWith is StartCoordinator with telemetry.
func StartCoordinatorWith(cfg config.Config, o CoordinatorOptions) (*Coordinator, error) {
	if o.Log.GetSink() == nil {
		o.Log = logr.Discard()
	}
	p, err := builder.Build(cfg, builder.Options{Log: o.Log, Overrides: o.Overrides, Telemetry: o.Telemetry, Getenv: o.Getenv,
		Shared: builder.Shared{Broker: redisbroker.Runtime(o.Broker)}})
	if err != nil {
		return nil, err
	}
	holder := &pipeline.Holder{}
	holder.Swap(p)
	srv := server.New(server.Options{Server: cfg.Server, Pipelines: holder, Log: o.Log, Telemetry: o.Telemetry})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c := &Coordinator{Server: srv, Holder: holder, Pipeline: p, url: "http://" + l.Addr().String(), done: make(chan error, 1)}
	go func() { c.done <- srv.Serve(l) }()
	return c, nil
}

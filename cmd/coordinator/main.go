// Command coordinator is the data plane: it serves the OpenAI-compatible API and drives each
// request through the configured pipeline of steps (render, encode, prefill, decode...), calling
// workers through the Inference Gateway. It reloads the pipeline when the config file changes.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/epd-dev/coordinator/dataplane/base/budget"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/broker/redisbroker"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/ratelimit"
	"github.com/epd-dev/coordinator/dataplane/reload"
	"github.com/epd-dev/coordinator/dataplane/render"
	"github.com/epd-dev/coordinator/dataplane/server"
	"github.com/epd-dev/coordinator/dataplane/server/conn"
	_ "github.com/epd-dev/coordinator/dataplane/steps" // registers the built-in steps
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/dataplane/transport/retry"
)

// Build information, set with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = "unknown"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	flags := pflag.NewFlagSet("coordinator", pflag.ContinueOnError)
	configPath := flags.String("config", config.DefaultPath,
		"path of the coordinator YAML config; the default is where the operator mounts it and the image carries the annotated example")
	verbosity := flags.IntP("v", "v", 0, "log verbosity (1 warn, 2 info, 3 verbose, 4 debug, 5 trace); overrides log_level")
	watch := flags.Bool("watch", true, "reload the pipeline when the config file changes")
	check := flags.Bool("check", false,
		"validate the config file as startup does, print the result and exit (0 valid, 1 invalid); opens no listener")
	showVersion := flags.Bool("version", false, "print the version, commit, Go version and configuration schema version, and exit")
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if *showVersion {
		fmt.Printf("coordinator %s (commit %s, %s %s/%s, config schema %d)\n", version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH, config.SchemaVersion)
		return 0
	}
	// -v overrides log_level, at startup, on reload (lookupEnv) and for --check.
	lookupEnv := os.LookupEnv
	applyVerbosity := func(c *config.Config) {}
	if flags.Changed("v") {
		applyVerbosity = func(c *config.Config) { c.LogLevel = *verbosity }
		lookupEnv = withEnv(config.EnvName("log_level"), fmt.Sprint(*verbosity))
	}
	if *check {
		return checkConfig(*configPath, applyVerbosity)
	}

	var (
		log     logr.Logger
		level   *logging.Level
		reg     = prometheus.NewRegistry()
		tel     = observe.Telemetry{Metrics: observe.NewMetrics(reg)}
		retries *retry.Budget
		tp      *sdktrace.TracerProvider
		// What every pipeline shares, across reloads: the byte budgets and the async broker's runtime.
		shared = builder.Shared{Media: &budget.Bytes{}, Folds: &budget.Bytes{}, Render: &budget.Bytes{}, Resume: &budget.Bytes{},
			Broker: redisbroker.Runtime(redisbroker.Options{})}
	)
	reg.MustRegister(render.Collector(observe.Namespace), // the in-process renderer's caches
		observe.MediaInFlight(shared.Media.Held), observe.RenderInFlight(shared.Render.Held), observe.ResumeHeld(shared.Resume.Held))
	defer func() {
		if tp != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = tp.Shutdown(ctx)
		}
	}()
	start, err := load(*configPath, func(cfg *config.Config) (builder.Options, error) {
		applyVerbosity(cfg)
		log, level = logging.NewLeveled(cfg.LogLevel, os.Stderr)
		log.V(logging.Info).Info("starting coordinator", "version", version, "commit", commit, "config", *configPath,
			"log_level", cfg.LogLevel, "kv_connector", cfg.Pipeline.KVConnector, "ec_connector", cfg.Pipeline.ECConnector)
		if cfg.Tracing.Enabled {
			var err error
			if tp, err = observe.NewTracerProvider(context.Background(), cfg.Tracing.Endpoint, cfg.Tracing.ServiceName, cfg.Tracing.SampleRatio); err != nil {
				return builder.Options{}, fmt.Errorf("tracing: %w", err)
			}
			tel.Tracer = tp.Tracer(observe.TracerName)
		}
		// One retry budget for the process: a reload keeps what was spent.
		retries = retry.NewBudget(cfg.Gateway.Retry.BudgetRatio, cfg.Gateway.Retry.BudgetMinPerSecond)
		return builder.Options{Log: log, Telemetry: tel, RetryBudget: retries, Shared: shared}, nil
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "coordinator: %v\n", err)
		return 1
	}
	cfg, data, p := start.cfg, start.data, start.pipeline
	// The garbage collector works to stay under 90% of the container's memory limit (cgroup), so
	// media and bodies freed by finished requests are reclaimed before the pod nears its limit.
	// GOMEMLIMIT or AUTOMEMLIMIT (a ratio, or off) in the environment take precedence.
	if limit, err := memlimit.SetGoMemLimitWithOpts(memlimit.WithProvider(memlimit.FromCgroup)); err != nil {
		log.V(logging.Verbose).Info("no container memory limit found; GOMEMLIMIT left unset", "reason", err.Error())
	} else if limit > 0 {
		log.V(logging.Info).Info("memory limit", "gomemlimit_bytes", limit)
	}
	build := func(c config.Config, revision string) (*pipeline.Pipeline, error) {
		if err := gateway.CheckCA(c.Gateway); err != nil {
			return nil, err
		}
		p, err := builder.Build(c, builder.Options{Log: log, Telemetry: tel, Revision: revision, RetryBudget: retries, Shared: shared})
		if err == nil {
			tel.Metrics.Hold(p.Tracks()...) // a built pipeline is installed next: count it from its first request
		}
		return p, err
	}
	var holder pipeline.Holder
	holder.Swap(p)
	tel.Metrics.Loaded(p.Revision(), p.Tracks()...)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// One rate limiter for the process: a reload keeps its Redis client and local buckets when the
	// rate_limit block's Redis settings stay the same.
	limiter := ratelimit.New(log, nil)
	defer limiter.Close()
	reg.MustRegister(limiter.Collectors()...)
	opts := server.Options{Server: cfg.Server, Pipelines: &holder, Log: log, Telemetry: tel, RateLimiter: limiter}
	if cfg.Server.SecureServing {
		if opts.TLS, err = conn.TLSConfig(cfg.Server, cfg.Server.CertPath, "server.cert_path", log); err != nil {
			fmt.Fprintf(os.Stderr, "coordinator: invalid config %s: %v\n", *configPath, err)
			return 1
		}
	} else if cfg.Server.CertPath != "" {
		log.V(logging.Warn).Info("server.cert_path is ignored: server.secure_serving is false", "cert_path", cfg.Server.CertPath)
	}
	var adminTLS *tls.Config
	if dir := cfg.Server.MetricsCertDir; dir != "" && cfg.Server.MetricsPort > 0 {
		if adminTLS, err = conn.TLSConfig(cfg.Server, dir, "server.metrics_cert_dir", log); err != nil {
			fmt.Fprintf(os.Stderr, "coordinator: invalid config %s: %v\n", *configPath, err)
			return 1
		}
	}
	var reloader server.StatusReporter
	if *watch {
		w := reload.New(reload.Options{Path: *configPath, Holder: &holder, Startup: cfg, Loaded: data, Build: build,
			LookupEnv: lookupEnv, Log: log, Level: level, OnReload: func(ok bool, serving *pipeline.Pipeline) {
				if !ok {
					tel.Metrics.Reload(false, "")
					return
				}
				tel.Metrics.Reload(true, serving.Revision(), serving.Tracks()...)
			}})
		reloader = w
		go func() {
			if err := w.Run(ctx); err != nil {
				log.Error(err, "config watch stopped; the pipeline will not reload")
			}
		}()
	}
	srv := server.New(opts)
	l, err := net.Listen("tcp", cfg.Server.ListenAddr)
	if err != nil {
		log.Error(err, "cannot listen", "addr", cfg.Server.ListenAddr)
		return 1
	}
	if cfg.Server.MetricsPort > 0 {
		ml, err := net.Listen("tcp", cfg.Server.MetricsAddr())
		if err != nil {
			log.Error(err, "cannot listen for the admin endpoints", "addr", cfg.Server.MetricsAddr())
			return 1
		}
		admin := server.NewAdmin(server.AdminHandler(reg, &holder, reloader), adminTLS, log)
		go func() { _ = admin.Serve(ml) }()
		defer admin.Close()
		log.V(logging.Info).Info("serving the admin endpoints (/metrics, /debug/pipeline)", "addr", ml.Addr().String(),
			"tls", adminTLS != nil)
	}
	log.V(logging.Info).Info("serving", "addr", l.Addr().String(), "revision", p.Revision(), "steps", len(p.Steps()), "watch", *watch,
		"tracing", cfg.Tracing.Enabled, "tls", opts.TLS != nil, "cert_path", cfg.Server.CertPath)
	return serve(ctx, stop, srv, l, &holder, log)
}

// loaded is a config file as startup read it and the pipeline built from it.
type loaded struct {
	cfg      config.Config
	data     []byte
	pipeline *pipeline.Pipeline
}

// load does with the config file at path what startup does before it opens a listener, and what
// --check does: read it, parse it with the COORDINATOR_* environment, check gateway.ca_file, and
// build the pipeline (revision config.FileRevision) with the options setup returns for the parsed
// config, which setup may adjust (-v). It dials nothing. The error is the one line the coordinator
// prints after "coordinator: "; an error of setup's is returned as it is.
func load(path string, setup func(*config.Config) (builder.Options, error)) (loaded, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return loaded{}, fmt.Errorf("reading config: %w", err)
	}
	cfg, err := config.Parse(data, os.LookupEnv)
	if err != nil {
		return loaded{}, fmt.Errorf("invalid config %s: %w", path, err)
	}
	opts, err := setup(&cfg)
	if err != nil {
		return loaded{}, err
	}
	if err := gateway.CheckCA(cfg.Gateway); err != nil {
		return loaded{}, fmt.Errorf("invalid config %s: %w", path, err)
	}
	opts.Revision = config.FileRevision(data)
	p, err := builder.Build(cfg, opts)
	if err != nil {
		return loaded{}, fmt.Errorf("invalid pipeline in %s: %w", path, err)
	}
	return loaded{cfg: cfg, data: data, pipeline: p}, nil
}

// checkConfig is --check: load, as startup would, with a logger at the config's level (steps'
// build-time warnings show) and without the tracer, then print one line and return the exit code.
// The serving TLS certificates (server.cert_path, server.metrics_cert_dir) are not read: they are
// loaded, and watched, only when the listeners start.
func checkConfig(path string, applyVerbosity func(*config.Config)) int {
	res, err := load(path, func(cfg *config.Config) (builder.Options, error) {
		applyVerbosity(cfg)
		log := logging.New(cfg.LogLevel, os.Stderr)
		tel := observe.Telemetry{Metrics: observe.NewMetrics(prometheus.NewRegistry())}
		retries := retry.NewBudget(cfg.Gateway.Retry.BudgetRatio, cfg.Gateway.Retry.BudgetMinPerSecond)
		return builder.Options{Log: log, Telemetry: tel, RetryBudget: retries}, nil
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "coordinator: %v\n", err)
		return 1
	}
	res.pipeline.Close()
	var steps []string
	for _, s := range res.pipeline.Steps() {
		steps = append(steps, s.Type)
	}
	fmt.Printf("coordinator: config OK: %s (revision %s, steps %s)\n", path, res.pipeline.Revision(), strings.Join(steps, ", "))
	return 0
}

// serve runs until ctx ends (SIGINT/SIGTERM), then shuts down the way a pod behind a Service or
// a load balancer must (docs/upgrades.md): stop (the signal context's) is called first, so that a
// second signal ends the process at once; then the server drains for the serving
// configuration's drain_delay, failing readiness but accepting and serving new connections (each
// answer closing its connection) while the endpoints stop sending them; then it stops accepting,
// closes the idle connections and finishes in-flight requests and streams within
// shutdown_timeout. It returns the process exit code: 0 after a clean drain, 1 when the drain
// timed out or serving failed.
func serve(ctx context.Context, stop context.CancelFunc, srv *server.Server, l net.Listener, holder *pipeline.Holder, log logr.Logger) int {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		if err != nil {
			log.Error(err, "server stopped")
			return 1
		}
		return 0
	case <-ctx.Done():
	}
	stop()
	settings := holder.Load().Config().Server
	delay, timeout := settings.Drain(), settings.ShutdownTimeout.Std()
	srv.Drain()
	log.V(logging.Info).Info("draining: readiness fails, new connections are still served until the drain delay ends; a second signal exits at once",
		"drain_delay", delay.String(), "shutdown_timeout", timeout.String())
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case err := <-errc: // the listener failed: nothing left to wait for
			t.Stop()
			if err != nil {
				log.Error(err, "server stopped")
				return 1
			}
			return 0
		}
	}
	log.V(logging.Info).Info("shutting down: no longer accepting; finishing in-flight requests", "timeout", timeout.String())
	dctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := srv.Shutdown(dctx); err != nil {
		log.Error(err, "drain did not finish in time; closing remaining connections")
		_ = srv.Close()
		return 1
	}
	if err := <-errc; err != nil {
		log.Error(err, "server stopped")
		return 1
	}
	log.V(logging.Info).Info("drained; bye")
	return 0
}

// withEnv returns an environment lookup where key is pinned to value.
func withEnv(key, value string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		if k == key {
			return value, true
		}
		return os.LookupEnv(k)
	}
}

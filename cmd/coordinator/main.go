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
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	_ "github.com/epd-dev/coordinator/dataplane/asyncbroker" // the async-broker step's Redis runtime
	"github.com/epd-dev/coordinator/dataplane/config"
	"github.com/epd-dev/coordinator/dataplane/gateway"
	"github.com/epd-dev/coordinator/dataplane/logging"
	"github.com/epd-dev/coordinator/dataplane/observe"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/reload"
	"github.com/epd-dev/coordinator/dataplane/retry"
	"github.com/epd-dev/coordinator/dataplane/server"
	_ "github.com/epd-dev/coordinator/dataplane/steps" // registers the built-in steps
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
	configPath := flags.String("config", "config/coordinator/coordinator.yaml", "path of the coordinator YAML config")
	verbosity := flags.IntP("v", "v", 0, "log verbosity (1 warn, 2 info, 3 verbose, 4 debug, 5 trace); overrides log_level")
	watch := flags.Bool("watch", true, "reload the pipeline when the config file changes")
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, err)
		return 2
	}

	data, err := os.ReadFile(*configPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "coordinator: reading config: %v\n", err)
		return 1
	}
	cfg, err := config.Parse(data, os.LookupEnv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "coordinator: invalid config %s: %v\n", *configPath, err)
		return 1
	}
	lookupEnv := os.LookupEnv
	if flags.Changed("v") {
		cfg.LogLevel = *verbosity
		lookupEnv = withEnv(config.EnvName("log_level"), fmt.Sprint(*verbosity)) // -v keeps winning on reload
	}
	log, level := logging.NewLeveled(cfg.LogLevel, os.Stderr)
	log.V(logging.Info).Info("starting coordinator", "version", version, "commit", commit, "config", *configPath,
		"log_level", cfg.LogLevel, "kv_connector", cfg.Pipeline.KVConnector, "ec_connector", cfg.Pipeline.ECConnector)
	// The garbage collector works to stay under 90% of the container's memory limit (cgroup), so
	// media and bodies freed by finished requests are reclaimed before the pod nears its limit.
	// GOMEMLIMIT or AUTOMEMLIMIT (a ratio, or off) in the environment take precedence.
	if limit, err := memlimit.SetGoMemLimitWithOpts(memlimit.WithProvider(memlimit.FromCgroup)); err != nil {
		log.V(logging.Verbose).Info("no container memory limit found; GOMEMLIMIT left unset", "reason", err.Error())
	} else if limit > 0 {
		log.V(logging.Info).Info("memory limit", "gomemlimit_bytes", limit)
	}

	reg := prometheus.NewRegistry()
	tel := observe.Telemetry{Metrics: observe.NewMetrics(reg)}
	if cfg.Tracing.Enabled {
		tp, err := observe.NewTracerProvider(context.Background(), cfg.Tracing.Endpoint, cfg.Tracing.ServiceName, cfg.Tracing.SampleRatio)
		if err != nil {
			fmt.Fprintf(os.Stderr, "coordinator: tracing: %v\n", err)
			return 1
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = tp.Shutdown(ctx)
		}()
		tel.Tracer = tp.Tracer(observe.TracerName)
	}
	// One retry budget for the process: a reload keeps what was spent.
	budget := retry.NewBudget(cfg.Gateway.Retry.BudgetRatio, cfg.Gateway.Retry.BudgetMinPerSecond)
	build := func(c config.Config, revision string) (*pipeline.Pipeline, error) {
		if err := gateway.CheckCA(c.Gateway); err != nil {
			return nil, err
		}
		return builder.Build(c, builder.Options{Log: log, Telemetry: tel, Revision: revision, RetryBudget: budget})
	}
	if err := gateway.CheckCA(cfg.Gateway); err != nil {
		fmt.Fprintf(os.Stderr, "coordinator: invalid config %s: %v\n", *configPath, err)
		return 1
	}
	p, err := build(cfg, config.FileRevision(data))
	if err != nil {
		fmt.Fprintf(os.Stderr, "coordinator: invalid pipeline in %s: %v\n", *configPath, err)
		return 1
	}
	var holder pipeline.Holder
	holder.Swap(p)
	tel.Metrics.Loaded(p.Revision())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctrllog.SetLogger(log.V(logging.Info)) // controller-runtime's certificate watcher
	opts := server.Options{Server: cfg.Server, Pipelines: &holder, Log: log, Telemetry: tel}
	if cfg.Server.SecureServing {
		if opts.TLS, err = server.TLSConfig(ctx, cfg.Server, cfg.Server.CertPath, "server.cert_path", log); err != nil {
			fmt.Fprintf(os.Stderr, "coordinator: invalid config %s: %v\n", *configPath, err)
			return 1
		}
	} else if cfg.Server.CertPath != "" {
		log.V(logging.Warn).Info("server.cert_path is ignored: server.secure_serving is false", "cert_path", cfg.Server.CertPath)
	}
	var adminTLS *tls.Config
	if dir := cfg.Server.MetricsCertDir; dir != "" && cfg.Server.MetricsPort > 0 {
		if adminTLS, err = server.TLSConfig(ctx, cfg.Server, dir, "server.metrics_cert_dir", log); err != nil {
			fmt.Fprintf(os.Stderr, "coordinator: invalid config %s: %v\n", *configPath, err)
			return 1
		}
	}
	var reloader server.StatusReporter
	if *watch {
		w := reload.New(reload.Options{Path: *configPath, Holder: &holder, Startup: cfg, Loaded: data, Build: build,
			LookupEnv: lookupEnv, Log: log, Level: level, OnReload: tel.Metrics.Reload})
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
	return serve(ctx, srv, l, &holder, log)
}

// serve runs until ctx ends (SIGINT/SIGTERM), then drains in-flight requests within the serving
// configuration's shutdown_timeout. It returns the process exit code: 0 after a clean drain, 1
// when the drain timed out or serving failed.
func serve(ctx context.Context, srv *server.Server, l net.Listener, holder *pipeline.Holder, log logr.Logger) int {
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
	timeout := holder.Load().Config().Server.ShutdownTimeout.Std()
	log.V(logging.Info).Info("shutting down: draining in-flight requests", "timeout", timeout.String())
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

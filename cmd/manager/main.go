// Command manager is the coordinator operator: a controller-runtime manager running the
// CoordinatorPipeline reconciler, with a metrics endpoint, health probes and leader election.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/epd-dev/coordinator/internal/controller"
)

// Build information, set with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = "unknown"
)

// leaderElectionID names the leader-election Lease.
const leaderElectionID = "coordinator-operator.coordinator.epd.dev"

// coordinatorImageEnv names the environment variable holding the default coordinator image. The
// RELATED_IMAGE_ prefix is the OLM convention: tools that mirror an operator's images for
// disconnected clusters find and rewrite it in the bundle's Deployment.
const coordinatorImageEnv = "RELATED_IMAGE_COORDINATOR"

// defaultCoordinatorImage is $RELATED_IMAGE_COORDINATOR, else the built-in default.
func defaultCoordinatorImage() string {
	if img := os.Getenv(coordinatorImageEnv); img != "" {
		return img
	}
	return controller.DefaultImage
}

func main() {
	os.Exit(run())
}

func run() int {
	var (
		metricsAddr       string
		secureMetrics     bool
		enableHTTP2       bool
		probeAddr         string
		leaderElect       bool
		leaderElectionNS  string
		coordinatorImage  string
		maxConcurrent     int
		kubeAPIQPS        float64
		kubeAPIBurst      int
		watchNamespace    string
		operatorNamespace string
		canaryInterval    time.Duration
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0",
		"Address of the metrics endpoint, e.g. :8443 (HTTPS with --metrics-secure) or :8080; 0 disables it.")
	flag.BoolVar(&secureMetrics, "metrics-secure", true,
		"Serve metrics over HTTPS with Kubernetes authentication and authorization (TokenReview, SubjectAccessReview).")
	flag.BoolVar(&enableHTTP2, "enable-http2", false,
		"Serve the metrics endpoint over HTTP/2 too (off by default: CVE-2023-44487, CVE-2023-39325).")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz probes.")
	flag.BoolVar(&leaderElect, "leader-elect", false,
		"Elect a leader (a Lease) so that only one of several manager replicas reconciles.")
	flag.StringVar(&leaderElectionNS, "leader-election-namespace", "",
		"Namespace of the leader-election Lease (defaults to the manager's namespace).")
	flag.StringVar(&coordinatorImage, "coordinator-image", defaultCoordinatorImage(),
		"Coordinator image for CoordinatorPipelines that do not set spec.image; $"+coordinatorImageEnv+" sets the default.")
	flag.IntVar(&maxConcurrent, "max-concurrent-reconciles", 4, "CoordinatorPipelines reconciled in parallel.")
	flag.Float64Var(&kubeAPIQPS, "kube-api-qps", 50, "Client-side rate limit towards the API server (queries per second).")
	flag.IntVar(&kubeAPIBurst, "kube-api-burst", 100, "Client-side burst towards the API server.")
	flag.StringVar(&operatorNamespace, "operator-namespace", ownNamespace(),
		"Namespace the operator runs in: pipelines' NetworkPolicies admit it to the coordinators' admin port, which the rollout probe asks (default: $POD_NAMESPACE, else the service account's namespace).")
	flag.DurationVar(&canaryInterval, "canary-status-interval", controller.DefaultCanaryStatusInterval,
		"How often a CoordinatorPipeline's status.revisions (each pipeline's requests and errors, from its pods) is refreshed while it runs a canary.")
	flag.StringVar(&watchNamespace, "watch-namespace", os.Getenv("WATCH_NAMESPACE"),
		"Only reconcile CoordinatorPipelines in this namespace (all when empty); $WATCH_NAMESPACE sets the default (OLM sets it for the OwnNamespace and SingleNamespace install modes). The manager then caches and watches that namespace only and needs only a Role there.")
	opts := zap.Options{Development: false}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()

	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")
	log.Info("starting coordinator operator", "version", version, "commit", commit)

	var tlsOpts []func(*tls.Config)
	if !enableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	metricsOpts := metricsserver.Options{
		BindAddress:   metricsAddr,
		SecureServing: secureMetrics,
		TLSOpts:       tlsOpts,
	}
	if secureMetrics {
		// Without CertDir the metrics server generates a self-signed certificate; scrape it
		// with a ServiceAccount allowed to GET /metrics (config/rbac/metrics_reader_role.yaml).
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}

	restCfg := ctrl.GetConfigOrDie()
	restCfg.QPS, restCfg.Burst = float32(kubeAPIQPS), kubeAPIBurst

	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                        controller.NewScheme(),
		Metrics:                       metricsOpts,
		HealthProbeBindAddress:        probeAddr,
		LeaderElection:                leaderElect,
		LeaderElectionID:              leaderElectionID,
		LeaderElectionNamespace:       leaderElectionNS,
		LeaderElectionReleaseOnCancel: true,
		Cache:                         controller.CacheOptions(watchNamespace),
		Controller:                    config.Controller{MaxConcurrentReconciles: maxConcurrent},
	})
	if err != nil {
		log.Error(err, "creating the manager")
		return 1
	}

	ctx := ctrl.SetupSignalHandler()
	r := &controller.CoordinatorPipelineReconciler{Client: mgr.GetClient(), DefaultImage: coordinatorImage, WatchNamespace: watchNamespace,
		OperatorNamespace: operatorNamespace, CanaryStatusInterval: canaryInterval}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		log.Error(err, "setting up the controller", "controller", controller.ControllerName)
		return 1
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "adding the health check")
		return 1
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		log.Error(err, "adding the ready check")
		return 1
	}

	log.Info("starting manager")
	if err := mgr.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		return 1
	}
	return 0
}

// serviceAccountNamespace is where Kubernetes mounts the pod's namespace with its token.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// ownNamespace is the operator's namespace: $POD_NAMESPACE, else its service account's, else "".
func ownNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	b, err := os.ReadFile(serviceAccountNamespace)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

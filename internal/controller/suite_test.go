package controller

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"go.uber.org/zap/zapcore"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
	"github.com/epd-dev/coordinator/test/harness/prereq"
)

// The envtest suite: one kube-apiserver + etcd (from KUBEBUILDER_ASSETS) with our CRDs, the GAIE
// InferencePool CRD and the Gateway API Gateway and HTTPRoute CRDs (standard channel, from the
// module cache), and one manager running the reconciler.
// It starts lazily, on the first test that needs it, so the pure unit tests of this package run
// without it; TestMain stops it, so `go test -count=N` runs every test N times against one API
// server. Every test works in its own namespace, whose CoordinatorPipelines and Services are
// deleted when the test ends.

// testEnv is the running suite.
type testEnv struct {
	env *envtest.Environment
	// client talks to the API server directly (no cache): what tests read is current.
	client client.Client
	// reconciler is the manager's reconciler, for forcing a reconcile.
	reconciler *CoordinatorPipelineReconciler
	// events counts the events the reconciler emits, when it emits them.
	events *countingRecorder
	stop   func()
}

// countingRecorder counts the events emitted per regarding object (namespace/name) before
// handing them to the manager's recorder, which writes them asynchronously: a test that must see
// no event reads the count, not the API.
type countingRecorder struct {
	events.EventRecorder
	mu sync.Mutex
	n  map[client.ObjectKey]int
}

// Eventf implements events.EventRecorder.
func (r *countingRecorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	if obj, ok := regarding.(client.Object); ok {
		r.mu.Lock()
		r.n[client.ObjectKeyFromObject(obj)]++
		r.mu.Unlock()
	}
	r.EventRecorder.Eventf(regarding, related, eventtype, reason, action, note, args...)
}

// count is how many events were emitted about the object namespace/name so far.
func (r *countingRecorder) count(namespace, name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[client.ObjectKey{Namespace: namespace, Name: name}]
}

var (
	suiteOnce sync.Once
	suite     *testEnv
	suiteErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if suite != nil {
		suite.stop()
	}
	os.Exit(code)
}

// envSuite returns the running envtest suite, starting it on first use. Without
// KUBEBUILDER_ASSETS the test fails under CI and is skipped otherwise (package prereq).
func envSuite(t *testing.T) *testEnv {
	t.Helper()
	prereq.KubebuilderAssets(t)
	suiteOnce.Do(func() { suite, suiteErr = startSuite() })
	if suiteErr != nil {
		t.Fatalf("starting the envtest suite: %v", suiteErr)
	}
	return suite
}

// moduleDir is the module cache directory of a dependency (its CRDs ship in the module).
func moduleDir(module string) (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", module).Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s: %w", module, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// crdPaths are the CRDs of the suite: ours, the GAIE InferencePool and the Gateway API Gateway
// and HTTPRoute (standard channel, from the module cache).
func crdPaths() ([]string, error) {
	gaie, err := moduleDir("sigs.k8s.io/gateway-api-inference-extension")
	if err != nil {
		return nil, err
	}
	gwapi, err := moduleDir("sigs.k8s.io/gateway-api")
	if err != nil {
		return nil, err
	}
	return []string{
		filepath.Join("..", "..", "config", "crd", "bases"),
		filepath.Join(gaie, "config", "crd", "bases", "inference.networking.k8s.io_inferencepools.yaml"),
		filepath.Join(gwapi, "config", "crd", "standard", "gateway.networking.k8s.io_gateways.yaml"),
		filepath.Join(gwapi, "config", "crd", "standard", "gateway.networking.k8s.io_httproutes.yaml"),
	}, nil
}

func startSuite() (*testEnv, error) {
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))

	crds, err := crdPaths()
	if err != nil {
		return nil, err
	}
	scheme := NewScheme()
	env := &envtest.Environment{
		Scheme:                scheme,
		CRDDirectoryPaths:     crds,
		ErrorIfCRDPathMissing: true,
	}
	// Every coordinator Service takes a cluster IP and envtest has no namespace controller to
	// free them: envtest's default range (a /24) does not last a -count=3 run of the suite.
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", "10.0.0.0/16")
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("envtest: %w", err)
	}
	// The suite creates hundreds of objects (scale test): do not throttle client-side.
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 500, 1000

	direct, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  CacheOptions(""),
		Controller:             config.Controller{MaxConcurrentReconciles: 4, SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	recorder := &countingRecorder{EventRecorder: mgr.GetEventRecorder(ControllerName), n: map[client.ObjectKey]int{}}
	r := &CoordinatorPipelineReconciler{Client: mgr.GetClient(), Recorder: recorder, DefaultImage: "registry.test/coordinator:test"}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		cancel()
		_ = env.Stop()
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		cancel()
		_ = env.Stop()
		return nil, fmt.Errorf("manager cache did not sync: %w", <-done)
	}
	return &testEnv{
		env:        env,
		client:     direct,
		reconciler: r,
		events:     recorder,
		stop: func() {
			cancel()
			if err := <-done; err != nil {
				fmt.Fprintln(os.Stderr, "manager:", err)
			}
			if err := env.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "envtest stop:", err)
			}
		},
	}, nil
}

// namespace creates a fresh namespace for one test. When the test ends, its CoordinatorPipelines
// are deleted and, once the manager no longer sees them (so that none recreates a child), its
// Services, which frees their cluster IPs. Envtest runs no namespace controller or garbage
// collector: the namespace and the other children stay.
func (e *testEnv) namespace(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cpl-"}}
	if err := e.client.Create(ctx, ns); err != nil {
		t.Fatalf("creating a namespace: %v", err)
	}
	t.Cleanup(func() {
		g := gomega(t)
		in := client.InNamespace(ns.Name)
		g.Expect(e.client.DeleteAllOf(ctx, &coordinatorv1alpha1.CoordinatorPipeline{}, in)).To(Succeed())
		g.Eventually(func(g Gomega) {
			var cached coordinatorv1alpha1.CoordinatorPipelineList
			g.Expect(e.reconciler.List(ctx, &cached, in)).To(Succeed())
			g.Expect(cached.Items).To(BeEmpty())
		}).Should(Succeed(), "the manager's cache still has CoordinatorPipelines of namespace %s", ns.Name)
		var services corev1.ServiceList
		g.Expect(e.client.List(ctx, &services, in)).To(Succeed())
		for i := range services.Items {
			g.Expect(client.IgnoreNotFound(e.client.Delete(ctx, &services.Items[i]))).To(Succeed())
		}
	})
	return ns.Name
}

// reconcileTotal is how many reconciles the manager's controller has finished, whatever their
// result (controller-runtime's controller_runtime_reconcile_total). Reconciles a test forces by
// calling the reconciler directly are not counted.
func reconcileTotal(g Gomega) float64 {
	families, err := ctrlmetrics.Registry.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	var n float64
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == ControllerName {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// gomega returns a Gomega with timeouts suited to a reconcile loop on a shared 2-core machine.
func gomega(t *testing.T) *WithT {
	g := NewWithT(t)
	g.SetDefaultEventuallyTimeout(30 * time.Second)
	g.SetDefaultEventuallyPollingInterval(50 * time.Millisecond)
	return g
}

// createPool creates an InferencePool named name.
func (e *testEnv) createPool(t *testing.T, namespace, name string) *infv1.InferencePool {
	t.Helper()
	pool := &infv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: infv1.InferencePoolSpec{
			Selector:          infv1.LabelSelector{MatchLabels: map[infv1.LabelKey]infv1.LabelValue{"app": "vllm"}},
			TargetPorts:       []infv1.Port{{Number: 8000}},
			EndpointPickerRef: &infv1.EndpointPickerRef{Name: "epp", Port: &infv1.Port{Number: 9002}},
		},
	}
	if err := e.client.Create(context.Background(), pool); err != nil {
		t.Fatalf("creating InferencePool: %v", err)
	}
	return pool
}

// markDeploymentAvailable plays the Deployment controller (envtest has none): every desired
// replica of the current generation is updated and available.
func (e *testEnv) markDeploymentAvailable(g *WithT, namespace, name string) {
	g.Eventually(func() error { return e.setDeploymentAvailable(namespace, name) }).Should(Succeed())
}

func (e *testEnv) setDeploymentAvailable(namespace, name string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error { return e.trySetDeploymentAvailable(namespace, name) })
}

func (e *testEnv) trySetDeploymentAvailable(namespace, name string) error {
	ctx := context.Background()
	dep := &appsv1.Deployment{}
	if err := e.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, dep); err != nil {
		return err
	}
	n := ptr.Deref(dep.Spec.Replicas, 1)
	dep.Status = appsv1.DeploymentStatus{
		ObservedGeneration: dep.Generation,
		Replicas:           n, UpdatedReplicas: n, ReadyReplicas: n, AvailableReplicas: n,
		Conditions: []appsv1.DeploymentCondition{
			{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable"},
			{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: "NewReplicaSetAvailable"},
		},
	}
	return e.client.Status().Update(ctx, dep)
}

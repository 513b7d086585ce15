//go:build linux

// Package realepp is the real-EPP tier: the real coordinator binary against the real llm-d
// endpoint picker (EPP, llm-d-router cmd/epp) and llm-d's vLLM simulator as every worker (and
// as the render service), with a real kube-apiserver and etcd (envtest) holding the
// InferencePool and one Pod per simulator, whose status the tests set (no kubelet: the EPP
// admits Pods that are Running and Ready with a podIP). Envoy does not run here: the gateway is
// test/doubles/extprocgw, a stand-in written to Envoy's documented ext_proc behaviour, which
// streams each leg through the EPP and forwards it to the endpoint it picks.
//
// The two peer binaries come from LLMD_EPP_BIN and LLMD_SIM_BIN, or, when those are unset,
// from ../shared/peers/llm-d-epp.xz and llm-d-inference-sim.xz beside the repository (the
// layout of the build machines and CI), decompressed with xz into a cache directory
// ($XDG_CACHE_HOME or ~/.cache, epd-coordinator/peers/<digest>); llm-d's CRDs from LLMD_CRDS or
// ../shared/peers/crds. KUBEBUILDER_ASSETS names the
// envtest control plane (`make test` sets it). Without them the tests fail under CI (CI set)
// and are skipped elsewhere (test/harness/prereq). REALEPP_COORDINATOR=/path runs another
// coordinator build; by default ./cmd/coordinator is built once.
package realepp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/epd-dev/coordinator/test/doubles/extprocgw"
	"github.com/epd-dev/coordinator/test/harness/prereq"
	coordinatorproc "github.com/epd-dev/coordinator/test/internal/coordinator"
	"github.com/epd-dev/coordinator/test/internal/loopback"
	"github.com/epd-dev/coordinator/test/internal/peers"
)

// model is the model name every simulator serves.
const model = "Qwen/Qwen3-VL-2B-Instruct"

// Labels and annotations the EPP reads.
const (
	roleLabel        = "llm-d.ai/role"
	poolLabel        = "realepp.epd.dev/pool"
	activePortsAnnot = "llm-d.ai/active-ports"
)

func TestMain(m *testing.M) {
	code := m.Run()
	shared.stop()
	os.Exit(code)
}

// tier is what every test shares: the binaries and one control plane (each test gets its own
// namespace, pool and EPP).
type tier struct {
	once     sync.Once
	missing  string // a prerequisite that is absent (skip outside CI)
	err      error  // a failure setting up
	eppBin   string
	simBin   string
	coordBin string
	binDir   string

	env        *envtest.Environment
	client     client.Client
	kubeconfig string
}

var shared tier

func (s *tier) stop() {
	if s.env != nil {
		_ = s.env.Stop()
	}
	if s.binDir != "" {
		_ = os.RemoveAll(s.binDir)
	}
}

// setup returns the shared tier, failing (CI) or skipping the test when a prerequisite is missing.
func setup(t *testing.T) *tier {
	t.Helper()
	shared.once.Do(shared.init)
	if shared.missing != "" {
		prereq.Missing(t, "%s", shared.missing)
	}
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return &shared
}

func (s *tier) init() {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		s.missing = "KUBEBUILDER_ASSETS is not set: this tier needs a kube-apiserver and etcd. " +
			"Run `make test`, or `KUBEBUILDER_ASSETS=$(hack/setup-envtest-assets.sh) go test ./test/suites/realepp/`."
		return
	}
	dir, err := peers.Dir()
	if err != nil {
		s.err = err
		return
	}
	if s.eppBin, s.missing, s.err = peers.Binary(peers.EPPBinEnv, filepath.Join(dir, "llm-d-epp.xz")); s.missing != "" || s.err != nil {
		return
	}
	if s.simBin, s.missing, s.err = peers.Binary(peers.SimBinEnv, filepath.Join(dir, "llm-d-inference-sim.xz")); s.missing != "" || s.err != nil {
		return
	}
	crds := os.Getenv(peers.CRDsEnv)
	if crds == "" {
		crds = filepath.Join(dir, "crds")
	}
	if matches, _ := filepath.Glob(filepath.Join(crds, "llm-d.ai_*.yaml")); len(matches) == 0 {
		s.missing = fmt.Sprintf("no llm-d CRDs (llm-d.ai_*.yaml) in %s: set %s to llm-d-router's config/crd/bases", crds, peers.CRDsEnv)
		return
	}
	if s.binDir, s.err = os.MkdirTemp("", "realepp-bin-"); s.err != nil {
		return
	}
	if s.coordBin, s.err = coordinatorproc.Binary("REALEPP_COORDINATOR", s.binDir); s.err != nil {
		return
	}
	s.err = s.startAPIServer(crds, assets)
}

// startAPIServer starts kube-apiserver and etcd with the InferencePool CRD and llm-d's CRDs,
// and writes a kubeconfig for the EPP.
func (s *tier) startAPIServer(crds, assets string) error {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api-inference-extension").Output()
	if err != nil {
		return fmt.Errorf("go list -m sigs.k8s.io/gateway-api-inference-extension: %w", err)
	}
	gaie := strings.TrimSpace(string(out))
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := infv1.Install(scheme); err != nil {
		return err
	}
	s.env = &envtest.Environment{
		Scheme:                scheme,
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths: []string{
			filepath.Join(gaie, "config", "crd", "bases", "inference.networking.k8s.io_inferencepools.yaml"),
			crds,
		},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := s.env.Start()
	if err != nil {
		return fmt.Errorf("starting kube-apiserver and etcd: %w", err)
	}
	if s.client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return err
	}
	user, err := s.env.AddUser(envtest.User{Name: "epp", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return err
	}
	s.kubeconfig = filepath.Join(s.binDir, "kubeconfig")
	return os.WriteFile(s.kubeconfig, kc, 0o600)
}

// proc is a peer process the test started.
type proc struct {
	name   string
	cmd    *exec.Cmd
	logs   *loopback.Log
	exited chan struct{}
}

// spawn starts bin with args (and env added to the environment), collecting its output; it is
// killed when the test ends. It may run off the test goroutine.
func spawn(t *testing.T, name, bin string, args []string, env ...string) (*proc, error) {
	p := &proc{name: name, logs: &loopback.Log{}, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(p.kill)
	return p, nil
}

// kill SIGKILLs the process (idempotent) and waits for it.
func (p *proc) kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// waitUntil polls ready (an external process's state) until it holds, the process exits, or
// the deadline passes.
func (p *proc) waitUntil(t *testing.T, what string, timeout time.Duration, ready func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ready() {
		select {
		case <-p.exited:
			t.Fatalf("%s exited before %s:\n%s", p.name, what, p.logs.Tail(4000))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %s within %s:\n%s", p.name, what, timeout, p.logs.Tail(4000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sim is a simulator process and its Pod.
type sim struct {
	*proc
	role string
	pod  string
	port int
	addr string // 127.0.0.1:port, the endpoint the EPP names
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	a, err := loopback.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	_, p, _ := net.SplitHostPort(a)
	n, _ := strconv.Atoi(p)
	return n
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

func httpOK(url string) bool {
	resp, err := httpClient.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// launchSim runs a simulator in echo mode for role (encode, prefill, decode, render) and waits
// until it is healthy. It may run off the test goroutine: failures are returned.
func launchSim(t *testing.T, tr *tier, name, role string, extra ...string) (*sim, error) {
	a, err := loopback.FreeAddr()
	if err != nil {
		return nil, err
	}
	_, ps, _ := net.SplitHostPort(a)
	port, _ := strconv.Atoi(ps)
	args := []string{"--model", model, "--port", ps, "--mode", "echo", "--force-dummy-tokenizer",
		"--max-num-seqs", "256", "--max-model-len", "131072", "--max-request-body-size-mb", "64"}
	if role == "encode" {
		args = append(args, "--mm-encoder-only", "--no-enable-prefix-caching")
	}
	args = append(args, extra...)
	p, err := spawn(t, name, tr.simBin, args)
	if err != nil {
		return nil, err
	}
	s := &sim{proc: p, role: role, pod: name, port: port, addr: net.JoinHostPort("127.0.0.1", ps)}
	for deadline := time.Now().Add(20 * time.Second); !httpOK("http://" + s.addr + "/health"); {
		select {
		case <-p.exited:
			return nil, fmt.Errorf("simulator %s exited:\n%s", name, p.logs.Tail(3000))
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("simulator %s not healthy in 20s:\n%s", name, p.logs.Tail(3000))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return s, nil
}

// stackOptions shape one test's stack.
type stackOptions struct {
	encode, prefill, decode int
	render                  bool
	// decodePicks is the decode profile picker's maxNumOfEndpoints (0: the default, 1).
	decodePicks int
	// retry is the stand-in gateway's route retry policy (nil: none).
	retry *extprocgw.RetryPolicy
	// steps are the pipeline's steps (YAML flow sequence items; %RENDER% is replaced by the
	// render service's URL).
	steps string
	// kv is the pipeline's kv_connector (default kv-nixl).
	kv string
	// simArgs are extra simulator flags for every worker.
	simArgs []string
}

// stack is one test's system: a namespace with a pool, its Pods, the simulators, the EPP, the
// gateway stand-in and the coordinator.
type stack struct {
	t      *testing.T
	tr     *tier
	ns     string
	sims   []*sim
	render *sim
	epp    *proc
	// eppGRPC is the EPP's ext_proc address, eppMetrics its metrics URL.
	eppGRPC, eppMetrics string
	gw                  *extprocgw.Gateway
	coord               *coordinatorproc.Process
	client              openai.Client
}

var nsCounter struct {
	sync.Mutex
	n int
}

func startStack(t *testing.T, o stackOptions) *stack {
	t.Helper()
	tr := setup(t)
	ctx := context.Background()
	nsCounter.Lock()
	nsCounter.n++
	ns := fmt.Sprintf("realepp-%d", nsCounter.n)
	nsCounter.Unlock()
	st := &stack{t: t, tr: tr, ns: ns}
	if err := tr.client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}

	// Simulators first (their ports go in the pool), started in parallel.
	type want struct{ role, name string }
	var wants []want
	for _, r := range []struct {
		role string
		n    int
	}{{"encode", o.encode}, {"prefill", o.prefill}, {"decode", o.decode}} {
		for i := range r.n {
			wants = append(wants, want{r.role, fmt.Sprintf("%s-%d", r.role, i)})
		}
	}
	if o.render {
		wants = append(wants, want{"render", "render"})
	}
	sims := make([]*sim, len(wants))
	errs := make([]error, len(wants))
	var wg sync.WaitGroup
	for i, w := range wants {
		var extra []string
		if w.role != "render" {
			extra = o.simArgs
		}
		wg.Go(func() { sims[i], errs[i] = launchSim(t, tr, w.name, w.role, extra...) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, s := range sims {
		if s.role == "render" {
			st.render = s
		} else {
			st.sims = append(st.sims, s)
		}
	}

	// The pool over every simulator's port, and one Running, Ready Pod per simulator.
	pool := &infv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: ns},
		Spec: infv1.InferencePoolSpec{
			Selector:          infv1.LabelSelector{MatchLabels: map[infv1.LabelKey]infv1.LabelValue{poolLabel: "pool"}},
			EndpointPickerRef: &infv1.EndpointPickerRef{Name: "epp", Port: &infv1.Port{Number: 9002}},
		},
	}
	for _, s := range st.sims {
		pool.Spec.TargetPorts = append(pool.Spec.TargetPorts, infv1.Port{Number: infv1.PortNumber(s.port)})
	}
	if err := tr.client.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for _, s := range st.sims {
		st.createPod(s)
	}

	st.startEPP(o)
	gw, err := extprocgw.Start(extprocgw.Config{EPP: st.eppGRPC, Retry: o.retry, RecordBodies: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	st.gw = gw

	steps := o.steps
	if st.render != nil {
		steps = strings.ReplaceAll(steps, "%RENDER%", "http://"+st.render.addr)
	}
	// The workers listen on 127.0.0.1: the picker names loopback endpoints.
	gwYAML := "address: " + gw.URL() + ", allowed_hint_networks: [127.0.0.0/8]"
	kv := o.kv
	if kv == "" {
		kv = "kv-nixl"
	}
	pipe := "kv_connector: " + kv + ", ec_connector: ec-nixl, steps: [" + steps + "]"
	st.coord = coordinatorproc.Start(t, tr.coordBin, func(addr, adminPort string) string {
		return fmt.Sprintf("log_level: 3\nserver: {listen_addr: %q, metrics_port: %s}\ngateway: {%s}\npipeline: {%s}\n", addr, adminPort, gwYAML, pipe)
	})
	st.client = openai.NewClient(option.WithBaseURL(st.coord.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("EPP log:\n%s", st.epp.logs.Tail(6000))
			t.Logf("coordinator log:\n%s", st.coord.Logs.Tail(6000))
		}
	})
	return st
}

// createPod creates s's Pod and makes it Running and Ready with podIP 127.0.0.1.
func (st *stack) createPod(s *sim) {
	st.t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.pod, Namespace: st.ns,
			Labels:      map[string]string{poolLabel: "pool", roleLabel: s.role},
			Annotations: map[string]string{activePortsAnnot: strconv.Itoa(s.port)},
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "vllm", Image: "ghcr.io/llm-d/llm-d-inference-sim:v0.10.2",
			Ports: []corev1.ContainerPort{{ContainerPort: int32(s.port)}},
		}}},
	}
	if err := st.tr.client.Create(ctx, pod); err != nil {
		st.t.Fatal(err)
	}
	st.setReady(s, true)
}

// setReady sets s's Pod status: Running with podIP 127.0.0.1, Ready or not.
func (st *stack) setReady(s *sim, ready bool) {
	st.t.Helper()
	ctx := context.Background()
	cond := corev1.ConditionFalse
	if ready {
		cond = corev1.ConditionTrue
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod := &corev1.Pod{}
		if err := st.tr.client.Get(ctx, client.ObjectKey{Namespace: st.ns, Name: s.pod}, pod); err != nil {
			return err
		}
		now := metav1.Now()
		pod.Status.Phase = corev1.PodRunning
		pod.Status.PodIP = "127.0.0.1"
		pod.Status.PodIPs = []corev1.PodIP{{IP: "127.0.0.1"}}
		pod.Status.HostIP = "127.0.0.1"
		pod.Status.StartTime = &now
		pod.Status.Conditions = []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: cond, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: cond, LastTransitionTime: now},
		}
		return st.tr.client.Status().Update(ctx, pod)
	})
	if err != nil {
		st.t.Fatal(err)
	}
}

// eppConfig is the EndpointPickerConfig of the coordinator topology: one pool over encode,
// prefill and decode pods, one profile per role, chosen by the EPP-Profile header; prefix-aware
// decode scheduling (which conditional decode needs). decodePicks is the decode picker's
// maxNumOfEndpoints: the length of the pick's list (primary first, then fallbacks).
func eppConfig(decodePicks int) string {
	if decodePicks < 1 {
		decodePicks = 1
	}
	return fmt.Sprintf(`apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: openai-parser
- type: vllmhttp-parser
- type: encode-filter
- type: prefill-filter
- type: label-selector-filter
  name: decode-filter
  parameters:
    matchExpressions:
    - key: llm-d.ai/role
      operator: In
      values: ["decode", "prefill-decode", "encode-prefill-decode"]
- type: queue-scorer
- type: approx-prefix-cache-producer
- type: prefix-cache-scorer
- type: max-score-picker
- type: max-score-picker
  name: decode-picker
  parameters:
    maxNumOfEndpoints: %d
- type: header-profile-handler
requestHandler:
  parsers:
  - pluginRef: openai-parser
  - pluginRef: vllmhttp-parser
schedulingProfiles:
- name: encode
  plugins:
  - pluginRef: encode-filter
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: decode-picker
`, decodePicks)
}

// startEPP runs the EPP for the stack's pool and waits until it serves with every Pod admitted.
func (st *stack) startEPP(o stackOptions) {
	t := st.t
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "epp.yaml")
	if err := os.WriteFile(cfg, []byte(eppConfig(o.decodePicks)), 0o644); err != nil {
		t.Fatal(err)
	}
	grpcPort, healthPort, metricsPort := freePort(t), freePort(t), freePort(t)
	st.eppGRPC = net.JoinHostPort("127.0.0.1", strconv.Itoa(grpcPort))
	st.eppMetrics = fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	var err error
	st.epp, err = spawn(t, "epp", st.tr.eppBin, []string{
		"--pool-name", "pool", "--pool-namespace", st.ns, "--config-file", cfg,
		"--grpc-port", strconv.Itoa(grpcPort), "--grpc-health-port", strconv.Itoa(healthPort),
		"--metrics-port", strconv.Itoa(metricsPort), "--metrics-endpoint-auth=false", "--refresh-prometheus-metrics-interval", "200ms",
		"--allow-experimental-plugins", "--tracing=false",
	}, "KUBECONFIG="+st.tr.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(net.JoinHostPort("127.0.0.1", strconv.Itoa(healthPort)), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	st.epp.waitUntil(t, "ext_proc SERVING", 60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ext_proc.v3.ExternalProcessor"})
		return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
	// The health service reports SERVING once the datastore synced, which can be before the
	// ext_proc server listens.
	st.epp.waitUntil(t, "the ext_proc listener", 30*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", st.eppGRPC, time.Second)
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	})
	st.waitReadyPods(len(st.sims))
}

// readyPods reads the EPP's count of ready endpoints from its metrics.
func (st *stack) readyPods() int {
	resp, err := httpClient.Get(st.eppMetrics)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(line, "inference_pool_ready_pods{") {
			f := strings.Fields(line)
			n, _ := strconv.ParseFloat(f[len(f)-1], 64)
			return int(n)
		}
	}
	return -1
}

// waitReadyPods waits until the EPP counts n ready endpoints.
func (st *stack) waitReadyPods(n int) {
	st.t.Helper()
	st.epp.waitUntil(st.t, fmt.Sprintf("%d ready pods", n), 30*time.Second, func() bool { return st.readyPods() == n })
}

// byRole returns the stack's simulators of role.
func (st *stack) byRole(role string) []*sim {
	var out []*sim
	for _, s := range st.sims {
		if s.role == role {
			out = append(out, s)
		}
	}
	return out
}

// podOf names the Pod behind endpoint (ip:port), or "".
func (st *stack) podOf(endpoint string) string {
	for _, s := range st.sims {
		if s.addr == endpoint {
			return s.pod
		}
	}
	return ""
}

// Package node is the real-node tier (#32): the operator installed from its kustomize installer
// into a real single-node Kubernetes (test/harness/node: real kubelet, containerd, runc, bridge CNI,
// kube-proxy, CoreDNS), its images built without Docker, llm-d's vLLM simulator pods as the
// InferencePool's workers, and every check made through the real coordinator Service: requests
// served, a pipeline edit hot-reloaded through the kubelet's ConfigMap swap under load, rollouts
// of each kind under load (bin/steadyload: 0 failed requests), `kubectl get cpl` columns at each
// step, the restricted Pod Security profile enforced, the PodDisruptionBudget and HTTPRoute
// accepted, and a scale that replaces no pod. docs/node.md lists the checks and their figures.
package node

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
	"github.com/epd-dev/coordinator/internal/controller"
	"github.com/epd-dev/coordinator/test/harness/node"
)

const (
	ns       = "node-e2e"
	cplName  = "epd"
	simModel = "sim-model"
)

// suite is the running tier.
type suite struct {
	t    *testing.T
	ctx  context.Context
	root string
	bin  string
	c    *node.Cluster
	k    client.Client
	// url is the coordinator Service's URL through its ClusterIP (the host reaches ClusterIPs
	// through kube-proxy's rules like a pod does).
	url string
	// timedOut is the last wait that timed out, repeated as the run's last line so a log cut to
	// its tail still says what failed.
	timedOut string
}

func TestNode(t *testing.T) {
	node.Require(t)
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	s := &suite{t: t, ctx: context.Background(), root: root, bin: t.TempDir()}
	// llm-d's simulator: LLMD_SIM_BIN (as test/suites/realepp), else ../shared/peers beside the
	// repository.
	simXZ := os.Getenv("LLMD_SIM_BIN")
	if simXZ == "" {
		simXZ = filepath.Join(root, "..", "shared", "peers", "llm-d-inference-sim.xz")
	}
	start := time.Now()
	imgs, err := node.ProjectImages(root, s.bin, simXZ)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("go", "build", "-C", root, "-o", filepath.Join(s.bin, "steadyload"), "./test/harness/endpoints/cmd/steadyload").CombinedOutput(); err != nil {
		t.Fatalf("building steadyload: %v\n%s", err, out)
	}
	t.Logf("binaries built in %s", time.Since(start).Round(time.Millisecond))
	before, err := node.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Registered before StartT's Stop, so it runs after it (cleanups run last first).
	t.Cleanup(func() {
		if s.timedOut != "" {
			t.Logf("FAILED: %s", s.timedOut)
		}
		if left := node.Leftovers(node.DefaultDir, before); len(left) > 0 {
			t.Errorf("the host is not clean after the cluster stopped: %v", left)
		} else {
			t.Logf("FIGURE host clean after Stop (processes, mounts, bridge, iptables chains, sysctls, cgroups, paths)")
		}
	})
	start = time.Now()
	s.c = node.StartT(t, node.Options{Root: root, Images: imgs})
	t.Logf("FIGURE cluster up (images imported, CoreDNS answering) in %s", time.Since(start).Round(time.Millisecond))
	if s.k, err = client.New(s.c.Config, client.Options{Scheme: controller.NewScheme()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			s.dumpState()
		}
	})
	steps := []struct {
		name string
		run  func(*testing.T)
	}{
		{"ImagesAsTheDockerfilesSay", s.images},
		{"InstallFromKustomizeInstaller", s.install},
		{"RequestsServedThroughTheService", s.served},
		{"HotReloadUnderLoad", s.hotReload},
		{"RolloutsUnderLoad", s.rollouts},
		{"RestartThenScaleReplacesNone", s.restartThenScale},
		{"RestrictedPodSecurityEnforced", s.restricted},
		{"DisruptionBudgetAndRouteAccepted", s.exposure},
		{"CanarySplit", s.canary},
		{"RejectingAndCrashLoopingPods", s.rejectAndCrash},
		{"InstallFromHelmChart", s.helmInstall},
	}
	for _, st := range steps {
		if !t.Run(st.name, func(t *testing.T) { s.t = t; st.run(t) }) {
			t.FailNow()
		}
	}
}

// dumpState logs what helps to understand a failure: pods, events and the operator's log.
func (s *suite) dumpState() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"get", "pods", "-A", "-o", "wide"},
		{"get", "cpl", "-A", "-o", "wide"},
		{"get", "events", "-A", "--sort-by=.lastTimestamp"},
		{"logs", "-n", "coordinator-system", "deploy/coordinator-controller-manager", "--tail=60"},
	} {
		out, err := s.c.Kubectl(ctx, nil, args...)
		fmt.Fprintf(os.Stderr, "--- kubectl %s\n%s%v\n", strings.Join(args, " "), out, errOrEmpty(err))
	}
	fmt.Fprintf(os.Stderr, "--- kubelet log\n%s\n", s.c.Log("kubelet", 40))
}

func errOrEmpty(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// waitFor polls cond every 100ms until it returns nil, failing the test after timeout with cond's
// last error.
func (s *suite) waitFor(what string, timeout time.Duration, cond func() error) time.Duration {
	s.t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			s.timedOut = fmt.Sprintf("%s: timed out after %s waiting for %s: %.300v", s.t.Name(), timeout, what, err)
			s.t.Fatal(s.timedOut)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *suite) kubectl(stdin []byte, args ...string) string {
	s.t.Helper()
	out, err := s.c.Kubectl(s.ctx, stdin, args...)
	if err != nil {
		s.t.Fatal(err)
	}
	return out
}

// images: the imported images carry the Dockerfiles' user, labels (the configuration schema
// label included), entrypoint and cmd, as containerd reports them through the kubelet's CRI view.
func (s *suite) images(t *testing.T) {
	labels, err := node.DockerfileLabels(filepath.Join(s.root, "Dockerfile.coordinator"))
	if err != nil {
		t.Fatal(err)
	}
	if labels["coordinator.epd.dev/config-schema"] == "" {
		t.Fatalf("Dockerfile.coordinator has no config-schema label: %v", labels)
	}
	for _, ref := range []string{node.CoordinatorImage, node.OperatorImage, node.SimImage, node.PauseImage, node.CoreDNSImage} {
		out, err := exec.Command("ctr", "--address", filepath.Join(s.c.Dir, "containerd", "containerd.sock"), "-n", "k8s.io", "images", "ls", "-q", "name=="+ref).Output()
		if err != nil || strings.TrimSpace(string(out)) != ref {
			t.Fatalf("image %s not in containerd: %q %v", ref, out, err)
		}
	}
	cfg := s.imageConfig(t, node.CoordinatorImage)
	if cfg.User != "65532:65532" || !slices.Equal(cfg.Entrypoint, []string{"/coordinator"}) ||
		!slices.Equal(cfg.Cmd, []string{"--config", "/etc/coordinator/coordinator.yaml"}) {
		t.Fatalf("coordinator image config: user %q entrypoint %q cmd %q", cfg.User, cfg.Entrypoint, cfg.Cmd)
	}
	for k, v := range labels {
		if cfg.Labels[k] != v {
			t.Fatalf("coordinator image label %s = %q, Dockerfile.coordinator says %q", k, cfg.Labels[k], v)
		}
	}
	t.Logf("coordinator image: user %s, labels %v", cfg.User, cfg.Labels)
	op := s.imageConfig(t, node.OperatorImage)
	if op.User != "65532:65532" || !slices.Equal(op.Entrypoint, []string{"/manager"}) || op.Labels["org.opencontainers.image.title"] != "coordinator-operator" {
		t.Fatalf("operator image config: user %q entrypoint %q labels %v", op.User, op.Entrypoint, op.Labels)
	}
}

type imageConfig struct {
	User       string            `json:"User"`
	Entrypoint []string          `json:"Entrypoint"`
	Cmd        []string          `json:"Cmd"`
	Labels     map[string]string `json:"Labels"`
}

// imageConfig reads an imported image's config blob from containerd's content store.
func (s *suite) imageConfig(t *testing.T, ref string) imageConfig {
	t.Helper()
	ctr := func(args ...string) []byte {
		out, err := exec.Command("ctr", append([]string{"--address", filepath.Join(s.c.Dir, "containerd", "containerd.sock"), "-n", "k8s.io"}, args...)...).Output()
		if err != nil {
			t.Fatalf("ctr %v: %v", args, err)
		}
		return out
	}
	var manifest struct {
		Config struct {
			Digest string `json:"digest"`
		} `json:"config"`
	}
	// `ctr images ls` prints REF TYPE DIGEST ...: the manifest's digest.
	fields := strings.Fields(strings.Split(strings.TrimSpace(string(ctr("images", "ls", "name=="+ref))), "\n")[1])
	if err := json.Unmarshal(ctr("content", "get", fields[2]), &manifest); err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Config imageConfig `json:"config"`
	}
	if err := json.Unmarshal(ctr("content", "get", manifest.Config.Digest), &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg.Config
}

// install: the CRDs the operator works with (GAIE's InferencePool, Gateway API's Gateway and
// HTTPRoute), the operator from `make build-installer` applied with kubectl, the namespace with the
// restricted Pod Security profile enforced, the simulator workers and their InferencePool, and the
// CoordinatorPipeline; then the pipeline's pods Ready and its status columns.
func (s *suite) install(t *testing.T) {
	gaie := goModDir(t, s.root, "sigs.k8s.io/gateway-api-inference-extension")
	gwapi := goModDir(t, s.root, "sigs.k8s.io/gateway-api")
	for _, f := range []string{
		filepath.Join(gaie, "config", "crd", "bases", "inference.networking.k8s.io_inferencepools.yaml"),
		filepath.Join(gwapi, "config", "crd", "standard", "gateway.networking.k8s.io_gateways.yaml"),
		filepath.Join(gwapi, "config", "crd", "standard", "gateway.networking.k8s.io_httproutes.yaml"),
	} {
		s.kubectl(nil, "apply", "--server-side", "-f", f)
	}
	installer := filepath.Join(s.bin, "install.yaml")
	mk := exec.Command("make", "--no-print-directory", "-C", s.root, "build-installer", "INSTALLER="+installer,
		"IMG="+node.OperatorImage, "COORDINATOR_IMG="+node.CoordinatorImage)
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make build-installer: %v\n%s", err, out)
	}
	// The canary's counts reach status.revisions every 2s instead of 30s (the manager's
	// --canary-status-interval), so that the canary check need not wait.
	b, err := os.ReadFile(installer)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^(\s*)- --health-probe-bind-address=:8081$`)
	if !re.Match(b) {
		t.Fatalf("the installer has no --health-probe-bind-address=:8081 argument")
	}
	b = re.ReplaceAll(b, []byte("$0\n$1- --canary-status-interval=2s"))
	if err := os.WriteFile(installer, b, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s.kubectl(nil, "apply", "--server-side", "-f", installer)
	s.kubectl(nil, "wait", "--for=condition=Established", "crd/coordinatorpipelines.coordinator.epd.dev", "--timeout=60s")
	s.kubectl(nil, "-n", "coordinator-system", "rollout", "status", "deployment/coordinator-controller-manager", "--timeout=120s")
	t.Logf("FIGURE operator Ready %s after kubectl apply", time.Since(start).Round(time.Millisecond))

	s.kubectl([]byte(fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: %s
  labels:
    pod-security.kubernetes.io/enforce: restricted
    pod-security.kubernetes.io/enforce-version: latest
`, ns)), "apply", "-f", "-")
	s.createSimulators(t)

	s.createPipeline(t)
}

// createPipeline creates the CoordinatorPipeline (2 replicas, decode through the simulator
// Service by its DNS name, the default drain delay), waits for READY 2/2 and UPDATED 2, and
// points the suite at its Service's ClusterIP, checking that the status URL's name resolves to it
// through CoreDNS.
func (s *suite) createPipeline(t *testing.T) {
	cp := &coordinatorv1alpha1.CoordinatorPipeline{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cplName},
		Spec: coordinatorv1alpha1.CoordinatorPipelineSpec{
			Replicas:         ptr.To[int32](2),
			InferencePoolRef: coordinatorv1alpha1.InferencePoolReference{Name: "sim-pool"},
			// The simulator Service by its DNS name: the coordinator pods resolve it with CoreDNS.
			Gateway: coordinatorv1alpha1.GatewaySpec{Address: fmt.Sprintf("http://sim.%s.svc.cluster.local:%d", ns, node.SimPort)},
			Pipeline: coordinatorv1alpha1.PipelineSpec{
				KVConnector: "kv-nixl",
				Steps:       []coordinatorv1alpha1.PipelineStep{{Type: "decode"}},
			},
			// The default drain delay (5s): what a user gets.
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("32Mi")}},
		},
	}
	start := time.Now()
	if err := s.k.Create(s.ctx, cp); err != nil {
		t.Fatal(err)
	}
	got := s.waitColumns("the pipeline Ready with 2 pods serving its revision", 120*time.Second, "2/2", "2")
	t.Logf("FIGURE CoordinatorPipeline created -> READY 2/2, UPDATED 2: %s; kubectl get cpl: %v", time.Since(start).Round(time.Millisecond), got)
	if got["URL"] != fmt.Sprintf("http://%s.%s.svc:8080", cplName, ns) {
		t.Fatalf("URL column %q", got["URL"])
	}
	var svc corev1.Service
	if err := s.k.Get(s.ctx, client.ObjectKey{Namespace: ns, Name: cplName}, &svc); err != nil {
		t.Fatal(err)
	}
	s.url = "http://" + net.JoinHostPort(svc.Spec.ClusterIP, "8080")
	// The status URL's name resolves, through CoreDNS, to that ClusterIP.
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort(node.DNSServiceIP, "53"))
	}}
	addrs, err := r.LookupHost(s.ctx, fmt.Sprintf("%s.%s.svc.cluster.local", cplName, ns))
	if err != nil || len(addrs) != 1 || addrs[0] != svc.Spec.ClusterIP {
		t.Fatalf("%s.%s.svc.cluster.local = %v (%v), want %s", cplName, ns, addrs, err, svc.Spec.ClusterIP)
	}
}

func goModDir(t *testing.T, root, module string) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-C", root, "-m", "-f", "{{.Dir}}", module).Output()
	if err != nil {
		t.Fatalf("go list -m %s: %v", module, err)
	}
	return strings.TrimSpace(string(out))
}

// restrictedContainer is a security context the restricted Pod Security profile admits.
func restrictedContainer() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		RunAsNonRoot:             ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// createSimulators runs two simulator pods (Deployment sim, Service sim) and the InferencePool
// sim-pool over them, and waits until both are Ready.
func (s *suite) createSimulators(t *testing.T) {
	labels := map[string]string{"app": "sim"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sim"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{
						Name: "sim", Image: node.SimImage,
						Args: []string{"--model", simModel, "--mode", "echo", "--force-dummy-tokenizer",
							"--max-num-seqs", "64", "--inter-token-latency", "2ms", "--time-to-first-token", "5ms"},
						Ports:           []corev1.ContainerPort{{Name: "http", ContainerPort: node.SimPort}},
						ReadinessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt32(node.SimPort)}}, PeriodSeconds: 1},
						SecurityContext: restrictedContainer(),
					}},
				},
			},
		},
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sim"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "http", Port: node.SimPort, TargetPort: intstr.FromInt32(node.SimPort)}}},
	}
	pool := &infv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sim-pool"},
		Spec: infv1.InferencePoolSpec{
			Selector:          infv1.LabelSelector{MatchLabels: map[infv1.LabelKey]infv1.LabelValue{"app": "sim"}},
			TargetPorts:       []infv1.Port{{Number: node.SimPort}},
			EndpointPickerRef: &infv1.EndpointPickerRef{Name: "sim-epp", Port: &infv1.Port{Number: 9002}},
		},
	}
	for _, o := range []client.Object{dep, svc, pool} {
		if err := s.k.Create(s.ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	d := s.waitFor("2 simulator pods Ready", 90*time.Second, func() error {
		var got appsv1.Deployment
		if err := s.k.Get(s.ctx, client.ObjectKeyFromObject(dep), &got); err != nil {
			return err
		}
		if got.Status.ReadyReplicas != 2 {
			return fmt.Errorf("%d ready", got.Status.ReadyReplicas)
		}
		return nil
	})
	t.Logf("FIGURE simulator Deployment created -> 2 Ready pods: %s", d.Round(time.Millisecond))
}

// columns runs `kubectl get cpl NAME -o wide` and returns its columns by header.
func (s *suite) columns() (map[string]string, error) {
	out, err := s.c.Kubectl(s.ctx, nil, "get", "cpl", cplName, "-n", ns, "-o", "wide")
	if err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		return nil, fmt.Errorf("kubectl get cpl printed %q", out)
	}
	// Columns are left-aligned at the header's word positions.
	header := lines[0]
	var starts []int
	for i := 0; i < len(header); i++ {
		if header[i] != ' ' && (i == 0 || header[i-1] == ' ') {
			starts = append(starts, i)
		}
	}
	cols := map[string]string{}
	for j, st := range starts {
		end := len(lines[1])
		if j+1 < len(starts) && starts[j+1] < end {
			end = starts[j+1]
		}
		name := strings.TrimSpace(header[st:min(len(header), func() int {
			if j+1 < len(starts) {
				return starts[j+1]
			}
			return len(header)
		}())])
		if st < len(lines[1]) {
			cols[name] = strings.TrimSpace(lines[1][st:end])
		} else {
			cols[name] = ""
		}
	}
	return cols, nil
}

// waitColumns waits until `kubectl get cpl` shows READY ready, UPDATED updated, STATUS True and
// ROLLOUT RolledOut, at the CR's current generation (the status observed it), and returns the
// columns.
func (s *suite) waitColumns(what string, timeout time.Duration, ready, updated string) map[string]string {
	s.t.Helper()
	var cols map[string]string
	s.waitFor(what, timeout, func() error {
		var cp coordinatorv1alpha1.CoordinatorPipeline
		if err := s.k.Get(s.ctx, client.ObjectKey{Namespace: ns, Name: cplName}, &cp); err != nil {
			return err
		}
		ro := meta.FindStatusCondition(cp.Status.Conditions, string(coordinatorv1alpha1.ConditionRolledOut))
		if cp.Status.ObservedGeneration != cp.Generation || ro == nil || ro.ObservedGeneration != cp.Generation {
			return fmt.Errorf("status at generation %d, spec at %d", cp.Status.ObservedGeneration, cp.Generation)
		}
		var err error
		if cols, err = s.columns(); err != nil {
			return err
		}
		if cols["READY"] != ready || cols["UPDATED"] != updated || cols["STATUS"] != "True" || cols["ROLLOUT"] != "RolledOut" || cols["URL"] == "" {
			return fmt.Errorf("kubectl get cpl: %v (RolledOut: %s)", cols, ro.Message)
		}
		return nil
	})
	return cols
}

// load is a running bin/steadyload.
type load struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr bytes.Buffer
}

type loadResult struct {
	Served   int      `json:"served"`
	Failed   int      `json:"failed"`
	Failures []string `json:"failures"`
	Retried  int      `json:"retried"`
	Retries  []string `json:"retries"`
}

func (s *suite) startLoad(stream bool) *load {
	s.t.Helper()
	l := &load{}
	args := []string{"--url", s.url, "--clients", "4", "--model", simModel}
	if stream {
		args = append(args, "--stream")
	}
	l.cmd = exec.Command(filepath.Join(s.bin, "steadyload"), args...)
	l.cmd.Stdout, l.cmd.Stderr = &l.stdout, &l.stderr
	if err := l.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = l.cmd.Process.Kill(); _ = l.cmd.Wait() })
	return l
}

// stop ends the load (SIGINT) and returns its counts.
func (l *load) stop(t *testing.T) loadResult {
	t.Helper()
	_ = l.cmd.Process.Signal(syscall.SIGINT)
	_ = l.cmd.Wait()
	var r loadResult
	if err := json.Unmarshal(l.stdout.Bytes(), &r); err != nil {
		t.Fatalf("steadyload printed %q (%v), stderr %s", l.stdout.String(), err, l.stderr.String())
	}
	return r
}

// underLoad runs change under a non-streaming and a streaming load, waits for done and checks
// that no request failed. A request answered nothing on a kept-alive connection the server
// closed is sent again, as the OpenAI SDKs do, and counted apart (endpoints.ErrStaleConnection).
func (s *suite) underLoad(what string, change func(), done func()) {
	t := s.t
	t.Helper()
	plain, stream := s.startLoad(false), s.startLoad(true)
	start := time.Now()
	change()
	done()
	took := time.Since(start)
	p, st := plain.stop(t), stream.stop(t)
	t.Logf("FIGURE %s: done in %s; load non-stream served %d failed %d retried %d, stream served %d failed %d retried %d",
		what, took.Round(time.Millisecond), p.Served, p.Failed, p.Retried, st.Served, st.Failed, st.Retried)
	if p.Retried+st.Retried > 0 {
		t.Logf("%s: sent again after a kept-alive connection closed unanswered: non-stream %v, stream %v", what, p.Retries, st.Retries)
	}
	if p.Failed != 0 || st.Failed != 0 {
		t.Fatalf("%s: requests failed: non-stream %v, stream %v", what, p.Failures, st.Failures)
	}
	if p.Served < 10 || st.Served < 10 {
		t.Fatalf("%s: the loads served too little to count (non-stream %d, stream %d)", what, p.Served, st.Served)
	}
}

// served: chat completions, non-streaming and streaming, through the Service's ClusterIP, each
// answered by the simulator through the coordinator (the echo of the prompt).
func (s *suite) served(t *testing.T) {
	// READY 2/2 does not say kube-proxy has programmed the new Service yet: wait for the first
	// answer through the ClusterIP, counting what came before it. Until kube-proxy's rules exist,
	// the ClusterIP is routed like any address: out of the host, where this sandbox's egress
	// answers any HTTP request 404 with an empty body and keeps the connection alive; in a cluster
	// it times out. Each probe therefore dials anew (no keep-alive): a pooled connection to the
	// egress would keep answering 404 after kube-proxy's rules exist, since they only steer new
	// connections (CI failed the tier that way once).
	probe := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var early []string
	d := s.waitFor("the first answer through the Service's ClusterIP", 30*time.Second, func() error {
		resp, err := probe.Get(s.url + "/readyz")
		if err != nil {
			early = append(early, err.Error())
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			early = append(early, resp.Status)
			return fmt.Errorf("GET /readyz: %s", resp.Status)
		}
		return nil
	})
	t.Logf("FIGURE the Service answered %s after READY (before: %d failures %v)", d.Round(time.Millisecond), len(early), early[:min(len(early), 3)])
	for _, stream := range []bool{false, true} {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":5,"stream":%t,"messages":[{"role":"user","content":"hello node"}]}`, simModel, stream)
		start := time.Now()
		resp, err := http.Post(s.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "hello") {
			t.Fatalf("stream=%t: HTTP %d: %s", stream, resp.StatusCode, b)
		}
		t.Logf("FIGURE request through the Service (stream=%t): HTTP 200 in %s: %.160s", stream, time.Since(start).Round(time.Millisecond), b)
	}
	r := exec.Command(filepath.Join(s.bin, "steadyload"), "--url", s.url, "--requests", "200", "--model", simModel)
	out, err := r.Output()
	if err != nil {
		t.Fatalf("steadyload 200 requests: %v: %s", err, out)
	}
	t.Logf("FIGURE 200 requests through the Service: %s", bytes.TrimSpace(out))
}

func (s *suite) pipeline() *coordinatorv1alpha1.CoordinatorPipeline {
	s.t.Helper()
	var cp coordinatorv1alpha1.CoordinatorPipeline
	if err := s.k.Get(s.ctx, client.ObjectKey{Namespace: ns, Name: cplName}, &cp); err != nil {
		s.t.Fatal(err)
	}
	return &cp
}

// edit changes the pipeline's spec with a merge patch built from edit.
func (s *suite) edit(edit func(*coordinatorv1alpha1.CoordinatorPipelineSpec)) {
	s.t.Helper()
	cp := s.pipeline()
	orig := cp.DeepCopy()
	edit(&cp.Spec)
	if err := s.k.Patch(s.ctx, cp, client.MergeFrom(orig)); err != nil {
		s.t.Fatal(err)
	}
}

// coordinatorPods returns the names of the pipeline's pods that are not being deleted.
func (s *suite) coordinatorPods() []string {
	s.t.Helper()
	var pods corev1.PodList
	if err := s.k.List(s.ctx, &pods, client.InNamespace(ns), client.MatchingLabels{controller.LabelInstance: cplName}); err != nil {
		s.t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			names = append(names, p.Name)
		}
	}
	sort.Strings(names)
	return names
}

func (s *suite) deployment() *appsv1.Deployment {
	s.t.Helper()
	var d appsv1.Deployment
	if err := s.k.Get(s.ctx, client.ObjectKey{Namespace: ns, Name: cplName}, &d); err != nil {
		s.t.Fatal(err)
	}
	return &d
}

// hotReload: a pipeline edit (decode -> prefill, decode) under load reaches both pods through the
// kubelet's ConfigMap swap and their in-place reload: the same pods, the pod template unchanged,
// READY/UPDATED back at 2/2 and 2 with the new steps, no request failed.
func (s *suite) hotReload(t *testing.T) {
	pods := s.coordinatorPods()
	tmplGen := s.deployment().Generation
	before := s.pipeline().Status.ConfigRevision
	var cols map[string]string
	s.underLoad("pipeline edit (decode -> prefill,decode) hot-reloaded", func() {
		s.edit(func(sp *coordinatorv1alpha1.CoordinatorPipelineSpec) {
			sp.Pipeline.Steps = []coordinatorv1alpha1.PipelineStep{{Type: "prefill"}, {Type: "decode"}}
		})
	}, func() {
		cols = s.waitColumns("both pods serving the edited pipeline", 90*time.Second, "2/2", "2")
	})
	if cols["REVISION"] == before || cols["STEPS"] != "prefill,decode" {
		t.Fatalf("after the edit: %v (revision before %s)", cols, before)
	}
	if got := s.coordinatorPods(); !slices.Equal(got, pods) {
		t.Fatalf("the reload replaced pods: %v -> %v", pods, got)
	}
	if g := s.deployment().Generation; g != tmplGen {
		t.Fatalf("the Deployment changed (generation %d -> %d) for a reloadable edit", tmplGen, g)
	}
	t.Logf("kubectl get cpl after the reload: %v", cols)
}

// rollDone waits until the Deployment finished rolling out (kubectl rollout status) and the
// pipeline's columns are back at READY 2/2 (or want) and UPDATED.
func (s *suite) rollDone(want int) {
	s.t.Helper()
	s.kubectl(nil, "-n", ns, "rollout", "status", "deployment/"+cplName, "--timeout=180s")
	s.waitColumns("the pipeline rolled out", 120*time.Second, fmt.Sprintf("%d/%d", want, want), fmt.Sprint(want))
}

// rollouts: `kubectl rollout restart`, a resource edit and a server settings edit, each under a
// non-streaming and a streaming load, each NODE_ROLLOUTS times in a row (default 1; docs/node.md
// gives the figures of a run with 10): the Deployment replaces every pod (readiness, the
// coordinator's drain on SIGTERM) and no request fails.
func (s *suite) rollouts(t *testing.T) {
	repeat := 1
	if v := os.Getenv("NODE_ROLLOUTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("NODE_ROLLOUTS=%q: want a positive count", v)
		}
		repeat = n
	}
	kinds := []struct {
		what   string
		change func(i int) // the i-th rollout of this kind, from 1
	}{
		{"kubectl rollout restart", func(int) { s.kubectl(nil, "-n", ns, "rollout", "restart", "deployment/"+cplName) }},
		{"resource edit (cpu request 50m -> 50m + 10m per roll)", func(i int) {
			s.edit(func(sp *coordinatorv1alpha1.CoordinatorPipelineSpec) {
				sp.Resources.Requests[corev1.ResourceCPU] = resource.MustParse(fmt.Sprintf("%dm", 50+10*i))
			})
		}},
		{"settings edit (server.readTimeout 44s + 1s per roll)", func(i int) {
			s.edit(func(sp *coordinatorv1alpha1.CoordinatorPipelineSpec) {
				sp.Server.ReadTimeout = &metav1.Duration{Duration: time.Duration(44+i) * time.Second}
			})
		}},
	}
	for _, k := range kinds {
		for i := 1; i <= repeat; i++ {
			pods := s.coordinatorPods()
			what := fmt.Sprintf("%s #%d", k.what, i)
			s.underLoad(what, func() { k.change(i) }, func() { s.rollDone(2) })
			after := s.coordinatorPods()
			for _, p := range after {
				if slices.Contains(pods, p) {
					t.Fatalf("%s: pod %s was not replaced (%v -> %v)", what, p, pods, after)
				}
			}
			cols, err := s.columns()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("kubectl get cpl after %s: %v", what, cols)
		}
	}
}

// restartThenScale: `kubectl rollout restart` then `kubectl scale cpl --replicas=3` adds one pod
// and replaces none (the operator's server-side apply keeps the restart annotation).
func (s *suite) restartThenScale(t *testing.T) {
	s.kubectl(nil, "-n", ns, "rollout", "restart", "deployment/"+cplName)
	s.rollDone(2)
	pods := s.coordinatorPods()
	s.kubectl(nil, "-n", ns, "scale", "cpl", cplName, "--replicas=3")
	start := time.Now()
	s.rollDone(3)
	after := s.coordinatorPods()
	var added []string
	for _, p := range after {
		if !slices.Contains(pods, p) {
			added = append(added, p)
		}
	}
	for _, p := range pods {
		if !slices.Contains(after, p) {
			t.Fatalf("scaling replaced pod %s (%v -> %v)", p, pods, after)
		}
	}
	if len(added) != 1 {
		t.Fatalf("scaling to 3 added %v (%v -> %v)", added, pods, after)
	}
	cols, _ := s.columns()
	t.Logf("FIGURE kubectl scale cpl --replicas=3 after a rollout restart: +1 pod (%s), 0 replaced, READY 3/3 in %s; %v", added[0], time.Since(start).Round(time.Millisecond), cols)
}

// restricted: the namespace enforces the restricted profile (a pod that breaks it is refused),
// and the coordinator and simulator pods run in it, Ready, as the image's non-root user.
func (s *suite) restricted(t *testing.T) {
	bad := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "privileged"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "c", Image: node.PauseImage, SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}},
	}}
	err := s.k.Create(s.ctx, bad)
	if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "restricted") {
		t.Fatalf("a privileged pod in the restricted namespace: %v, want forbidden by PodSecurity", err)
	}
	t.Logf("refused: %v", err)
	var pods corev1.PodList
	if err := s.k.List(s.ctx, &pods, client.InNamespace(ns), client.MatchingLabels{controller.LabelInstance: cplName}); err != nil {
		t.Fatal(err)
	}
	running := 0
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		running++
		ready := false
		for _, c := range p.Status.Conditions {
			ready = ready || (c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue)
		}
		if !ready {
			t.Fatalf("pod %s not Ready", p.Name)
		}
		if p.Spec.SecurityContext == nil || !ptr.Deref(p.Spec.SecurityContext.RunAsNonRoot, false) || ptr.Deref(p.Spec.SecurityContext.RunAsUser, 0) != node.NonRootUID {
			t.Fatalf("pod %s security context %+v", p.Name, p.Spec.SecurityContext)
		}
		// Logs through the API server and the kubelet (InternalIP).
		if out := s.kubectl(nil, "-n", ns, "logs", p.Name, "--tail=1"); strings.TrimSpace(out) == "" {
			t.Fatalf("pod %s: no logs", p.Name)
		}
	}
	// The simulator pods set runAsNonRoot and no runAsUser: the kubelet started them only because
	// their image's user (65532, as the project's images) is not root.
	var sims corev1.PodList
	if err := s.k.List(s.ctx, &sims, client.InNamespace(ns), client.MatchingLabels{"app": "sim"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range sims.Items {
		if p.Spec.Containers[0].SecurityContext.RunAsUser != nil || len(p.Status.ContainerStatuses) != 1 || !p.Status.ContainerStatuses[0].Ready {
			t.Fatalf("simulator pod %s: %+v", p.Name, p.Status.ContainerStatuses)
		}
	}
	t.Logf("FIGURE restricted profile: a privileged pod refused; %d coordinator pods (user 65532) and %d simulator pods (the image's user) Ready", running, len(sims.Items))
}

// exposure: a disruptionBudget and a route make the operator create a PodDisruptionBudget and an
// HTTPRoute the API server accepts (schema and CEL); the PDB's status is computed by the real
// disruption controller from the real pods.
func (s *suite) exposure(t *testing.T) {
	s.edit(func(sp *coordinatorv1alpha1.CoordinatorPipelineSpec) {
		sp.DisruptionBudget = &coordinatorv1alpha1.DisruptionBudgetSpec{MaxUnavailable: ptr.To(intstr.FromInt32(1))}
		sp.Route = &coordinatorv1alpha1.RouteSpec{ParentRef: &coordinatorv1alpha1.RouteParentReference{Name: "inference-gateway"}}
	})
	d := s.waitFor("the PodDisruptionBudget with its status from the real pods", 60*time.Second, func() error {
		var pdb policyv1.PodDisruptionBudget
		if err := s.k.Get(s.ctx, client.ObjectKey{Namespace: ns, Name: cplName}, &pdb); err != nil {
			return err
		}
		if pdb.Status.ExpectedPods != 3 || pdb.Status.CurrentHealthy != 3 || pdb.Status.DisruptionsAllowed != 1 {
			return fmt.Errorf("PDB status %+v", pdb.Status)
		}
		return nil
	})
	t.Logf("FIGURE PodDisruptionBudget: expected 3, healthy 3, disruptions allowed 1 after %s", d.Round(time.Millisecond))
	s.waitFor("the HTTPRoute", 60*time.Second, func() error {
		var route gatewayv1.HTTPRoute
		return s.k.Get(s.ctx, client.ObjectKey{Namespace: ns, Name: cplName}, &route)
	})
	s.waitFor("RouteAccepted reported (no gateway controller on this node: Pending)", 60*time.Second, func() error {
		c := meta.FindStatusCondition(s.pipeline().Status.Conditions, string(coordinatorv1alpha1.ConditionRouteAccepted))
		if c == nil {
			return fmt.Errorf("no RouteAccepted condition")
		}
		t.Logf("RouteAccepted=%s (%s): %s", c.Status, c.Reason, c.Message)
		return nil
	})
	// No gateway controller runs here, so the route keeps Ready False (RouteNotAccepted): remove
	// it (the operator deletes the HTTPRoute) and keep the PodDisruptionBudget.
	s.edit(func(sp *coordinatorv1alpha1.CoordinatorPipelineSpec) { sp.Route = nil })
	s.waitFor("the HTTPRoute deleted", 60*time.Second, func() error {
		var route gatewayv1.HTTPRoute
		if err := s.k.Get(s.ctx, client.ObjectKey{Namespace: ns, Name: cplName}, &route); !apierrors.IsNotFound(err) {
			return fmt.Errorf("HTTPRoute still there (%w)", err)
		}
		return nil
	})
	s.waitColumns("Ready again without the route", 60*time.Second, "3/3", "3")
}

// revisionCounts returns status.revisions' requests by track.
func (s *suite) revisionCounts() map[string]int64 {
	out := map[string]int64{}
	for _, r := range s.pipeline().Status.Revisions {
		out[r.Track] = r.Requests
	}
	return out
}

// canary: a 50% canary (decode only, beside the stable prefill,decode) reaches the pods through a
// reload; 400 requests through the Service split between the two pipelines as the pods report in
// status.revisions; removing the canary reloads back.
func (s *suite) canary(t *testing.T) {
	s.edit(func(sp *coordinatorv1alpha1.CoordinatorPipelineSpec) {
		sp.Canary = &coordinatorv1alpha1.CanarySpec{WeightPercent: 50, Pipeline: coordinatorv1alpha1.PipelineSpec{
			KVConnector: "kv-nixl", Steps: []coordinatorv1alpha1.PipelineStep{{Type: "decode"}},
		}}
	})
	cols := s.waitColumns("the canary loaded by every pod", 90*time.Second, "3/3", "3")
	if cols["CANARY"] != "50" {
		t.Fatalf("CANARY column %q", cols["CANARY"])
	}
	before := s.revisionCounts()
	out, err := exec.Command(filepath.Join(s.bin, "steadyload"), "--url", s.url, "--requests", "400", "--model", simModel).Output()
	if err != nil {
		t.Fatalf("steadyload: %v: %s", err, out)
	}
	var after map[string]int64
	d := s.waitFor("status.revisions to count the 400 requests", 60*time.Second, func() error {
		after = s.revisionCounts()
		if n := after["stable"] - before["stable"] + after["canary"] - before["canary"]; n < 400 {
			return fmt.Errorf("counted %d of 400 (%v -> %v)", n, before, after)
		}
		return nil
	})
	stable, canary := after["stable"]-before["stable"], after["canary"]-before["canary"]
	share := float64(canary) / float64(stable+canary)
	t.Logf("FIGURE canary 50%%: %d stable, %d canary of %d requests (%.1f%%), counted in status.revisions %s after the load; kubectl get cpl: %v",
		stable, canary, stable+canary, 100*share, d.Round(time.Millisecond), cols)
	if share < 0.35 || share > 0.65 {
		t.Fatalf("canary share %.2f, want about 0.5", share)
	}
	s.edit(func(sp *coordinatorv1alpha1.CoordinatorPipelineSpec) { sp.Canary = nil })
	s.waitColumns("the canary removed from every pod", 90*time.Second, "3/3", "3")
}

// podStates summarises the pipeline's pods: name, ready, restarts, waiting reason.
func (s *suite) podStates() []string {
	var pods corev1.PodList
	if err := s.k.List(s.ctx, &pods, client.InNamespace(ns), client.MatchingLabels{controller.LabelInstance: cplName}); err != nil {
		s.t.Fatal(err)
	}
	var out []string
	for _, p := range pods.Items {
		st := p.Name
		for _, c := range p.Status.ContainerStatuses {
			st += fmt.Sprintf(" ready=%t restarts=%d", c.Ready, c.RestartCount)
			if c.State.Waiting != nil {
				st += " " + c.State.Waiting.Reason
			}
		}
		out = append(out, st)
	}
	sort.Strings(out)
	return out
}

// rejectAndCrash: rollout truth on real pods. Pods whose environment (an envFrom Secret) forces
// kv-sglang serve a
// decode-only pipeline; an edit to prefill,decode is rejected by every running pod on reload (they
// keep serving the old revision: ROLLOUT ConfigRejected, UPDATED 0, READY 3/3, requests served);
// then a pod-template edit starts a pod on that configuration, which exits at start and
// crash-loops while the old pods keep serving (the rollout does not complete, UPDATED stays 0);
// removing the environment variable rolls everything back to health.
func (s *suite) rejectAndCrash(t *testing.T) {
	// spec.env refuses COORDINATOR_* variables, and the operator checks an unprefixed envFrom
	// ConfigMap's keys, but never reads a Secret: an unprefixed Secret can still override.
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "force-sglang"},
		StringData: map[string]string{"COORDINATOR_PIPELINE_KV_CONNECTOR": "kv-sglang"}}
	if err := s.k.Create(s.ctx, secret); err != nil {
		t.Fatal(err)
	}
	s.edit(func(sp *coordinatorv1alpha1.CoordinatorPipelineSpec) {
		sp.Pipeline.Steps = []coordinatorv1alpha1.PipelineStep{{Type: "decode"}}
		sp.EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: secret.Name}}}}
	})
	s.rollDone(3)
	s.edit(func(sp *coordinatorv1alpha1.CoordinatorPipelineSpec) {
		sp.Pipeline.Steps = []coordinatorv1alpha1.PipelineStep{{Type: "prefill"}, {Type: "decode"}}
	})
	var cols map[string]string
	d := s.waitFor("every pod to reject the edit (ConfigRejected)", 90*time.Second, func() error {
		cp := s.pipeline()
		ro := meta.FindStatusCondition(cp.Status.Conditions, string(coordinatorv1alpha1.ConditionRolledOut))
		var err error
		if cols, err = s.columns(); err != nil {
			return err
		}
		if cp.Status.ObservedGeneration != cp.Generation || ro == nil || ro.Reason != string(coordinatorv1alpha1.ReasonConfigRejected) ||
			cols["UPDATED"] != "0" || cols["READY"] != "3/3" {
			return fmt.Errorf("kubectl get cpl %v", cols)
		}
		t.Logf("RolledOut=%s %s: %s", ro.Status, ro.Reason, ro.Message)
		return nil
	})
	t.Logf("FIGURE pipeline edit rejected on reload (the pods keep their revision): ROLLOUT %s, READY %s, UPDATED %s after %s", cols["ROLLOUT"], cols["READY"], cols["UPDATED"], d.Round(time.Millisecond))
	s.mustServe(t, "while the pods reject the edit")

	// A pod-template edit: the new pod starts on the rejected configuration and exits.
	s.edit(func(sp *coordinatorv1alpha1.CoordinatorPipelineSpec) {
		sp.Resources.Requests[corev1.ResourceCPU] = resource.MustParse("70m")
	})
	d = s.waitFor("a new pod crash-looping", 120*time.Second, func() error {
		states := s.podStates()
		for _, st := range states {
			if strings.Contains(st, "CrashLoopBackOff") || (strings.Contains(st, "ready=false") && !strings.Contains(st, "restarts=0")) {
				return nil
			}
		}
		return fmt.Errorf("pods %v", states)
	})
	cols, err := s.columns()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE a pod-template edit onto the rejected configuration: a new pod crash-loops after %s (%v); kubectl get cpl: READY %s UPDATED %s ROLLOUT %s STATUS %s",
		d.Round(time.Millisecond), s.podStates(), cols["READY"], cols["UPDATED"], cols["ROLLOUT"], cols["STATUS"])
	if cols["ROLLOUT"] == "RolledOut" || cols["UPDATED"] != "0" {
		t.Fatalf("a crash-looping rollout reported as %v", cols)
	}
	s.mustServe(t, "while a new pod crash-loops")

	s.edit(func(sp *coordinatorv1alpha1.CoordinatorPipelineSpec) { sp.EnvFrom = nil })
	s.rollDone(3)
	cols, _ = s.columns()
	t.Logf("FIGURE environment removed: rolled back to health: %v", cols)
}

// mustServe sends 100 requests through the Service and fails the test on any failure.
func (s *suite) mustServe(t *testing.T, when string) {
	t.Helper()
	out, err := exec.Command(filepath.Join(s.bin, "steadyload"), "--url", s.url, "--requests", "100", "--model", simModel).Output()
	if err != nil {
		t.Fatalf("%s: steadyload: %v: %s", when, err, out)
	}
	t.Logf("100 requests %s: %s", when, bytes.TrimSpace(out))
}

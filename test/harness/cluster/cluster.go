// Package cluster runs the whole system locally: a real kube-apiserver and etcd (envtest assets
// built by hack/setup-envtest-assets.sh) with our CRDs and the GAIE InferencePool CRD, the operator
// as a process (cmd/manager with a kubeconfig), a kubelet stand-in that materialises a ConfigMap
// on disk the way kubelet does (versioned folder + atomic "..data" symlink swap), and coordinator
// processes started on the rendered config. The end-to-end tests and `make demo` share it.
package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap/zapcore"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/epd-dev/coordinator/internal/controller"
	"github.com/epd-dev/coordinator/test/harness/atomicdir"
	"github.com/epd-dev/coordinator/test/internal/loopback"
)

// Options configure Start.
type Options struct {
	// Root is the repository root (found from the working directory when empty).
	Root string
	// Bin holds the built binaries (Build); ManagerArgs are extra manager flags.
	Bin         string
	ManagerArgs []string
	// Progress receives one line per stage (nil: quiet).
	Progress io.Writer
	// Logs receives the manager's output (nil: discarded, kept for errors).
	Logs io.Writer
}

// Cluster is a running control plane with the operator.
type Cluster struct {
	Client     client.Client
	Kubeconfig string
	env        *envtest.Environment
	manager    *exec.Cmd
	managerOut *loopback.Log
	dir        string
	done       chan error
}

// Root walks up from the working directory to the directory holding go.mod.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

func progress(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, "==> "+format+"\n", args...)
	}
}

// Build compiles the manager and coordinator binaries into bin.
func Build(root, bin string, out io.Writer) error {
	cmd := exec.Command("go", "build", "-o", bin+string(os.PathSeparator), "./cmd/manager", "./cmd/coordinator")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = out, io.MultiWriter(&stderr, orDiscard(out))
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, stderr.String())
	}
	return nil
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// Assets returns the envtest asset directory: KUBEBUILDER_ASSETS, or what
// hack/setup-envtest-assets.sh builds (the first run compiles kube-apiserver: minutes).
func Assets(root string, out io.Writer) (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	cmd := exec.Command(filepath.Join(root, "hack", "setup-envtest-assets.sh"))
	cmd.Dir = root
	cmd.Stderr = orDiscard(out)
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/setup-envtest-assets.sh: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

func moduleDir(root, module string) (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", module)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s: %w", module, err)
	}
	return strings.TrimSpace(string(out)), nil
}

var setLogger sync.Once

// Start brings up the API server with the CRDs and starts the operator process.
func Start(ctx context.Context, o Options) (c *Cluster, err error) {
	if o.Root == "" {
		if o.Root, err = Root(); err != nil {
			return nil, err
		}
	}
	assets, err := Assets(o.Root, o.Progress)
	if err != nil {
		return nil, err
	}
	gaie, err := moduleDir(o.Root, "sigs.k8s.io/gateway-api-inference-extension")
	if err != nil {
		return nil, err
	}
	gwapi, err := moduleDir(o.Root, "sigs.k8s.io/gateway-api")
	if err != nil {
		return nil, err
	}
	progress(o.Progress, "starting kube-apiserver and etcd (%s)", assets)
	setLogger.Do(func() {
		// envtest and the client log through controller-runtime: its errors go to stderr (unset, it
		// prints a warning and a stack trace instead, and drops them).
		logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	})
	env := &envtest.Environment{
		Scheme:                controller.NewScheme(),
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths: []string{
			filepath.Join(o.Root, "config", "crd", "bases"),
			filepath.Join(gaie, "config", "crd", "bases", "inference.networking.k8s.io_inferencepools.yaml"),
			filepath.Join(gwapi, "config", "crd", "standard", "gateway.networking.k8s.io_gateways.yaml"),
		},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	c = &Cluster{env: env, managerOut: &loopback.Log{}, done: make(chan error, 1)}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if c.Client, err = client.New(cfg, client.Options{Scheme: env.Scheme}); err != nil {
		return nil, err
	}
	if c.dir, err = os.MkdirTemp("", "epd-cluster-"); err != nil {
		return nil, err
	}
	user, err := env.AddUser(envtest.User{Name: "operator", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, err
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return nil, err
	}
	c.Kubeconfig = filepath.Join(c.dir, "kubeconfig")
	if err := os.WriteFile(c.Kubeconfig, kc, 0o600); err != nil {
		return nil, err
	}
	probe, err := loopback.FreeAddr()
	if err != nil {
		return nil, err
	}
	progress(o.Progress, "starting the operator (%s)", filepath.Join(o.Bin, "manager"))
	args := append([]string{"--kubeconfig", c.Kubeconfig, "--health-probe-bind-address", probe, "--metrics-bind-address", "0"}, o.ManagerArgs...)
	c.manager = exec.Command(filepath.Join(o.Bin, "manager"), args...)
	c.manager.Stdout = io.MultiWriter(c.managerOut, orDiscard(o.Logs))
	c.manager.Stderr = c.manager.Stdout
	if err := c.manager.Start(); err != nil {
		return nil, err
	}
	go func() { c.done <- c.manager.Wait() }()
	if err := waitHTTP(ctx, "http://"+probe+"/readyz", 30*time.Second, c.done); err != nil {
		return nil, fmt.Errorf("operator not ready: %w\n%s", err, c.managerOut.String())
	}
	return c, nil
}

// ManagerLogs returns what the operator printed so far.
func (c *Cluster) ManagerLogs() string { return c.managerOut.String() }

// Stop ends the operator and the control plane.
func (c *Cluster) Stop() {
	if c.manager != nil && c.manager.Process != nil {
		_ = c.manager.Process.Signal(os.Interrupt)
		select {
		case <-c.done: //nolint:errcheck // the exit status of an interrupted manager is not the test's concern
		case <-time.After(10 * time.Second):
			_ = c.manager.Process.Kill()
		}
	}
	if c.env != nil {
		_ = c.env.Stop()
	}
	if c.dir != "" {
		_ = os.RemoveAll(c.dir)
	}
}

// waitHTTP polls url until it answers 200, the process ends (exited) or timeout.
func waitHTTP(ctx context.Context, url string, timeout time.Duration, exited <-chan error) error {
	deadline := time.Now().Add(timeout)
	for {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case err := <-exited:
			return fmt.Errorf("process exited: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer 200 within %s", url, timeout)
		}
	}
}

// Mount is a kubelet stand-in for one ConfigMap volume.
type Mount struct {
	// Dir is the volume directory; each key is a file in it.
	Dir     string
	mu      sync.Mutex
	version string
	updates int
	syncs   int
	stop    context.CancelFunc
	done    chan struct{}
}

// MountConfigMap materialises ns/name in dir now (waiting for it to exist) and keeps it in sync
// every interval, replacing the payload atomically like kubelet's AtomicWriter.
func (c *Cluster) MountConfigMap(ctx context.Context, ns, name, dir string, interval time.Duration) (*Mount, error) {
	m := &Mount{Dir: dir, done: make(chan struct{})}
	sync := func() error {
		var cm corev1.ConfigMap
		if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &cm); err != nil {
			return err
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		m.syncs++
		if cm.ResourceVersion == m.version {
			return nil
		}
		files := make(map[string][]byte, len(cm.Data))
		for k, v := range cm.Data {
			files[k] = []byte(v)
		}
		if err := atomicdir.Write(dir, files); err != nil {
			return err
		}
		m.version = cm.ResourceVersion
		m.updates++
		return nil
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		err := sync()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("ConfigMap %s/%s: %w", ns, name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	mctx, cancel := context.WithCancel(ctx)
	m.stop = cancel
	go func() {
		defer close(m.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-mctx.Done():
				return
			case <-t.C:
				_ = sync()
			}
		}
	}()
	return m, nil
}

// Updates is how many payloads were written (the first mount included).
func (m *Mount) Updates() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.updates
}

// Syncs is how many times the ConfigMap was read and compared with the payload, whether or not
// it had changed (the first mount included): a test waits for it to grow to know that the mount
// has seen the ConfigMap as it is now.
func (m *Mount) Syncs() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.syncs
}

// Stop ends the sync loop.
func (m *Mount) Stop() {
	m.stop()
	<-m.done
}

// Coordinator is a coordinator process.
type Coordinator struct {
	// URL is its API base URL; AdminURL the admin listener's (/metrics, /debug/pipeline).
	URL, AdminURL string
	cmd           *exec.Cmd
	out           *loopback.Log
	done          chan error
}

// StartCoordinator runs bin/coordinator on config, listening on addr (host:port; "" picks a free
// loopback port) through the COORDINATOR_SERVER_LISTEN_ADDR override, with its admin listener on a
// free loopback port, gateway.allowed_hint_networks admitting 127/8 (the workers' addresses) and
// extra environment env. It returns once /readyz answers.
func StartCoordinator(ctx context.Context, bin, config, addr string, env []string, logs io.Writer) (*Coordinator, error) {
	if addr == "" {
		var err error
		if addr, err = loopback.FreeAddr(); err != nil {
			return nil, err
		}
	}
	admin, err := loopback.FreeAddr()
	if err != nil {
		return nil, err
	}
	_, adminPort, _ := net.SplitHostPort(admin)
	c := &Coordinator{URL: "http://" + addr, AdminURL: "http://" + admin, out: &loopback.Log{}, done: make(chan error, 1)}
	c.cmd = exec.Command(filepath.Join(bin, "coordinator"), "--config", config)
	// The workers run on loopback: the endpoint picker's hints and reservations name 127/8
	// addresses, which a coordinator refuses unless they are in gateway.allowed_hint_networks (an
	// override, so that the operator-rendered file and its revision stay as they are).
	c.cmd.Env = append(append(os.Environ(), "COORDINATOR_SERVER_LISTEN_ADDR="+addr,
		"COORDINATOR_SERVER_METRICS_HOST=127.0.0.1", "COORDINATOR_SERVER_METRICS_PORT="+adminPort,
		"COORDINATOR_GATEWAY_ALLOWED_HINT_NETWORKS=[127.0.0.0/8]",
		// No endpoints to converge on loopback: Stop drains at once.
		"COORDINATOR_SERVER_DRAIN_DELAY=0s"), env...)
	c.cmd.Stdout = io.MultiWriter(c.out, orDiscard(logs))
	c.cmd.Stderr = c.cmd.Stdout
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { c.done <- c.cmd.Wait() }()
	if err := waitHTTP(ctx, c.URL+"/readyz", 30*time.Second, c.done); err != nil {
		_ = c.cmd.Process.Kill()
		return nil, fmt.Errorf("coordinator not ready: %w\n%s", err, c.out.String())
	}
	return c, nil
}

// PID is the process id (a reload must not change it).
func (c *Coordinator) PID() int { return c.cmd.Process.Pid }

// Logs returns what the coordinator printed so far.
func (c *Coordinator) Logs() string { return c.out.String() }

// Running reports whether the process is still alive.
func (c *Coordinator) Running() bool {
	select {
	case err := <-c.done:
		c.done <- err
		return false
	default:
		return true
	}
}

// Stop sends SIGTERM and waits for the drain (killing after timeout).
func (c *Coordinator) Stop(timeout time.Duration) error {
	_ = c.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-c.done:
		c.done <- err
		return err
	case <-time.After(timeout):
		_ = c.cmd.Process.Kill()
		return errors.New("coordinator did not stop in time")
	}
}

// StandInPod plays kubelet for a coordinator process: it creates a Ready Pod pod with IP
// 127.0.0.1 from the template of Deployment namespace/deployment, its metrics port the admin port
// of co (nil: a port nothing listens on), so that the operator's rollout probe asks co. As the
// Deployment controller would (envtest runs none), the pod is controlled by a ReplicaSet the
// Deployment controls, one per generation of its template: the probe asks only such pods.
func (c *Cluster) StandInPod(ctx context.Context, namespace, deployment, pod string, co *Coordinator) error {
	var dep appsv1.Deployment
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: deployment}, &dep); err != nil {
		return err
	}
	port := 1 // nothing listens on tcpmux
	if co != nil {
		u, err := url.Parse(co.AdminURL)
		if err != nil {
			return err
		}
		if port, err = strconv.Atoi(u.Port()); err != nil {
			return err
		}
	}
	container := *dep.Spec.Template.Spec.Containers[0].DeepCopy()
	container.Ports, container.VolumeMounts = nil, nil // a stand-in: the volumes are the caller's files
	for _, p := range dep.Spec.Template.Spec.Containers[0].Ports {
		if p.Name == "metrics" {
			p.ContainerPort = int32(port) //nolint:gosec // a TCP port
		}
		container.Ports = append(container.Ports, p)
	}
	rs, err := c.replicaSetOf(ctx, &dep)
	if err != nil {
		return err
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: pod, Labels: rs.Spec.Template.Labels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{container}},
	}
	if err := c.Client.Create(ctx, p); err != nil {
		return err
	}
	p.Status = corev1.PodStatus{
		Phase:      corev1.PodRunning,
		PodIP:      "127.0.0.1",
		PodIPs:     []corev1.PodIP{{IP: "127.0.0.1"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}},
	}
	return c.Client.Status().Update(ctx, p)
}

// replicaSetOf returns the ReplicaSet dep controls for its template's generation, creating it
// the first time, as the Deployment controller does (named after the template's generation, where
// the controller hashes the template).
func (c *Cluster) replicaSetOf(ctx context.Context, dep *appsv1.Deployment) (*appsv1.ReplicaSet, error) {
	hash := strconv.FormatInt(dep.Generation, 10)
	labels := maps.Clone(dep.Spec.Template.Labels)
	labels[appsv1.DefaultDeploymentUniqueLabelKey] = hash
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: dep.Namespace, Name: dep.Name + "-" + hash, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(dep, appsv1.SchemeGroupVersion.WithKind("Deployment"))}},
		Spec: appsv1.ReplicaSetSpec{Replicas: dep.Spec.Replicas, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: dep.Spec.Template.Spec}},
	}
	err := c.Client.Create(ctx, rs)
	if apierrors.IsAlreadyExists(err) {
		err = c.Client.Get(ctx, client.ObjectKeyFromObject(rs), rs)
	}
	return rs, err
}

// DeploymentReady plays the Deployment controller (envtest runs none): every desired replica of
// namespace/name is ready and available.
func (c *Cluster) DeploymentReady(ctx context.Context, namespace, name string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var dep appsv1.Deployment
		if err := c.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &dep); err != nil {
			return err
		}
		n := ptr.Deref(dep.Spec.Replicas, 1)
		dep.Status = appsv1.DeploymentStatus{ObservedGeneration: dep.Generation, Replicas: n, UpdatedReplicas: n, ReadyReplicas: n, AvailableReplicas: n,
			Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable"}}}
		return c.Client.Status().Update(ctx, &dep)
	})
}

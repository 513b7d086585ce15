// Package node runs a real single-node Kubernetes on this machine for the node test tier
// (test/suites/node) and `make demo NODE=1`: etcd and kube-apiserver (the envtest assets of
// hack/setup-envtest-assets.sh), containerd and runc from Debian with their own root, state and
// config, the bridge CNI plugin from Debian's containernetworking-plugins, and kubelet,
// kube-controller-manager, kube-scheduler, kube-proxy and CoreDNS built from the Go module proxy
// (hack/node-assets.sh). Images are built without Docker or a registry (image.go) and imported into
// containerd. Stop leaves the host as it was: processes, mounts, network namespaces, the bridge,
// iptables chains, sysctls and cgroups (host.go). docs/node.md.
package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// The cluster's fixed addresses: none of them is routed on these machines.
const (
	// NodeName is the node's name (kubelet --hostname-override).
	NodeName = "epd-node"
	// PodCIDR is the bridge's pod range (host-local IPAM).
	PodCIDR = "10.244.0.0/24"
	// ServiceCIDR is the Service ClusterIP range; KubernetesServiceIP and DNSServiceIP are in it.
	ServiceCIDR         = "10.96.0.0/16"
	KubernetesServiceIP = "10.96.0.1"
	DNSServiceIP        = "10.96.0.10"
	// Bridge is the CNI bridge's interface.
	Bridge = "epdnode0"
	// PauseImage is the pod sandbox image (containerd's sandbox_image), built from cmd/pause.
	PauseImage = "registry.k8s.io/pause:3.10"
	// CoreDNSImage is the cluster DNS image, built from the CoreDNS binary of hack/node-assets.sh.
	CoreDNSImage = "registry.k8s.io/coredns/coredns:v1.14.7"
	// DefaultDir is where the cluster keeps its state; fixed, so that a run killed without its
	// teardown is cleaned by the next Start (or `hack/node.sh down`).
	DefaultDir = "/var/tmp/epd-node"
	lockPath   = "/run/epd-node.lock"
)

// Options configure Start.
type Options struct {
	// Root is the repository root (hack/ scripts, cmd/pause).
	Root string
	// Dir holds the cluster's state (DefaultDir when empty). It is removed by Stop.
	Dir string
	// Progress receives one line per stage (nil: quiet).
	Progress io.Writer
	// Images are imported before the kubelet starts, besides the pause and CoreDNS images.
	Images []Image
}

// Cluster is a running single-node cluster.
type Cluster struct {
	Dir string
	// Kubeconfig is an admin (system:masters) kubeconfig; Config and Client use it.
	Kubeconfig string
	Config     *rest.Config
	Client     client.Client
	// NodeIP is the node's InternalIP (the host's address on its default route).
	NodeIP net.IP
	// Assets hold kube-apiserver, etcd and kubectl; NodeAssets the node binaries.
	Assets, NodeAssets string

	o        Options
	lock     *os.File
	host     *HostState
	procs    []*proc
	stopOnce sync.Once
	sigStop  chan struct{}
}

// proc is one control plane or node process.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	// stopping is set before Stop signals it: its exit is no failure to wait on.
	stopping bool
}

func (c *Cluster) progress(format string, args ...any) {
	if c.o.Progress != nil {
		fmt.Fprintf(c.o.Progress, "==> [node %s] "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
	}
}

// Prerequisites returns what this machine lacks to run the cluster (empty when nothing): root,
// cgroups, and the Debian packages' commands.
func Prerequisites() []string {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (containerd, kubelet and the CNI plugins need it)")
	}
	for _, cmd := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "iptables-save", "ip6tables", "ip", "flock"} {
		if _, err := exec.LookPath(cmd); err != nil {
			missing = append(missing, cmd)
		}
	}
	for _, f := range []string{"/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback", "/usr/lib/cni/portmap"} {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, f+" (containernetworking-plugins)")
		}
	}
	return missing
}

// AssetDirs runs hack/setup-envtest-assets.sh and hack/node-assets.sh (cached builds; minutes the
// first time) and returns their directories.
func AssetDirs(root string, log io.Writer) (assets, nodeAssets string, err error) {
	run := func(script string) (string, error) {
		cmd := exec.Command(filepath.Join(root, "hack", script))
		cmd.Dir = root
		cmd.Stderr = orDiscard(log)
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("hack/%s: %w", script, err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	if assets = os.Getenv("KUBEBUILDER_ASSETS"); assets == "" {
		if assets, err = run("setup-envtest-assets.sh"); err != nil {
			return "", "", err
		}
	}
	if nodeAssets = os.Getenv("NODE_ASSETS"); nodeAssets == "" {
		if nodeAssets, err = run("node-assets.sh"); err != nil {
			return "", "", err
		}
	}
	return assets, nodeAssets, nil
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

var setLogger sync.Once

// Start brings the cluster up: it cleans what a killed run left in the state directory, then
// starts etcd, kube-apiserver, containerd (images imported), the kubelet, kube-controller-manager,
// kube-scheduler, kube-proxy and CoreDNS, and returns once the node is Ready, the default
// ServiceAccount exists and CoreDNS answers. On an error everything started is stopped.
// A SIGINT or SIGTERM to the process stops the cluster before the process exits.
func Start(ctx context.Context, o Options) (c *Cluster, err error) {
	if o.Dir == "" {
		o.Dir = DefaultDir
	}
	if m := Prerequisites(); len(m) > 0 {
		return nil, fmt.Errorf("missing: %s", strings.Join(m, ", "))
	}
	setLogger.Do(func() {
		// The clients log through controller-runtime: errors to stderr (unset, it prints a
		// warning with a stack trace instead).
		logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	})
	c = &Cluster{Dir: o.Dir, o: o, sigStop: make(chan struct{})}
	if c.lock, err = os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600); err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(c.lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		c.lock.Close()
		return nil, fmt.Errorf("another node cluster holds %s", lockPath)
	}
	start := time.Now()
	defer func() {
		if err != nil {
			c.Stop()
			c = nil
		}
	}()
	if c.Assets, c.NodeAssets, err = AssetDirs(o.Root, o.Progress); err != nil {
		return c, err
	}
	// A run that was killed left its state: tear it down first (host state is restored from the
	// snapshot it saved).
	if err := Teardown(o.Dir, c.progress); err != nil {
		return c, fmt.Errorf("cleaning a previous run: %w", err)
	}
	if c.host, err = snapshotHost(o.Dir); err != nil {
		return c, err
	}
	c.handleSignals()
	if c.NodeIP, err = hostIP(); err != nil {
		return c, err
	}
	if err := c.startControlPlane(ctx); err != nil {
		return c, err
	}
	c.progress("control plane up (%s)", time.Since(start).Round(time.Millisecond))
	if err := c.startContainerd(ctx); err != nil {
		return c, err
	}
	if err := c.importImages(ctx); err != nil {
		return c, err
	}
	if err := c.startNode(ctx); err != nil {
		return c, err
	}
	if err := c.startCoreDNS(ctx); err != nil {
		return c, err
	}
	c.progress("cluster ready (%s)", time.Since(start).Round(time.Millisecond))
	return c, nil
}

// handleSignals stops the cluster on SIGINT or SIGTERM, then exits (status 1).
func (c *Cluster) handleSignals() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		select {
		case s := <-ch:
			fmt.Fprintf(os.Stderr, "node: %s: stopping the cluster\n", s)
			c.Stop()
			os.Exit(1)
		case <-c.sigStop:
			signal.Stop(ch)
		}
	}()
}

func (c *Cluster) path(elem ...string) string {
	return filepath.Join(append([]string{c.Dir}, elem...)...)
}

// start runs a process with its output in logs/NAME.log; it is killed when this process dies
// (Pdeathsig) and recorded in pids/ so that Teardown finds it after a crash.
func (c *Cluster) start(name, bin string, args ...string) (*proc, error) {
	if err := os.MkdirAll(c.path("logs"), 0o755); err != nil {
		return nil, err
	}
	log, err := os.OpenFile(c.path("logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	_ = os.MkdirAll(c.path("pids"), 0o755)
	_ = os.WriteFile(c.path("pids", name), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
	return p, nil
}

// Log returns the last lines of a component's log (etcd, kube-apiserver, containerd, kubelet, ...).
func (c *Cluster) Log(name string, lines int) string {
	b, _ := os.ReadFile(c.path("logs", name+".log"))
	l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// wait polls cond until it holds, a process exits, or the deadline passes.
func (c *Cluster) wait(ctx context.Context, what string, timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		for _, p := range c.procs {
			if p.stopping {
				continue
			}
			select {
			case <-p.done:
				return fmt.Errorf("waiting for %s: %s exited (%w); its log:\n%s", what, p.name, p.err, c.Log(p.name, 30))
			default:
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s: %w", timeout, what, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "0.0.0.0:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// hostIP is the address of the interface of the default route.
func hostIP() (net.IP, error) {
	out, err := exec.Command("ip", "-4", "route", "get", "192.0.2.254").Output()
	if err == nil {
		f := strings.Fields(string(out))
		for i := range f {
			if f[i] == "src" && i+1 < len(f) {
				if ip := net.ParseIP(f[i+1]); ip != nil {
					return ip, nil
				}
			}
		}
	}
	ifs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	for _, a := range ifs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil && !strings.HasPrefix(n.IP.String(), "10.244.") {
			return n.IP, nil
		}
	}
	return nil, errors.New("no IPv4 address for the node")
}

func writeFile(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(content), 0o644)
}

func kubeconfig(server, ca, cert, key string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: epd-node
  cluster: {server: %q, certificate-authority: %q}
users:
- name: user
  user: {client-certificate: %q, client-key: %q}
contexts:
- name: epd-node
  context: {cluster: epd-node, user: user}
current-context: epd-node
`, server, ca, cert, key)
}

func (c *Cluster) startControlPlane(ctx context.Context) error {
	ports, err := freePorts(5)
	if err != nil {
		return err
	}
	etcdClient, etcdPeer, apiPort := ports[0], ports[1], ports[2]
	cmPort, schedPort := ports[3], ports[4]
	p, err := newPKI(c.path("pki"), c.NodeIP, net.ParseIP(KubernetesServiceIP), NodeName)
	if err != nil {
		return err
	}
	c.progress("etcd and kube-apiserver (node IP %s)", c.NodeIP)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	if _, err := c.start("etcd", filepath.Join(c.Assets, "etcd"), "--data-dir", c.path("etcd"), "--name", "epd-node",
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdPeer),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdPeer),
		"--initial-cluster", fmt.Sprintf("epd-node=http://127.0.0.1:%d", etcdPeer),
		"--unsafe-no-fsync", "--quota-backend-bytes", "2147483648"); err != nil {
		return err
	}
	if _, err := c.start("kube-apiserver", filepath.Join(c.Assets, "kube-apiserver"),
		"--etcd-servers", etcdURL, "--bind-address", "0.0.0.0", "--secure-port", strconv.Itoa(apiPort),
		"--advertise-address", c.NodeIP.String(), "--cert-dir", c.path("apiserver"),
		"--tls-cert-file", p.path("apiserver.crt"), "--tls-private-key-file", p.path("apiserver.key"),
		"--client-ca-file", p.path("ca.crt"),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", p.path("sa.pub"), "--service-account-signing-key-file", p.path("sa.key"),
		"--service-cluster-ip-range", ServiceCIDR, "--authorization-mode", "Node,RBAC",
		"--enable-admission-plugins", "NodeRestriction",
		"--kubelet-client-certificate", p.path("admin.crt"), "--kubelet-client-key", p.path("admin.key"),
		"--kubelet-certificate-authority", p.path("ca.crt"),
		"--kubelet-preferred-address-types", "InternalIP", "--allow-privileged=true",
		"--endpoint-reconciler-type", "lease", "--profiling=false"); err != nil {
		return err
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	c.Kubeconfig = c.path("admin.kubeconfig")
	if err := writeFile(c.Kubeconfig, kubeconfig(server, p.path("ca.crt"), p.path("admin.crt"), p.path("admin.key"))); err != nil {
		return err
	}
	if err := writeFile(c.path("kubelet.kubeconfig"), kubeconfig(server, p.path("ca.crt"), p.path("kubelet.crt"), p.path("kubelet.key"))); err != nil {
		return err
	}
	if c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		return err
	}
	c.Config.QPS, c.Config.Burst = 100, 200
	if c.Client, err = client.New(c.Config, client.Options{}); err != nil {
		return err
	}
	if err := c.wait(ctx, "kube-apiserver /readyz", 60*time.Second, func() error {
		var ns corev1.Namespace
		return c.Client.Get(ctx, client.ObjectKey{Name: "default"}, &ns)
	}); err != nil {
		return err
	}
	c.progress("kube-controller-manager and kube-scheduler")
	if _, err := c.start("kube-controller-manager", filepath.Join(c.NodeAssets, "kube-controller-manager"),
		"--kubeconfig", c.Kubeconfig, "--authentication-kubeconfig", c.Kubeconfig, "--authorization-kubeconfig", c.Kubeconfig,
		"--service-account-private-key-file", p.path("sa.key"), "--root-ca-file", p.path("ca.crt"),
		"--use-service-account-credentials=false", "--leader-elect=false",
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(cmPort), "--cert-dir", c.path("controller-manager"),
		"--cluster-name", "epd-node", "--service-cluster-ip-range", ServiceCIDR,
		"--node-monitor-grace-period", "40s", "--concurrent-deployment-syncs", "5"); err != nil {
		return err
	}
	if _, err := c.start("kube-scheduler", filepath.Join(c.NodeAssets, "kube-scheduler"),
		"--kubeconfig", c.Kubeconfig, "--authentication-kubeconfig", c.Kubeconfig, "--authorization-kubeconfig", c.Kubeconfig,
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(schedPort),
		"--cert-dir", c.path("scheduler")); err != nil {
		return err
	}
	return nil
}

func (c *Cluster) containerdSock() string { return c.path("containerd", "containerd.sock") }

func (c *Cluster) startContainerd(ctx context.Context) error {
	c.progress("containerd")
	cfg := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[8]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[7]q
`, c.path("containerd", "root"), c.path("containerd", "state"), c.containerdSock(), c.containerdSock()+".ttrpc",
		c.path("containerd", "opt"), PauseImage, c.path("cni", "net.d"), c.path("containerd", "runc"))
	if err := writeFile(c.path("containerd", "config.toml"), cfg); err != nil {
		return err
	}
	cni := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "epd-node",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, Bridge, PodCIDR, c.path("cni", "ipam"))
	if err := writeFile(c.path("cni", "net.d", "10-epd-node.conflist"), cni); err != nil {
		return err
	}
	if _, err := c.start("containerd", "containerd", "--config", c.path("containerd", "config.toml")); err != nil {
		return err
	}
	return c.wait(ctx, "containerd", 30*time.Second, func() error {
		return exec.Command("ctr", "--address", c.containerdSock(), "version").Run()
	})
}

// importImages builds the pause and CoreDNS images and imports them and Options.Images.
func (c *Cluster) importImages(ctx context.Context) error {
	dir := c.path("images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	pause := filepath.Join(dir, "pause")
	if err := GoBuildStatic(c.o.Root, "./test/harness/node/cmd/pause", pause, ""); err != nil {
		return err
	}
	imgs := append([]Image{
		{Ref: PauseImage, Files: map[string]File{"pause": {Src: pause, Mode: 0o755}}, Entrypoint: []string{"/pause"}, User: "65535:65535"},
		{Ref: CoreDNSImage, Files: map[string]File{"coredns": {Src: filepath.Join(c.NodeAssets, "coredns"), Mode: 0o755}},
			Entrypoint: []string{"/coredns"}, Ports: []string{"53/udp", "53/tcp", "9153"}},
	}, c.o.Images...)
	return c.Import(ctx, imgs...)
}

// Import writes each image as a tarball and imports it into containerd's k8s.io namespace.
func (c *Cluster) Import(ctx context.Context, imgs ...Image) error {
	for _, img := range imgs {
		start := time.Now()
		tar := c.path("images", strings.NewReplacer("/", "_", ":", "_").Replace(img.Ref)+".tar")
		if err := img.WriteTarball(tar); err != nil {
			return fmt.Errorf("image %s: %w", img.Ref, err)
		}
		out, err := exec.CommandContext(ctx, "ctr", "--address", c.containerdSock(), "-n", "k8s.io", "images", "import", "--no-unpack=false", tar).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr images import %s: %w\n%s", img.Ref, err, out)
		}
		_ = os.Remove(tar)
		c.progress("image %s imported (%s)", img.Ref, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

func (c *Cluster) startNode(ctx context.Context) error {
	ports, err := freePorts(4)
	if err != nil {
		return err
	}
	kubeletPort, kubeletHealthz, proxyHealthz, proxyMetrics := ports[0], ports[1], ports[2], ports[3]
	pki := c.path("pki")
	kcfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]s
port: %[2]d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %[3]d
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[4]q}
authorization: {mode: Webhook}
tlsCertFile: %[5]q
tlsPrivateKeyFile: %[6]q
cgroupDriver: cgroupfs
# Kubernetes 1.35+ refuses cgroup v1 unless told; these machines have it.
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%[7]s
imageServiceEndpoint: unix://%[7]s
clusterDNS: [%[8]q]
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
podLogsDir: %[9]q
# Imported images cannot be pulled back: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# No CAP_SYS_RESOURCE to lower it (containerd restricts pods' oom_score_adj likewise).
oomScoreAdj: 0
evictionHard: {memory.available: "50Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
serializeImagePulls: false
syncFrequency: 10s
nodeStatusUpdateFrequency: 5s
maxPods: 60
`, c.NodeIP, kubeletPort, kubeletHealthz, filepath.Join(pki, "ca.crt"), filepath.Join(pki, "kubelet.crt"),
		filepath.Join(pki, "kubelet.key"), c.containerdSock(), DNSServiceIP, c.path("pod-logs"))
	if err := writeFile(c.path("kubelet", "config.yaml"), kcfg); err != nil {
		return err
	}
	c.progress("kubelet and kube-proxy")
	if _, err := c.start("kubelet", filepath.Join(c.NodeAssets, "kubelet"), "--config", c.path("kubelet", "config.yaml"),
		"--kubeconfig", c.path("kubelet.kubeconfig"), "--root-dir", c.path("kubelet", "root"),
		"--hostname-override", NodeName, "--node-ip", c.NodeIP.String(), "--v", "1"); err != nil {
		return err
	}
	if _, err := c.start("kube-proxy", filepath.Join(c.NodeAssets, "kube-proxy"), "--kubeconfig", c.Kubeconfig,
		"--hostname-override", NodeName, "--proxy-mode", "iptables", "--cluster-cidr", PodCIDR,
		"--masquerade-all", "--iptables-localhost-nodeports=false",
		"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
		"--healthz-bind-address", fmt.Sprintf("127.0.0.1:%d", proxyHealthz),
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", proxyMetrics), "--v", "1"); err != nil {
		return err
	}
	if err := c.wait(ctx, "node "+NodeName+" Ready", 90*time.Second, func() error {
		var n corev1.Node
		if err := c.Client.Get(ctx, client.ObjectKey{Name: NodeName}, &n); err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return errors.New("node not Ready")
	}); err != nil {
		return err
	}
	return c.wait(ctx, "the default ServiceAccount", 60*time.Second, func() error {
		var sa corev1.ServiceAccount
		return c.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "default"}, &sa)
	})
}

// Kubectl runs the envtest assets' kubectl (the same build as the apiserver) on the cluster, with
// stdin when not nil, and returns its stdout.
func (c *Cluster) Kubectl(ctx context.Context, stdin []byte, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.Assets, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// Stop stops the cluster and restores the host (Teardown), then releases the lock. Safe to call
// more than once. The controllers and the scheduler stop first, so that no pod is recreated; then
// every pod is deleted and the kubelet stops it (so that the CNI plugins tear down its network
// themselves); then the node and the control plane stop, and Teardown removes whatever is left.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		close(c.sigStop)
		start := time.Now()
		c.stopProcs("kube-controller-manager", "kube-scheduler")
		if c.Client != nil && c.running("kubelet") {
			c.deletePods()
		}
		for i := len(c.procs) - 1; i >= 0; i-- {
			c.stopProcs(c.procs[i].name)
		}
		if c.running("kube-proxy") || c.NodeAssets != "" {
			// kube-proxy's own cleanup of its iptables rules; Teardown removes what is left.
			if out, err := exec.Command(filepath.Join(c.NodeAssets, "kube-proxy"), "--cleanup").CombinedOutput(); err != nil {
				c.progress("kube-proxy --cleanup: %v: %s", err, out)
			}
		}
		if err := Teardown(c.Dir, c.progress); err != nil {
			fmt.Fprintf(os.Stderr, "node: teardown: %v\n", err)
		}
		c.progress("stopped (%s)", time.Since(start).Round(time.Millisecond))
		if c.lock != nil {
			_ = syscall.Flock(int(c.lock.Fd()), syscall.LOCK_UN)
			c.lock.Close()
		}
	})
}

func (c *Cluster) running(name string) bool {
	for _, p := range c.procs {
		if p.name == name {
			select {
			case <-p.done:
				return false
			default:
				return true
			}
		}
	}
	return false
}

// stopProcs sends SIGTERM to the named processes and waits up to 10s for each (then SIGKILL).
func (c *Cluster) stopProcs(names ...string) {
	for _, p := range c.procs {
		if !slices.Contains(names, p.name) {
			continue
		}
		p.stopping = true
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// deletePods deletes every pod (1s grace) and waits up to 30s for the kubelet to stop them all.
func (c *Cluster) deletePods() {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	var nss corev1.NamespaceList
	if err := c.Client.List(ctx, &nss); err != nil {
		return
	}
	for _, ns := range nss.Items {
		_ = c.Client.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(ns.Name), client.GracePeriodSeconds(1))
	}
	err := c.wait(ctx, "every pod stopped", 30*time.Second, func() error {
		var pods corev1.PodList
		if err := c.Client.List(ctx, &pods); err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d pods left", len(pods.Items))
		}
		return nil
	})
	if err != nil {
		c.progress("stopping pods: %v", err)
	}
}

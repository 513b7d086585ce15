package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Sysctls are the host settings the node's components change (the kubelet's kernel tunables,
// the bridge plugin's forwarding, kube-proxy's conntrack and route_localnet, which the harness's
// flags already leave alone): their values are saved before Start and written back by Teardown.
var Sysctls = []string{
	"net.ipv4.ip_forward",
	"net.ipv4.conf.all.route_localnet",
	"net.ipv6.conf.all.forwarding",
	"net.bridge.bridge-nf-call-iptables",
	"net.bridge.bridge-nf-call-ip6tables",
	"vm.overcommit_memory",
	"vm.panic_on_oom",
	"kernel.panic",
	"kernel.panic_on_oops",
	"kernel.keys.root_maxkeys",
	"kernel.keys.root_maxbytes",
	"net.netfilter.nf_conntrack_max",
	"net.netfilter.nf_conntrack_tcp_timeout_established",
	"net.netfilter.nf_conntrack_tcp_timeout_close_wait",
}

// chainPrefixes are the iptables chains the kubelet, kube-proxy and the CNI plugins create.
var chainPrefixes = []string{"KUBE-", "CNI-"}

// HostState is what Teardown restores: saved beside the state directory (DIR.host.json) before anything changes.
type HostState struct {
	Sysctls map[string]string `json:"sysctls"`
	// Chains are "family table chain" entries that existed before (not removed by Teardown).
	Chains []string `json:"chains"`
	// Paths are host paths the node may create, and whether each existed.
	Paths map[string]bool `json:"paths"`
	// ContainerLogs are the entries of /var/log/containers before.
	ContainerLogs []string `json:"containerLogs"`
}

// hostPaths are created outside the state directory by the kubelet or containerd's shims.
var hostPaths = []string{"/var/log/containers", "/run/containerd", "/var/lib/kubelet", "/var/log/pods", "/etc/cni", "/opt/cni"}

func statePath(dir string) string { return filepath.Clean(dir) + ".host.json" }

// Snapshot reads the host state the node changes (used by Start and by the teardown test).
func Snapshot() (*HostState, error) {
	h := &HostState{Sysctls: map[string]string{}, Paths: map[string]bool{}}
	for _, k := range Sysctls {
		if b, err := os.ReadFile(sysctlPath(k)); err == nil {
			h.Sysctls[k] = strings.TrimSpace(string(b))
		}
	}
	var err error
	if h.Chains, err = chains(); err != nil {
		return nil, err
	}
	for _, p := range hostPaths {
		_, err := os.Lstat(p)
		h.Paths[p] = err == nil
	}
	h.ContainerLogs = dirEntries("/var/log/containers")
	return h, nil
}

func snapshotHost(dir string) (*HostState, error) {
	h, err := Snapshot()
	if err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(h, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(statePath(dir)), 0o755); err != nil {
		return nil, err
	}
	return h, os.WriteFile(statePath(dir), b, 0o644)
}

func dirEntries(dir string) []string {
	es, _ := os.ReadDir(dir)
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func sysctlPath(k string) string { return "/proc/sys/" + strings.ReplaceAll(k, ".", "/") }

// chains lists "family table chain" for every KUBE-/CNI- chain in filter, nat and mangle.
func chains() ([]string, error) {
	var out []string
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, table := range []string{"filter", "nat", "mangle"} {
			b, err := exec.Command(fam, "-w", "-t", table, "-S").Output()
			if err != nil {
				continue // the table may not exist for this family
			}
			for _, line := range strings.Split(string(b), "\n") {
				if f := strings.Fields(line); len(f) >= 2 && f[0] == "-N" && hasChainPrefix(f[1]) {
					out = append(out, fam+" "+table+" "+f[1])
				}
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

func hasChainPrefix(chain string) bool {
	for _, p := range chainPrefixes {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// Teardown stops whatever a cluster in dir left and restores the host from its saved state: it
// kills the recorded processes and containerd's shims and containers, unmounts everything under
// dir, deletes the bridge and the KUBE-/CNI- iptables chains that were not there before, writes
// the saved sysctls back, removes the pod cgroups and the kubelet's /var/log/containers links,
// and removes dir. A dir that does not exist is nothing to do. Idempotent.
func Teardown(dir string, progress func(string, ...any)) error {
	if progress == nil {
		progress = func(string, ...any) {}
	}
	var saved *HostState
	if b, err := os.ReadFile(statePath(dir)); err == nil {
		saved = &HostState{}
		if err := json.Unmarshal(b, saved); err != nil {
			return fmt.Errorf("%s: %w", statePath(dir), err)
		}
	}
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) && saved == nil {
		return nil
	}
	var errs []error
	// 1. Processes recorded by Start whose command line still names dir.
	killRecorded(dir)
	// 2. Containers (runc's state is under dir) and the shims serving them.
	killContainers(dir)
	killByCmdline(dir)
	// 3. Mounts under dir (overlay rootfs, shm, netns, the kubelet's tmpfs volumes).
	if err := unmountUnder(dir); err != nil {
		errs = append(errs, err)
	}
	// 4. The bridge (veths went with their namespaces).
	if exec.Command("ip", "link", "show", Bridge).Run() == nil {
		if out, err := exec.Command("ip", "link", "delete", Bridge).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip link delete %s: %w: %s", Bridge, err, out))
		}
	}
	// 5. iptables chains that were not there before.
	var before []string
	if saved != nil {
		before = saved.Chains
	}
	if err := removeChains(before); err != nil {
		errs = append(errs, err)
	}
	// 6. Pod cgroups.
	removeCgroups()
	if saved != nil {
		// 7. sysctls.
		for k, v := range saved.Sysctls {
			cur, err := os.ReadFile(sysctlPath(k))
			if err == nil && strings.TrimSpace(string(cur)) != v {
				if err := os.WriteFile(sysctlPath(k), []byte(v), 0o644); err != nil {
					errs = append(errs, fmt.Errorf("sysctl %s=%s: %w", k, v, err))
				}
			}
		}
		// 8. Host paths the node created; the kubelet's links in /var/log/containers.
		for p, existed := range saved.Paths {
			if !existed {
				_ = os.RemoveAll(p)
			}
		}
		if saved.Paths["/var/log/containers"] {
			for _, e := range dirEntries("/var/log/containers") {
				if !slices.Contains(saved.ContainerLogs, e) {
					_ = os.Remove(filepath.Join("/var/log/containers", e))
				}
			}
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		_ = os.Remove(statePath(dir))
	}
	progress("host cleaned")
	return errors.Join(errs...)
}

func killRecorded(dir string) {
	for _, e := range dirEntries(filepath.Join(dir, "pids")) {
		b, err := os.ReadFile(filepath.Join(dir, "pids", e))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || !cmdlineHas(pid, dir) {
			continue
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
		waitGone(pid)
	}
}

// killByCmdline kills the processes whose command line names dir (containerd's shims carry the
// containerd socket's path): by process id, each checked first.
func killByCmdline(dir string) {
	for _, pid := range pids() {
		if pid != os.Getpid() && cmdlineHas(pid, dir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			waitGone(pid)
		}
	}
}

func pids() []int {
	var out []int
	for _, e := range dirEntries("/proc") {
		if pid, err := strconv.Atoi(e); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

func cmdlineHas(pid int, s string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(b), s)
}

func waitGone(pid int) {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); err != nil {
			return
		}
		// A zombie child of ours: reap it.
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		time.Sleep(20 * time.Millisecond)
	}
}

// killContainers kills and deletes every container runc knows under dir's runc root.
func killContainers(dir string) {
	root := filepath.Join(dir, "containerd", "runc", "k8s.io")
	if _, err := os.Stat(root); err != nil {
		return
	}
	out, err := exec.Command("runc", "--root", root, "list", "-q").Output()
	if err != nil {
		return
	}
	for _, id := range strings.Fields(string(out)) {
		_ = exec.Command("runc", "--root", root, "kill", "--all", id, "KILL").Run()
		_ = exec.Command("runc", "--root", root, "delete", "--force", id).Run()
	}
}

// unmountUnder unmounts every mount point under dir, deepest first (lazily: a mount still busy
// goes when its last user does).
func unmountUnder(dir string) error {
	dir = filepath.Clean(dir)
	for range 3 {
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			return err
		}
		var mounts []string
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 5 {
				continue
			}
			mp := unescapeMount(f[4])
			if mp == dir || strings.HasPrefix(mp, dir+"/") {
				mounts = append(mounts, mp)
			}
		}
		if len(mounts) == 0 {
			return nil
		}
		sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
		for _, mp := range mounts {
			_ = syscall.Unmount(mp, syscall.MNT_DETACH)
		}
	}
	return fmt.Errorf("mounts left under %s", dir)
}

func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// removeChains deletes the KUBE-/CNI- chains not in before (and the rules jumping to them).
func removeChains(before []string) error {
	now, err := chains()
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, c := range before {
		keep[c] = true
	}
	type tableKey struct{ fam, table string }
	drop := map[tableKey]map[string]bool{}
	for _, c := range now {
		if keep[c] {
			continue
		}
		f := strings.Fields(c)
		k := tableKey{f[0], f[1]}
		if drop[k] == nil {
			drop[k] = map[string]bool{}
		}
		drop[k][f[2]] = true
	}
	var errs []error
	for k, names := range drop {
		b, err := exec.Command(k.fam, "-w", "-t", k.table, "-S").Output()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// Rules jumping to a dropped chain, from chains that stay.
		for _, line := range strings.Split(string(b), "\n") {
			f := splitQuoted(line)
			if len(f) < 2 || f[0] != "-A" || names[f[1]] {
				continue
			}
			if i := slices.Index(f, "-j"); i >= 0 && i+1 < len(f) && names[f[i+1]] {
				args := append([]string{"-w", "-t", k.table, "-D"}, f[1:]...)
				if out, err := exec.Command(k.fam, args...).CombinedOutput(); err != nil {
					errs = append(errs, fmt.Errorf("%s %s: %w: %s", k.fam, strings.Join(args, " "), err, out))
				}
			}
		}
		for n := range names {
			_ = exec.Command(k.fam, "-w", "-t", k.table, "-F", n).Run()
		}
		for n := range names {
			if out, err := exec.Command(k.fam, "-w", "-t", k.table, "-X", n).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s -t %s -X %s: %w: %s", k.fam, k.table, n, err, out))
			}
		}
	}
	return errors.Join(errs...)
}

// splitQuoted splits an `iptables -S` line into its words: double quotes group (comments), a
// backslash escapes the next character.
func splitQuoted(line string) []string {
	var out []string
	var cur strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case ch == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
			inWord = true
		case ch == '"':
			quoted = !quoted
			inWord = true
		case (ch == ' ' || ch == '\t') && !quoted:
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(ch)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out
}

// removeCgroups removes the kubelet's kubepods hierarchy from every cgroup controller (cgroup v1;
// on v2 the one tree), deepest first. The pods' processes are gone by then.
func removeCgroups() {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	if _, err := os.Stat("/sys/fs/cgroup/kubepods"); err == nil {
		roots = append(roots, "/sys/fs/cgroup/kubepods")
	}
	for _, r := range roots {
		var dirs []string
		_ = filepath.WalkDir(r, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = syscall.Rmdir(dirs[i])
		}
	}
}

// Leftovers compares the host with a snapshot taken before a cluster ran and lists what differs:
// processes naming dir, mounts under dir or containerd's state, the bridge, KUBE-/CNI- chains,
// sysctls, kubepods cgroups, host paths, and dir itself. Empty means the host is clean.
func Leftovers(dir string, before *HostState) []string {
	var out []string
	for _, pid := range pids() {
		if pid != os.Getpid() && cmdlineHas(pid, dir) {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			out = append(out, fmt.Sprintf("process %d: %s", pid, strings.ReplaceAll(string(b), "\x00", " ")))
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 5 && (strings.HasPrefix(f[4], dir) || strings.Contains(f[4], "containerd") || strings.Contains(f[4], "kubelet")) {
				out = append(out, "mount "+f[4])
			}
		}
	}
	if exec.Command("ip", "link", "show", Bridge).Run() == nil {
		out = append(out, "link "+Bridge)
	}
	if now, err := chains(); err == nil {
		for _, c := range now {
			if !slices.Contains(before.Chains, c) {
				out = append(out, "chain "+c)
			}
		}
	}
	now, err := Snapshot()
	if err == nil {
		for k, v := range before.Sysctls {
			if now.Sysctls[k] != v {
				out = append(out, fmt.Sprintf("sysctl %s = %s, was %s", k, now.Sysctls[k], v))
			}
		}
		for p, existed := range before.Paths {
			if now.Paths[p] != existed {
				out = append(out, fmt.Sprintf("path %s exists=%t, was %t", p, now.Paths[p], existed))
			}
		}
		if !slices.Equal(now.ContainerLogs, before.ContainerLogs) {
			out = append(out, fmt.Sprintf("/var/log/containers: %v, was %v", now.ContainerLogs, before.ContainerLogs))
		}
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods"); len(m) > 0 {
		out = append(out, "cgroups "+strings.Join(m, " "))
	}
	if _, err := os.Stat(dir); err == nil {
		out = append(out, "directory "+dir)
	}
	if _, err := os.Stat(statePath(dir)); err == nil {
		out = append(out, "file "+statePath(dir))
	}
	return out
}

package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// TargetNginx is nginx (Debian's nginx-light) as a one-hop reverse proxy: keep-alive upstream
// connections, no buffering either way. The harness runs it when nginx is installed (it installs
// nothing itself).
const TargetNginx = "nginx"

// NginxBinary returns the nginx executable on PATH (or in /usr/sbin, where Debian puts it), ""
// when there is none.
func NginxBinary() string {
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	if st, err := os.Stat("/usr/sbin/nginx"); err == nil && !st.IsDir() {
		return "/usr/sbin/nginx"
	}
	return ""
}

// NginxConfig is the configuration of the nginx target: listening on listen (host:port),
// forwarding everything to upstream (http://host:port) over a keep-alive pool of 100 (the
// coordinator's gateway.max_idle_conns_per_host), HTTP/1.1 upstream, neither request nor
// response buffered, no access log, one worker per CPU, files kept under dir.
func NginxConfig(dir, listen, upstream string, maxConns int) string {
	up := strings.TrimPrefix(upstream, "http://")
	return fmt.Sprintf(`# benchmark target nginx (written by test/harness/bench)
worker_processes auto;
worker_rlimit_nofile %d;
pid %s;
error_log %s warn;
events {
    worker_connections %d;
    multi_accept on;
}
http {
    access_log off;
    client_body_temp_path %s;
    proxy_temp_path %s;
    client_max_body_size 64m;
    client_body_buffer_size 2m;
    keepalive_requests 1000000;
    upstream worker {
        server %s;
        keepalive 100;
        keepalive_requests 1000000;
    }
    server {
        listen %s backlog=65535;
        location / {
            proxy_pass http://worker;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 300s;
        }
    }
}
`, 2*maxConns+64, filepath.Join(dir, "nginx.pid"), filepath.Join(dir, "nginx-error.log"), maxConns+64,
		filepath.Join(dir, "nginx-body"), filepath.Join(dir, "nginx-proxy"), up, listen)
}

// StartNginx starts nginx in the foreground in front of upstream, with its files under dir,
// ready once it forwards readyPath; maxConns sizes its connection limits.
func StartNginx(ctx context.Context, bin, dir, name, upstream, readyPath string, maxConns int) (*Proc, error) {
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	prefix := filepath.Join(dir, name)
	if err := os.MkdirAll(prefix, 0o755); err != nil {
		return nil, err
	}
	conf := filepath.Join(prefix, "nginx.conf")
	if err := os.WriteFile(conf, []byte(NginxConfig(prefix, addr, upstream, maxConns)), 0o644); err != nil {
		return nil, err
	}
	return Start(ctx, StartOptions{Name: name, Bin: bin, LogDir: dir, URL: "http://" + addr, ReadyPath: readyPath,
		Args: []string{"-p", prefix, "-c", conf, "-e", filepath.Join(prefix, "nginx-error.log"), "-g", "daemon off;"}})
}

// Tree returns pid and its descendants (nginx's workers), from /proc/<pid>/task/*/children.
func Tree(pid int) []int {
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", out[i]))
		for _, t := range tasks {
			b, err := os.ReadFile(t)
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(f); err == nil {
					out = append(out, c)
				}
			}
		}
	}
	return out
}

// TreeCPUTime is CPUTime summed over Tree(pid).
func TreeCPUTime(pid int) (time.Duration, error) {
	var total time.Duration
	for _, p := range Tree(pid) {
		t, err := CPUTime(p)
		if err != nil && p == pid {
			return 0, err
		}
		total += t
	}
	return total, nil
}

// TreeRSS is the resident set size (VmRSS) summed over Tree(pid), in bytes.
func TreeRSS(pid int) (int64, error) {
	return treeStatus(pid, "VmRSS:")
}

// TreeAnonRSS is the anonymous resident memory (RssAnon: the heap, stacks and buffers, not the
// pages of the binary and libraries, which the page cache shares) summed over Tree(pid), in bytes.
func TreeAnonRSS(pid int) (int64, error) {
	return treeStatus(pid, "RssAnon:")
}

// TreePeakRSS is the peak resident set size (VmHWM) summed over Tree(pid), in bytes.
func TreePeakRSS(pid int) (int64, error) {
	return treeStatus(pid, "VmHWM:")
}

func treeStatus(pid int, field string) (int64, error) {
	var total int64
	for _, p := range Tree(pid) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p))
		if err != nil {
			if p == pid {
				return 0, err
			}
			continue
		}
		v, err := ParseStatusKB(b, field)
		if err != nil {
			return 0, err
		}
		total += v
	}
	return total, nil
}

// ParseStatusKB extracts a "<field> <n> kB" line of /proc/<pid>/status, in bytes.
func ParseStatusKB(status []byte, field string) (int64, error) {
	for line := range strings.Lines(string(status)) {
		rest, ok := strings.CutPrefix(line, field)
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("unexpected %s line %q", field, line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("unexpected %s line %q", field, line)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("no %s in status", strings.TrimSuffix(field, ":"))
}

package bench

import (
	"bufio"
	"bytes"
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
	"syscall"
	"time"
)

// Binaries are the executables the harness runs.
type Binaries struct {
	Coordinator, Simworker, RawProxy string
}

// Build compiles the coordinator, the simworker and the raw proxy from the module at repo into
// dir with `go build` (no race detector, symbols kept for profilers).
func Build(ctx context.Context, repo, dir string) (Binaries, error) {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", dir+string(filepath.Separator),
		"./cmd/coordinator", "./test/doubles/simworker/cmd/simworker", "./test/harness/bench/rawproxy")
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("go build: %w\n%s", err, out)
	}
	return Binaries{
		Coordinator: filepath.Join(dir, "coordinator"),
		Simworker:   filepath.Join(dir, "simworker"),
		RawProxy:    filepath.Join(dir, "rawproxy"),
	}, nil
}

// Proc is a child process of the harness.
type Proc struct {
	Name string
	// URL is the base URL it serves.
	URL string
	// LogPath holds its stderr.
	LogPath string
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

// Pid is the child's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// StartOptions describe a child process.
type StartOptions struct {
	Name string
	Bin  string
	Args []string
	// LogDir receives <Name>.log with the child's stderr (and stdout after the URL line).
	LogDir string
	// URL is the base URL the child will serve; empty means the child prints it as its first
	// stdout line (simworker, rawproxy).
	URL string
	// ReadyPath is polled with GET until it answers 200.
	ReadyPath string
	// Env is added to the harness's environment.
	Env []string
}

// Start starts a child and waits until it is ready. The child is killed if the harness dies.
func Start(ctx context.Context, o StartOptions) (*Proc, error) {
	logPath := filepath.Join(o.LogDir, o.Name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(o.Bin, o.Args...)
	cmd.Stderr = logf
	cmd.Env = append(os.Environ(), o.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", o.Name, err)
	}
	p := &Proc{Name: o.Name, URL: o.URL, LogPath: logPath, cmd: cmd, exited: make(chan struct{})}
	urlc := make(chan string, 1)
	go func() {
		br := bufio.NewReader(stdout)
		if o.URL == "" {
			line, _ := br.ReadString('\n')
			urlc <- strings.TrimSpace(line)
		}
		_, _ = io.Copy(logf, br)
	}()
	go func() {
		p.waitErr = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	fail := func(err error) (*Proc, error) {
		p.Stop()
		return nil, fmt.Errorf("%s: %w (log %s: %s)", o.Name, err, logPath, lastLines(logPath, 5))
	}
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	if p.URL == "" {
		select {
		case u := <-urlc:
			if !strings.HasPrefix(u, "http://") {
				return fail(fmt.Errorf("printed %q instead of its URL", u))
			}
			p.URL = u
		case <-p.exited:
			return fail(fmt.Errorf("exited: %w", p.waitErr))
		case <-deadline.C:
			return fail(errors.New("printed no URL within 30s"))
		case <-ctx.Done():
			return fail(ctx.Err())
		}
	}
	client := &http.Client{Timeout: time.Second}
	for {
		resp, err := client.Get(p.URL + o.ReadyPath)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
		select {
		case <-p.exited:
			return fail(fmt.Errorf("exited: %w", p.waitErr))
		case <-deadline.C:
			return fail(fmt.Errorf("not ready at %s%s within 30s", p.URL, o.ReadyPath))
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop sends SIGTERM, waits up to 10 s, then kills. It is safe to call more than once.
func (p *Proc) Stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// Alive reports whether the child is still running.
func (p *Proc) Alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// FreeAddr returns a loopback address with a port that was free a moment ago.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// PeakRSS returns the peak resident set size (VmHWM) of pid in bytes.
func PeakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return ParseVmHWM(b)
}

// ParseVmHWM extracts VmHWM from the text of /proc/<pid>/status, in bytes.
func ParseVmHWM(status []byte) (int64, error) { //nolint:revive // VmHWM: the kernel's field name
	for line := range bytes.Lines(status) {
		rest, ok := bytes.CutPrefix(line, []byte("VmHWM:"))
		if !ok {
			continue
		}
		f := strings.Fields(string(rest))
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("unexpected VmHWM line %q", line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("unexpected VmHWM line %q", line)
		}
		return kb << 10, nil
	}
	return 0, errors.New("no VmHWM in status")
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times (100 on every Linux ABI Go supports).
const clockTicks = 100

// CPUTime returns the user + system CPU time pid has used so far.
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return ParseStatCPU(b)
}

// ParseStatCPU extracts utime + stime from the text of /proc/<pid>/stat.
func ParseStatCPU(stat []byte) (time.Duration, error) {
	// The command name (field 2) is parenthesized and may contain spaces: split after its ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(string(stat[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, errors.New("malformed stat")
	}
	var ticks int64
	for _, s := range f[11:13] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("malformed stat field %q", s)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// SystemBusy returns the CPU time all CPUs of the machine have spent busy (user, nice, system,
// irq, softirq and steal) since boot, from /proc/stat.
func SystemBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	return ParseSystemBusy(b)
}

// ParseSystemBusy extracts the busy time of the aggregate "cpu" line of /proc/stat.
func ParseSystemBusy(stat []byte) (time.Duration, error) {
	line, _, _ := bytes.Cut(stat, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return 0, errors.New("malformed /proc/stat")
	}
	var ticks int64
	for i, s := range f[1:9] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("malformed /proc/stat field %q", s)
		}
		if i != 3 && i != 4 { // idle and iowait
			ticks += v
		}
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

func lastLines(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// CoordinatorConfig is the coordinator config of a benchmark target: listening on listen, with
// gateway.address the worker itself (one hop, like the raw proxy), warn-level logs and the
// decode-only or prefill+decode (kv-nixl) pipeline. No Service fronts it: it stops without a
// drain delay.
func CoordinatorConfig(listen, worker, target string) string {
	steps := "[{type: decode}]"
	if target == TargetPrefillDecode {
		steps = "[{type: prefill}, {type: decode}]"
	}
	return fmt.Sprintf(`# benchmark target %s (written by test/harness/bench)
log_level: 1
server:
  listen_addr: %q
  drain_delay: 0s
gateway:
  address: %q
pipeline:
  kv_connector: kv-nixl
  steps: %s
`, target, listen, worker, steps)
}

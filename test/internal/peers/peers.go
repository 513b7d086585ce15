// Package peers finds and runs the real llm-d peers the test tiers run against: the endpoint
// picker and the vLLM simulator, from environment variables naming their binaries or, when
// those are unset, from the xz-compressed binaries in ../shared/peers beside the repository
// (the layout of the build machines and CI).
package peers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/test/harness/bench"
	"github.com/epd-dev/coordinator/test/harness/cluster"
	"github.com/epd-dev/coordinator/test/harness/prereq"
	"github.com/epd-dev/coordinator/test/internal/loopback"
)

// Environment variables naming the peer binaries (uncompressed, executable) and the directory
// of llm-d's CRDs (llm-d-router config/crd/bases, llm-d.ai_*.yaml), which the EPP watches.
const (
	EPPBinEnv = "LLMD_EPP_BIN"
	SimBinEnv = "LLMD_SIM_BIN"
	CRDsEnv   = "LLMD_CRDS"
)

// Dir is ../shared/peers beside the repository's root.
func Dir() (string, error) {
	root, err := cluster.Root()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "..", "shared", "peers"), nil
}

// Binary returns the binary envVar names, or decompresses xzPath into the cache
// ($XDG_CACHE_HOME or ~/.cache, epd-coordinator/peers/<digest>). A missing file or xz is a
// missing prerequisite (missing says which and how to provide it); a named binary that is not
// there is an error.
func Binary(envVar, xzPath string) (path, missing string, err error) {
	if p := os.Getenv(envVar); p != "" {
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return "", "", fmt.Errorf("%s=%s is not an executable file", envVar, p)
		}
		return p, "", nil
	}
	f, err := os.Open(xzPath)
	if err != nil {
		return "", fmt.Sprintf("%s is not set and %s is not readable (%v): this tier runs llm-d's EPP and simulator; "+
			"set %s and %s to their binaries", envVar, xzPath, err, EPPBinEnv, SimBinEnv), nil
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", "", err
	}
	dir := filepath.Join(cache, "epd-coordinator", "peers", hex.EncodeToString(h.Sum(nil))[:16])
	path = filepath.Join(dir, strings.TrimSuffix(filepath.Base(xzPath), ".xz"))
	if st, err := os.Stat(path); err == nil && st.Mode()&0o111 != 0 {
		return path, "", nil
	}
	if _, err := exec.LookPath("xz"); err != nil {
		return "", fmt.Sprintf("xz is not installed (Debian: xz-utils): it decompresses %s", xzPath), nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return "", "", err
	}
	defer os.Remove(tmp.Name())
	cmd := exec.Command("xz", "-dc", xzPath)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = tmp, &stderr
	if err := cmd.Run(); err != nil {
		tmp.Close()
		return "", "", fmt.Errorf("xz -dc %s: %w: %s", xzPath, err, stderr.String())
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", "", err
	}
	if err := tmp.Close(); err != nil {
		return "", "", err
	}
	return path, "", os.Rename(tmp.Name(), path) // atomic: a concurrent run sees a whole file or none
}

// Sim is a running llm-d simulator.
type Sim struct {
	// URL is its base URL (http://127.0.0.1:port).
	URL  string
	proc *bench.Proc
}

// StartSim runs llm-d's simulator serving model in echo mode with its dummy tokenizer and the
// flags extra (bench.Start: its log in tb's temporary directory, ready when /health answers),
// and stops it when tb ends. A binary that cannot be found is a missing prerequisite
// (prereq.Missing: fails under CI).
func StartSim(tb testing.TB, model string, extra ...string) *Sim {
	tb.Helper()
	dir, err := Dir()
	if err != nil {
		tb.Fatal(err)
	}
	bin, missing, err := Binary(SimBinEnv, filepath.Join(dir, "llm-d-inference-sim.xz"))
	switch {
	case err != nil:
		tb.Fatal(err)
	case missing != "":
		prereq.Missing(tb, "%s", missing)
	}
	addr, err := loopback.FreeAddr()
	if err != nil {
		tb.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	p, err := bench.Start(context.Background(), bench.StartOptions{Name: "llm-d-inference-sim", Bin: bin,
		Args:   append([]string{"--model", model, "--port", port, "--mode", "echo", "--force-dummy-tokenizer"}, extra...),
		LogDir: tb.TempDir(), URL: "http://" + addr, ReadyPath: "/health"})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Stop)
	return &Sim{URL: p.URL, proc: p}
}

// CPU is the simulator process's user and system time so far (/proc, in the kernel's clock
// ticks: 10 ms steps at the usual 100 Hz).
func (s *Sim) CPU() (time.Duration, error) {
	path := fmt.Sprintf("/proc/%d/stat", s.proc.Pid())
	stat, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	d, err := statCPU(stat)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

// statCPU is the user and system time of a /proc/<pid>/stat line: its 14th and 15th fields,
// the 12th and 13th after the command's name (which is in parentheses and may hold spaces and
// parentheses itself).
func statCPU(stat []byte) (time.Duration, error) {
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("%d fields after the name, want 13 or more", len(f))
	}
	var ticks int64
	for _, v := range f[11:13] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// clockTicks is the kernel's USER_HZ, the unit of /proc's times (100 on Linux's every
// architecture the project builds for).
const clockTicks = 100

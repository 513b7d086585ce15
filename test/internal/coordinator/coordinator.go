// Package coordinator runs the real coordinator binary for the suites that test it as a process
// (test/suites/hostile, test/suites/faults): it builds the binary once (or takes another build from an
// environment variable), starts it on free loopback ports with a configuration document, waits
// until it is ready, and kills it when the test ends, failing the test if its log shows a panic.
package coordinator

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/test/internal/loopback"
)

// Build builds pkg (a package path relative to the module root, e.g. ./cmd/coordinator) into dir
// and returns the binary's path.
func Build(pkg, dir string) (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", path, pkg)
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(out)))
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %w\n%s", pkg, err, b)
	}
	return path, nil
}

// Binary returns the coordinator binary named by the environment variable env, or builds
// ./cmd/coordinator into dir.
func Binary(env, dir string) (string, error) {
	if p := os.Getenv(env); p != "" {
		return p, nil
	}
	return Build("./cmd/coordinator", dir)
}

// Process is a running coordinator.
type Process struct {
	Cmd *exec.Cmd
	// URL is the serving listener's base URL, Admin the admin (metrics) listener's.
	URL, Admin string
	Logs       *loopback.Log
}

// Start runs binary with the configuration doc(listen, adminPort) returns for two free loopback
// ports, and env (NAME=value) added to the environment, and waits until /readyz answers 200. The
// process is killed when the test ends; a panic in its log fails the test.
func Start(t *testing.T, binary string, doc func(listen, adminPort string) string, env ...string) *Process {
	t.Helper()
	addr, err := loopback.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	admin, err := loopback.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	_, adminPort, _ := net.SplitHostPort(admin)
	text := doc(addr, adminPort)
	path := filepath.Join(t.TempDir(), "coordinator.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &Process{URL: "http://" + addr, Admin: "http://" + admin, Logs: &loopback.Log{}}
	p.Cmd = exec.Command(binary, "--config", path, "--watch=false")
	p.Cmd.Env = append(os.Environ(), env...)
	p.Cmd.Stderr = p.Logs
	if err := p.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = p.Cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = p.Cmd.Process.Kill()
		<-exited
		if strings.Contains(p.Logs.String(), "panic") {
			t.Errorf("the coordinator's log has a panic:\n%s", p.Logs.Tail(4000))
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; {
		if resp, err := http.Get(p.URL + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case <-exited:
			t.Fatalf("the coordinator exited; config:\n%s\nlog:\n%s", text, p.Logs.Tail(4000))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("coordinator not ready; config:\n%s\nlog:\n%s", text, p.Logs.Tail(4000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

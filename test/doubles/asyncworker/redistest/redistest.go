// Package redistest runs a real redis-server for tests: on a free loopback port, in a temporary
// directory, without persistence, stopped at the end of the test. It can stop and restart the
// server on the same port (a Redis restart that loses every key).
//
// Without redis-server on PATH the test is skipped with instructions, or fails when CI is set:
// CI must run these tests.
package redistest

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/test/harness/prereq"
)

// Options shape the server.
type Options struct {
	// Notify is the notify-keyspace-events value ("" disables keyspace notifications), e.g.
	// "Kl" for the list events the async broker's waiters listen to.
	Notify string
	// Args are extra redis-server arguments.
	Args []string
}

// Server is a running (or stopped) redis-server.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	opts Options

	mu     sync.Mutex
	cmd    *exec.Cmd
	out    *bytes.Buffer
	exited chan struct{}
}

// Binary returns the redis-server path, or stops the test with prereq.Missing when there is none.
func Binary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err == nil {
		return bin
	}
	prereq.Missing(t, "redis-server is not on PATH: these tests need a real Redis. "+
		"Install it with `apt-get install -y redis-server` (Debian/Ubuntu) and run the tests again.")
	return ""
}

// Start runs a redis-server for the test; it is stopped by the test's cleanup.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	s := &Server{t: t, bin: Binary(t), dir: t.TempDir(), opts: o}
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if s.port, err = freePort(); err != nil {
			continue
		}
		if err = s.start(); err == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("starting redis-server: %v", err)
	return nil
}

// Addr is host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL is the redis:// URL of database 0.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Port is the TCP port (kept across restarts).
func (s *Server) Port() int { return s.port }

func (s *Server) start() error {
	args := []string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", "",
		"--notify-keyspace-events", s.opts.Notify,
	}
	args = append(args, s.opts.Args...)
	cmd := exec.Command(s.bin, args...)
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("redis-server exited at start:\n%s", out.String())
		default:
		}
		if ping(s.Addr()) == nil {
			s.mu.Lock()
			s.cmd, s.out, s.exited = cmd, out, exited
			s.mu.Unlock()
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-exited
	return fmt.Errorf("redis-server did not answer PING within 10s:\n%s", out.String())
}

// Stop terminates the server (if running) and waits for it to exit; every key is lost.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd, s.exited = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// Restart stops the server and starts a fresh one on the same port.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.Resume()
}

// Resume starts a stopped server again on the same port.
func (s *Server) Resume() {
	s.t.Helper()
	var err error
	for attempt := 0; attempt < 50; attempt++ { // the port may linger briefly
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("restarting redis-server on port %d: %v", s.port, err)
}

// Log returns what the server printed.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out == nil {
		return ""
	}
	return s.out.String()
}

// Do sends one command and returns the first line of the reply (a status, an integer or an
// error; for quick checks without a client library).
func (s *Server) Do(args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimRight(line, "\r\n"), err
}

func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("unexpected PING answer %q", line)
	}
	return nil
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Package command is the plumbing the test doubles' commands (simworker, gateway, asyncworker)
// share: a flag set that reports errors instead of exiting and refuses stray arguments, a main
// that runs until SIGINT or SIGTERM and exits 1 with the error, the serve loop of a loopback
// server (print its URL on stdout once it listens, serve until the context ends, shut down), and
// Started, which runs such a command in a test.
package command

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// Run is a command's body: it parses args and runs until ctx is done.
type Run func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// Main runs run with the process arguments and a context cancelled by SIGINT or SIGTERM, and
// exits 1 logging the error when it fails.
func Main(run Run) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		log.Fatal(err)
	}
}

// FlagSet returns an empty flag set named name that writes its messages to stderr and returns
// parse errors (flag.ContinueOnError).
func FlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// Parse parses args with fs and rejects positional arguments.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	return nil
}

// Server is a started loopback server.
type Server interface {
	// URL is the base URL clients dial.
	URL() string
	// Close shuts the server down.
	Close() error
}

// Serving returns the Run of a server command: it parses args with parse, starts the server
// with start, prints its URL on stdout and serves until ctx is done, then closes the server.
func Serving[C any, S Server](parse func(args []string, stderr io.Writer) (C, error), start func(C) (S, error)) Run {
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		cfg, err := parse(args, stderr)
		if err != nil {
			return err
		}
		srv, err := start(cfg)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, srv.URL())
		<-ctx.Done()
		return srv.Close()
	}
}

// Started runs a server command's run with args the way a test would: in a goroutine, until the
// URL it prints is read. It returns that URL and stop, which cancels run's context and returns
// run's error (the test's cleanup calls it too). A run that prints no URL fails the test with
// its error.
func Started(t testing.TB, run Run, args ...string) (url string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := run(ctx, args, pw, io.Discard)
		pw.Close()
		done <- err
	}()
	line, readErr := bufio.NewReader(pr).ReadString('\n')
	go func() { _, _ = io.Copy(io.Discard, pr) }() // whatever run prints later
	stop = sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	if readErr != nil {
		t.Fatalf("run %q printed no URL: %v", args, stop())
	}
	t.Cleanup(func() { _ = stop() })
	return strings.TrimSpace(line), stop
}

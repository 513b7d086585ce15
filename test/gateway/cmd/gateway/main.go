// Command gateway runs a loopback Inference Gateway stand-in (see package
// gateway).
//
// It prints its base URL on stdout once it is listening and serves until
// SIGINT or SIGTERM, then shuts down gracefully.
//
//	gateway --listen 127.0.0.1:8080 \
//	  --pool encode=http://127.0.0.1:8001 \
//	  --pool prefill=http://127.0.0.1:8002,http://127.0.0.1:8003 \
//	  --pool decode=http://127.0.0.1:8004
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/epd-dev/coordinator/test/gateway"
)

// main runs the command until SIGINT or SIGTERM.
func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		log.Fatal(err)
	}
}

// run parses args, starts the gateway, prints its URL and serves until ctx
// is done.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	g, err := gateway.Start(cfg)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, g.URL())
	<-ctx.Done()
	return g.Close()
}

// poolFlag collects repeated --pool profile=url1,url2 flags.
type poolFlag map[string][]string

// String implements flag.Value.
func (p poolFlag) String() string {
	parts := make([]string, 0, len(p))
	for name, urls := range p {
		parts = append(parts, name+"="+strings.Join(urls, ","))
	}
	return strings.Join(parts, " ")
}

// Set implements flag.Value.
func (p poolFlag) Set(v string) error {
	name, urls, ok := strings.Cut(v, "=")
	name = strings.TrimSpace(name)
	if !ok || name == "" || strings.TrimSpace(urls) == "" {
		return fmt.Errorf("want profile=url1,url2, got %q", v)
	}
	for _, u := range strings.Split(urls, ",") {
		if u = strings.TrimSpace(u); u != "" {
			p[name] = append(p[name], u)
		}
	}
	return nil
}

// parseFlags turns command-line flags into a Config.
func parseFlags(args []string, stderr io.Writer) (gateway.Config, error) {
	cfg := gateway.Config{Pools: map[string][]string{}}
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Addr, "listen", "127.0.0.1:0", "listen address")
	fs.Var(poolFlag(cfg.Pools), "pool", "profile=url1,url2 (repeatable)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	return cfg, nil
}

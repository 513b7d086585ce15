// Command rawproxy is the floor for any Go proxy in the benchmarks (docs/benchmarks.md): a
// one-hop net/http/httputil.ReverseProxy that forwards every request to one upstream URL and
// flushes each write at once (FlushInterval -1), nothing else (but full duplex, without which
// net/http truncates some streamed answers).
//
// It prints its base URL on stdout once it is listening and serves until SIGINT or SIGTERM.
//
//	rawproxy --upstream http://127.0.0.1:8000 --addr 127.0.0.1:0
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"
)

// GoroutinesPath answers the proxy's goroutine count instead of being forwarded.
const GoroutinesPath = "/_rawproxy/goroutines"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		log.Fatal(err)
	}
}

// run parses args, serves the proxy, prints its URL and serves until ctx is done.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("rawproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	upstream := fs.String("upstream", "", "base URL every request is forwarded to (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	proxy, err := newProxy(*upstream)
	if err != nil {
		return err
	}
	// Full duplex, or net/http closes the inbound body once the response starts while the
	// transport still reads it (its check for bytes past Content-Length), which tears down the
	// upstream connection and truncates fast streamed answers (golang/go#40747).
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == GoroutinesPath { // the harness's per-stream accounting
			fmt.Fprint(w, runtime.NumGoroutine())
			return
		}
		_ = http.NewResponseController(w).EnableFullDuplex()
		proxy.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "http://%s\n", ln.Addr())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// newProxy returns the reverse proxy to upstream. Its transport is the default one with the
// coordinator's keep-alive pool size (gateway.max_idle_conns_per_host: 100) instead of net/http's
// 2, so that both proxies reuse upstream connections under the same concurrency.
func newProxy(upstream string) (*httputil.ReverseProxy, error) {
	u, err := url.Parse(upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--upstream must be an http(s) URL, got %q", upstream)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.MaxIdleConnsPerHost = 100
	return &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(u) },
		FlushInterval: -1,
		Transport:     tr,
	}, nil
}

// Command steadyload is the steady client load of package endpoints as a program, for the
// real-node tier (issue #32): it sends chat completions (non-streaming, or streaming with --stream) to a coordinator Service's
// URL from a few clients in a loop (each with keep-alive, as an SDK client does) until SIGINT or
// SIGTERM, --duration or --requests, then prints what it saw as one JSON object on stdout
// ({"served":N,"failed":M,"failures":[...],"retried":K,"retries":[...]}) and exits 1 when a
// request failed. A request that got no byte of answer on a kept-alive connection the server
// closed is sent again, as the OpenAI SDKs do, and counted in "retried" (endpoints.ErrStaleConnection).
//
//	steadyload --url http://10.96.0.42:8080 --clients 4 &   # then: kubectl rollout restart ...
//	kill -INT %1                                             # prints the counts; exit 1 on a loss
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/epd-dev/coordinator/test/harness/endpoints"
	"github.com/epd-dev/coordinator/test/internal/command"
)

func main() { command.Main(run) }

// errLoss is the error of a run in which requests failed (the counts are on stdout).
var errLoss = errors.New("requests failed")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := command.FlagSet("steadyload", stderr)
	url := fs.String("url", "", "base URL of the coordinator Service, e.g. http://10.96.0.42:8080 (required)")
	clients := fs.Int("clients", 4, "concurrent clients, each sending one request after the other")
	model := fs.String("model", "sim-model", "the requests' model")
	maxTokens := fs.Int("max-tokens", 3, "the requests' max_tokens")
	duration := fs.Duration("duration", 0, "stop after this long (0: until SIGINT or SIGTERM, or --requests)")
	requests := fs.Int("requests", 0, "stop once this many requests ended, served or failed (0: no limit)")
	stream := fs.Bool("stream", false, "send streaming chat completions (succeeded when the stream ends in data: [DONE])")
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	if *url == "" || *clients < 1 || *maxTokens < 1 || *duration < 0 || *requests < 0 {
		return fmt.Errorf("--url is required; --clients and --max-tokens must be positive, --duration and --requests not negative")
	}
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	req := endpoints.Chat(*model, *maxTokens)
	if *stream {
		req = endpoints.ChatStream(*model, *maxTokens)
	}
	load := endpoints.StartLoad(*url, *clients, req)
	if *requests > 0 {
		_ = load.WaitFor(ctx, func(r endpoints.Result) bool { return r.Served+r.Failed >= *requests })
	} else {
		<-ctx.Done()
	}
	res := load.Stop()
	out := struct {
		Served   int      `json:"served"`
		Failed   int      `json:"failed"`
		Failures []string `json:"failures"`
		Retried  int      `json:"retried"`
		Retries  []string `json:"retries"`
		At       string   `json:"at"`
	}{res.Served, res.Failed, nonNil(res.Failures), res.Retried, nonNil(res.Retries), time.Now().UTC().Format(time.RFC3339)}
	if err := json.NewEncoder(stdout).Encode(out); err != nil {
		return err
	}
	if res.Failed > 0 {
		return errLoss
	}
	return nil
}

// nonNil is s, or an empty slice (a JSON array, not null) for nil.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

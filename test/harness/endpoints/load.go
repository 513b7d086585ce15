package endpoints

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Request sends one request with client to the base URL and returns why it failed (nil when
// it succeeded).
type Request func(ctx context.Context, client *http.Client, base string) error

// Chat is a Request: a non-streaming chat completion for model of at most maxTokens tokens,
// succeeded when it is answered 200 with a JSON body read to its end.
func Chat(model string, maxTokens int) Request {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"steady"}]}`, model, maxTokens)
	return func(ctx context.Context, client *http.Client, base string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		switch {
		case err != nil:
			return fmt.Errorf("HTTP %d, body cut: %w", resp.StatusCode, err)
		case resp.StatusCode != http.StatusOK:
			return fmt.Errorf("HTTP %d: %.200s", resp.StatusCode, b)
		case !json.Valid(b):
			return fmt.Errorf("HTTP 200 with a body that is not JSON: %.200s", b)
		}
		return nil
	}
}

// ChatStream is a Request: a streaming chat completion for model of at most maxTokens tokens,
// succeeded when it is answered 200 with a server-sent event stream read to its "data: [DONE]".
func ChatStream(model string, maxTokens int) Request {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":true,"messages":[{"role":"user","content":"steady"}]}`, model, maxTokens)
	return func(ctx context.Context, client *http.Client, base string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		switch {
		case err != nil:
			return fmt.Errorf("HTTP %d, stream cut: %w", resp.StatusCode, err)
		case resp.StatusCode != http.StatusOK:
			return fmt.Errorf("HTTP %d: %.200s", resp.StatusCode, b)
		case !strings.Contains(string(b), "data: [DONE]"):
			return fmt.Errorf("HTTP 200 with a stream that does not end in data: [DONE]: %.200s", b)
		}
		return nil
	}
}

// Load is a steady client load: clients goroutines, each sending one request after the other
// through one shared keep-alive transport (as an SDK client does), until Stop.
type Load struct {
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu       sync.Mutex
	served   int
	failed   int
	failures []string
	progress chan struct{} // closed and replaced on every request that ends
}

// Result is what a Load saw.
type Result struct {
	// Served and Failed count the requests that succeeded and failed.
	Served, Failed int
	// Failures are the first reasons of failure (at most maxFailures), with when they happened.
	Failures []string
}

const maxFailures = 20

// StartLoad starts clients goroutines sending req to base in a loop.
func StartLoad(base string, clients int, req Request) *Load {
	ctx, stop := context.WithCancel(context.Background())
	l := &Load{stop: stop, progress: make(chan struct{})}
	client := &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: clients, IdleConnTimeout: time.Minute},
		Timeout:   30 * time.Second,
	}
	for range clients {
		l.wg.Go(func() {
			for ctx.Err() == nil {
				err := req(ctx, client, base)
				if ctx.Err() != nil {
					return // stopped mid-request: neither served nor failed
				}
				l.record(err)
			}
		})
	}
	return l
}

func (l *Load) record(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil {
		l.served++
	} else {
		l.failed++
		if len(l.failures) < maxFailures {
			l.failures = append(l.failures, time.Now().Format("15:04:05.000")+" "+err.Error())
		}
	}
	close(l.progress)
	l.progress = make(chan struct{})
}

// Result is what the load saw so far.
func (l *Load) Result() Result {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Result{Served: l.served, Failed: l.failed, Failures: append([]string(nil), l.failures...)}
}

// WaitServed waits until at least n requests succeeded in all, or ctx ends.
func (l *Load) WaitServed(ctx context.Context, n int) error {
	return l.WaitFor(ctx, func(r Result) bool { return r.Served >= n })
}

// WaitFor waits until done holds for what the load saw, checked after every request that ends,
// or ctx ends.
func (l *Load) WaitFor(ctx context.Context, done func(Result) bool) error {
	for {
		l.mu.Lock()
		progress := l.progress
		l.mu.Unlock()
		r := l.Result()
		if done(r) {
			return nil
		}
		select {
		case <-progress:
		case <-ctx.Done():
			return fmt.Errorf("%d requests served, %d failed: %w", r.Served, r.Failed, ctx.Err())
		}
	}
}

// Stop ends the load (requests in flight are abandoned, counted neither way) and returns what it
// saw.
func (l *Load) Stop() Result {
	l.stop()
	l.wg.Wait()
	return l.Result()
}

package endpoints

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Request sends one request with client to the base URL and returns why it failed (nil when
// it succeeded).
type Request func(ctx context.Context, client *http.Client, base string) error

// ErrStaleConnection marks a request that got no byte of answer on a kept-alive connection the
// server closed: the race any HTTP/1.1 client runs with a server that closes an idle connection
// just as the client reuses it (RFC 9112, section 9.3.1). net/http retries it only when nothing
// of the request was written; the OpenAI SDKs retry it as any connection error. A Load retries
// it (maxStaleRetries times) and counts it apart from the failures.
var ErrStaleConnection = errors.New("a kept-alive connection closed with no byte of answer")

// maxStaleRetries is how often a Load retries a request after ErrStaleConnection: the OpenAI
// SDKs' default max_retries.
const maxStaleRetries = 2

// Chat is a Request: a non-streaming chat completion for model of at most maxTokens tokens,
// succeeded when it is answered 200 with a JSON body read to its end.
func Chat(model string, maxTokens int) Request {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"steady"}]}`, model, maxTokens)
	return post(body, "body", func(b []byte) error {
		if !json.Valid(b) {
			return fmt.Errorf("HTTP 200 with a body that is not JSON: %.200s", b)
		}
		return nil
	})
}

// ChatStream is a Request: a streaming chat completion for model of at most maxTokens tokens,
// succeeded when it is answered 200 with a server-sent event stream read to its "data: [DONE]".
func ChatStream(model string, maxTokens int) Request {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":true,"messages":[{"role":"user","content":"steady"}]}`, model, maxTokens)
	return post(body, "stream", func(b []byte) error {
		if !bytes.Contains(b, []byte("data: [DONE]")) {
			return fmt.Errorf("HTTP 200 with a stream that does not end in data: [DONE]: %.200s", b)
		}
		return nil
	})
}

// post is a Request posting body to /v1/chat/completions: succeeded when answered 200 with an
// answer (what names it in errors) read to its end that valid accepts. A failure with no byte
// of answer on a reused connection closed under it is an ErrStaleConnection.
func post(body, what string, valid func([]byte) error) Request {
	return func(ctx context.Context, client *http.Client, base string) error {
		var reused, answered bool
		trace := &httptrace.ClientTrace{
			GotConn:              func(c httptrace.GotConnInfo) { reused = c.Reused },
			GotFirstResponseByte: func() { answered = true },
		}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			if reused && !answered && ctx.Err() == nil && closedUnder(err) {
				return fmt.Errorf("%w: %w", ErrStaleConnection, err)
			}
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		switch {
		case err != nil:
			return fmt.Errorf("HTTP %d, %s cut: %w", resp.StatusCode, what, err)
		case resp.StatusCode != http.StatusOK:
			return fmt.Errorf("HTTP %d: %.200s", resp.StatusCode, b)
		}
		return valid(b)
	}
}

// closedUnder reports whether err is a connection closed or reset by the peer.
func closedUnder(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
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
	retried  int
	retries  []string
	progress chan struct{} // closed and replaced on every request that ends
}

// Result is what a Load saw.
type Result struct {
	// Served and Failed count the requests that succeeded and failed.
	Served, Failed int
	// Failures are the first reasons of failure (at most maxFailures), with when they happened.
	Failures []string
	// Retried counts the attempts that ended in ErrStaleConnection and were sent again (see
	// maxStaleRetries); Retries are their first reasons, as Failures.
	Retried int
	Retries []string
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
				for try := 0; try < maxStaleRetries && errors.Is(err, ErrStaleConnection); try++ {
					l.retry(err)
					err = req(ctx, client, base)
				}
				if ctx.Err() != nil {
					return // stopped mid-request: neither served nor failed
				}
				l.record(err)
			}
		})
	}
	return l
}

// retry counts an attempt sent again after err.
func (l *Load) retry(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.retried++
	l.retries = appendReason(l.retries, err)
}

func (l *Load) record(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil {
		l.served++
	} else {
		l.failed++
		l.failures = appendReason(l.failures, err)
	}
	close(l.progress)
	l.progress = make(chan struct{})
}

// appendReason appends err, with the time, to reasons unless it holds maxFailures already.
func appendReason(reasons []string, err error) []string {
	if len(reasons) >= maxFailures {
		return reasons
	}
	return append(reasons, time.Now().Format("15:04:05.000")+" "+err.Error())
}

// Result is what the load saw so far.
func (l *Load) Result() Result {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Result{
		Served: l.served, Failed: l.failed, Failures: append([]string(nil), l.failures...),
		Retried: l.retried, Retries: append([]string(nil), l.retries...),
	}
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

// Package asyncworker is a small consumer of the async-broker step's Redis queues: it takes
// queued requests earliest deadline first, runs each through the coordinator (a plain POST to the
// stored endpoint, without the mode header, so the async-broker step lets it through), and stores
// the answer in the request's mailbox. It honours cancellation (DELETE /v1/requests/{id}, a
// wait-mode client going away) and deadlines. docs/async-broker.md describes the contract it
// implements; llm-d-async's processor is the production consumer.
//
// Delivery is at most once per dequeue: a worker killed while running a request loses that copy
// (its client sees 504 at the deadline, or re-submits with the same x-request-id). A worker that
// is stopped (Run's context ends) puts its running requests back in their queues.
package asyncworker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/broker"
	"github.com/epd-dev/coordinator/dataplane/broker/redisbroker"
)

// Config configures a Worker.
type Config struct {
	// RedisURL is the broker's Redis, e.g. redis://redis:6379/0.
	RedisURL string
	// Coordinator is the coordinator's base URL (http://host:port).
	Coordinator string
	// Queues are the sorted sets to serve (default: broker.DefaultQueue).
	Queues []string
	// Concurrency is how many requests run at once (default 4).
	Concurrency int
	// ResultTTL is how long a stored result is kept in its mailbox (default 1h).
	ResultTTL time.Duration
	// CancelPoll is how often a running request's cancel marker is checked (default 250ms).
	CancelPoll time.Duration
	// ModeHeader is stripped from every request in case a stored header carries it (default X-AP-Mode).
	ModeHeader string
	// MaxResponseBytes bounds a stored answer (default 64 MiB); a larger one is an INFERENCE_ERROR.
	MaxResponseBytes int64
	// HTTPClient sends the requests (default: no overall timeout; each request is bounded by its deadline).
	HTTPClient *http.Client
	// Log gets one line per request at the verbose level, failures at info.
	Log logr.Logger
}

// Stats counts what a worker did.
type Stats struct {
	// Completed requests got an HTTP answer (whatever its status).
	Completed int64
	// Failed requests got an INFERENCE_ERROR or INVALID_REQUEST result.
	Failed int64
	// Cancelled requests were cancelled before or while running.
	Cancelled int64
	// Expired requests reached their deadline before or while running.
	Expired int64
	// Dropped copies were superseded (a newer copy of the same id is live) or malformed.
	Dropped int64
	// Requeued requests were put back because the worker stopped.
	Requeued int64
}

// Worker consumes the queues.
type Worker struct {
	cfg   Config
	rdb   *redis.Client
	http  *http.Client
	log   logr.Logger
	stats struct {
		completed, failed, cancelled, expired, dropped, requeued atomic.Int64
	}
}

// blockTimeout bounds each BZPOPMIN, and so how long Run takes to notice its context ended.
const blockTimeout = time.Second

// errCancelled is the cause of a request context ended by a cancel marker.
var errCancelled = errors.New("request cancelled")

// storeScript stores a result: the mailbox keeps the newest few, expires after the result TTL,
// and the live marker goes if it still names this copy.
//
//	KEYS: mailbox, active
//	ARGV: result JSON, TTL (s), token
var storeScript = redis.NewScript(`
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], 0, 15)
redis.call('EXPIRE', KEYS[1], ARGV[2])
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) == ARGV[3] then
  redis.call('DEL', KEYS[2])
end
return 1
`)

// New validates cfg and prepares the Redis client (without connecting).
func New(cfg Config) (*Worker, error) {
	if cfg.Coordinator == "" {
		return nil, errors.New("asyncworker: the coordinator URL is required")
	}
	opts, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("asyncworker: redis URL: %w", err)
	}
	opts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	opts.DisableIdentity = true
	if len(cfg.Queues) == 0 {
		cfg.Queues = []string{broker.DefaultQueue}
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.ResultTTL <= 0 {
		cfg.ResultTTL = time.Hour
	}
	if cfg.CancelPoll <= 0 {
		cfg.CancelPoll = 250 * time.Millisecond
	}
	if cfg.ModeHeader == "" {
		cfg.ModeHeader = broker.DefaultModeHeader
	}
	if cfg.MaxResponseBytes <= 0 {
		cfg.MaxResponseBytes = 64 << 20
	}
	w := &Worker{cfg: cfg, rdb: redis.NewClient(opts), http: cfg.HTTPClient, log: cfg.Log}
	if w.http == nil {
		w.http = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: cfg.Concurrency}}
	}
	if w.log.GetSink() == nil {
		w.log = logr.Discard()
	}
	w.cfg.Coordinator = strings.TrimRight(cfg.Coordinator, "/")
	return w, nil
}

// Close releases the Redis client (after Run returned).
func (w *Worker) Close() error {
	if t, ok := w.http.Transport.(*http.Transport); ok && w.cfg.HTTPClient == nil {
		t.CloseIdleConnections()
	}
	return w.rdb.Close()
}

// Stats returns the counters.
func (w *Worker) Stats() Stats {
	return Stats{
		Completed: w.stats.completed.Load(), Failed: w.stats.failed.Load(), Cancelled: w.stats.cancelled.Load(),
		Expired: w.stats.expired.Load(), Dropped: w.stats.dropped.Load(), Requeued: w.stats.requeued.Load(),
	}
}

// Run serves the queues until ctx ends, then puts the requests still running back in their
// queues and returns.
func (w *Worker) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for i := 0; i < w.cfg.Concurrency; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.loop(ctx)
		}()
	}
	wg.Wait()
	return nil
}

func (w *Worker) loop(ctx context.Context) {
	for ctx.Err() == nil {
		// Not cut short by ctx: a pop Redis already applied must reach us, or the request is lost.
		z, err := w.rdb.BZPopMin(context.Background(), blockTimeout, w.cfg.Queues...).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			w.log.V(logging.Verbose).Info("asyncworker: dequeue failed", "err", err.Error())
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		member, _ := z.Member.(string)
		w.handle(ctx, z.Key, z.Score, member)
	}
}

// handle runs one dequeued envelope to its stored result.
func (w *Worker) handle(ctx context.Context, queue string, score float64, member string) {
	var env redisbroker.Envelope
	if err := json.Unmarshal([]byte(member), &env); err != nil || env.Data.ID == "" {
		w.stats.dropped.Add(1)
		w.log.Info("asyncworker: dropped a malformed queue member", "queue", queue, "err", fmt.Sprint(err))
		return
	}
	id, token := env.Data.ID, env.Internal.RequestToken
	log := w.log.WithValues("id", id, "queue", queue)
	mailbox := env.Internal.ResultQueueName
	if mailbox == "" {
		tenant, reqID, _ := redisbroker.SplitEnvelopeID(id)
		mailbox = redisbroker.ResultKey(tenant, reqID)
	}
	deadline := time.Unix(env.Data.Deadline, 0)
	if ctx.Err() != nil {
		// Popped while stopping: leave it to another worker.
		w.requeue(queue, score, member)
		return
	}

	// Pre-dispatch: cancelled, expired, or superseded copies do not run.
	mctx, mcancel := context.WithTimeout(ctx, 5*time.Second)
	vals, err := w.rdb.MGet(mctx, redisbroker.ActiveKey(id), redisbroker.CancelKey(id)).Result()
	mcancel()
	if err != nil {
		log.Info("asyncworker: cannot read the request's markers; putting it back", "err", err.Error())
		w.requeue(queue, score, member)
		return
	}
	active, _ := vals[0].(string)
	cancelled, _ := vals[1].(string)
	switch {
	case token != "" && cancelled == token:
		w.store(log, mailbox, id, token, errorResult(id, redisbroker.ErrCodeCancelled, "cancelled"))
		w.stats.cancelled.Add(1)
		return
	case token != "" && active != token:
		// A newer copy is live, or the request completed or was forgotten meanwhile: storing
		// anything would overwrite a real result.
		w.stats.dropped.Add(1)
		log.V(logging.Verbose).Info("asyncworker: dropped a superseded copy")
		return
	case !time.Now().Before(deadline):
		w.store(log, mailbox, id, token, errorResult(id, redisbroker.ErrCodeDeadlineExceeded, "deadline exceeded before the request started"))
		w.stats.expired.Add(1)
		return
	}
	if !validEndpoint(env.Data.Endpoint) {
		w.store(log, mailbox, id, token, errorResult(id, redisbroker.ErrCodeInvalidRequest, "invalid endpoint"))
		w.stats.failed.Add(1)
		return
	}

	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	rctx, cancelDeadline := context.WithDeadline(rctx, deadline)
	defer cancelDeadline()
	if token != "" {
		go w.watchCancel(rctx, id, token, cancel)
	}
	res, err := w.run(rctx, env)
	switch {
	case err == nil:
		w.stats.completed.Add(1)
	case errors.Is(context.Cause(rctx), errCancelled):
		res = errorResult(id, redisbroker.ErrCodeCancelled, "cancelled while running")
		w.stats.cancelled.Add(1)
	case ctx.Err() != nil:
		// The worker is stopping: another worker runs it.
		w.requeue(queue, score, member)
		return
	case errors.Is(rctx.Err(), context.DeadlineExceeded):
		res = errorResult(id, redisbroker.ErrCodeDeadlineExceeded, "deadline exceeded while running")
		w.stats.expired.Add(1)
	default:
		res = errorResult(id, redisbroker.ErrCodeInferenceError, err.Error())
		w.stats.failed.Add(1)
	}
	w.store(log, mailbox, id, token, res)
	log.V(logging.Verbose).Info("asyncworker: request done", "status", res.StatusCode, "error_code", res.ErrorCode)
}

// run POSTs the request to the coordinator and reads the whole answer.
func (w *Worker) run(ctx context.Context, env redisbroker.Envelope) (redisbroker.Result, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.cfg.Coordinator+env.Data.Endpoint, bytes.NewReader(env.Data.Payload))
	if err != nil {
		return redisbroker.Result{}, err
	}
	for k, v := range env.Data.Headers {
		req.Header.Set(k, v)
	}
	req.Header.Del(w.cfg.ModeHeader)
	req.Header.Set("Content-Type", "application/json")
	if _, reqID, ok := redisbroker.SplitEnvelopeID(env.Data.ID); ok {
		req.Header.Set("x-request-id", reqID)
	}
	if tp := env.Data.Metadata["traceparent"]; tp != "" {
		req.Header.Set("traceparent", tp)
	}
	resp, err := w.http.Do(req)
	if err != nil {
		return redisbroker.Result{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, w.cfg.MaxResponseBytes+1))
	if err != nil {
		return redisbroker.Result{}, fmt.Errorf("reading the answer: %w", err)
	}
	if int64(len(body)) > w.cfg.MaxResponseBytes {
		return redisbroker.Result{}, fmt.Errorf("answer larger than %d bytes", w.cfg.MaxResponseBytes)
	}
	return redisbroker.Result{ID: env.Data.ID, StatusCode: resp.StatusCode, Payload: string(body)}, nil
}

// watchCancel ends the request's context when its cancel marker names this copy.
func (w *Worker) watchCancel(ctx context.Context, id, token string, cancel context.CancelCauseFunc) {
	t := time.NewTicker(w.cfg.CancelPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if v, err := w.rdb.Get(ctx, redisbroker.CancelKey(id)).Result(); err == nil && v == token {
				cancel(errCancelled)
				return
			}
		}
	}
}

// store writes the result, retrying through a Redis outage for up to a minute.
func (w *Worker) store(log logr.Logger, mailbox, id, token string, res redisbroker.Result) {
	b, _ := json.Marshal(res)
	ttl := int64(w.cfg.ResultTTL / time.Second)
	backoff := 100 * time.Millisecond
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := storeScript.Run(ctx, w.rdb, []string{mailbox, redisbroker.ActiveKey(id)}, string(b), ttl, token).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log.Error(err, "asyncworker: storing the result failed; it is lost")
			return
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 2*time.Second)
	}
}

// requeue puts a member back with its score.
func (w *Worker) requeue(queue string, score float64, member string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.rdb.ZAdd(ctx, queue, redis.Z{Score: score, Member: member}).Err(); err != nil {
		w.log.Error(err, "asyncworker: putting a request back failed; it is lost", "queue", queue)
		return
	}
	w.stats.requeued.Add(1)
}

func errorResult(id, code, msg string) redisbroker.Result {
	return redisbroker.Result{ID: id, Payload: `{"error":` + jsonString(msg) + `}`, ErrorCode: code, ErrorMessage: msg}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// validEndpoint accepts an absolute path (no scheme, host, query or dot segments).
func validEndpoint(p string) bool {
	return strings.HasPrefix(p, "/") && !strings.HasPrefix(p, "//") && !strings.ContainsAny(p, "?#\\ ") && !strings.Contains(p, "/../")
}

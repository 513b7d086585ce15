package redisbroker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/broker"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
)

// Submit outcomes (submitScript).
const (
	submitEnqueued = "enqueued"
	submitLive     = "live"
	submitDone     = "done"
)

// Lookup states (lookupScript).
const (
	stateReady     = "ready"
	statePending   = "pending"
	stateExpired   = "expired"
	stateCancelled = "cancelled"
	stateUnknown   = "unknown"
)

// Public statuses in 202 answers.
const (
	StatusPending   = "pending"
	StatusCompleted = "completed"
)

// keys are one request's Redis keys.
type keys struct {
	envID, result, active, cancel string
}

func keysFor(tenant, id string) keys {
	env := EnvelopeID(tenant, id)
	return keys{envID: env, result: ResultKey(tenant, id), active: ActiveKey(env), cancel: CancelKey(env)}
}

// queued is one request being enqueued or waited for.
type queued struct {
	keys
	id       string
	queue    string
	token    string
	deadline time.Time
	member   []byte
	score    int64
}

// Queue enqueues the request (idempotently: a live copy or a reusable result with the same id
// answers instead) and answers 202 (mode enqueue) or waits for the result (mode wait). The step
// validated the request and computed its time budget.
func (b *Broker) Queue(ctx context.Context, rc *request.Context, tenant, mode string, timeout time.Duration) error {
	client, release, err := b.hold()
	if err != nil {
		return enqueueFailed(rc, err)
	}
	defer release()
	q, err := b.envelope(rc, tenant, timeout)
	if err != nil {
		return enqueueFailed(rc, err)
	}
	outcome, err := b.submit(ctx, client, q)
	if err != nil {
		rc.Log.Error(err, "async-broker: enqueue failed", "queue", q.queue, "tenant", tenant)
		return enqueueFailed(rc, err)
	}
	verbose(rc.Log, "async-broker queued", "mode", mode, "queue", q.queue, "tenant", tenant, "outcome", outcome, "deadline", q.deadline)
	rc.Writer.Header().Set(upstream.RequestIDHeader, rc.ID)
	if mode == broker.ModeEnqueue {
		status := StatusPending
		if outcome == submitDone {
			status = StatusCompleted
		}
		return b.answerAccepted(rc, status)
	}
	return b.wait(ctx, rc, client, q, outcome == submitEnqueued)
}

// envelope builds the sorted-set member of the request.
func (b *Broker) envelope(rc *request.Context, tenant string, timeout time.Duration) (*queued, error) {
	now := b.now()
	deadline := now.Add(timeout)
	r := b.cfg.Route(rc.Model, tenant)
	q := &queued{keys: keysFor(tenant, rc.ID), id: rc.ID, queue: r.Queue, token: newToken(), deadline: deadline}
	// Whole seconds on the wire, rounded up: the consumer never gives up before the client does.
	q.score = (deadline.UnixNano() + int64(time.Second) - 1) / int64(time.Second)
	md := map[string]string{b.cfg.Quota.Attribute: tenant}
	if tp := rc.Header.Get("traceparent"); tp != "" {
		md["traceparent"] = tp
	}
	var hdrs map[string]string
	for _, h := range b.cfg.Forward {
		vs := rc.Header.Values(h)
		if slices.Contains(gateway.RoutingHeaders, http.CanonicalHeaderKey(h)) {
			vs = rc.Forwarded.Values(h) // a client's routing header only when trusted
		}
		if len(vs) > 0 {
			if hdrs == nil {
				hdrs = map[string]string{}
			}
			hdrs[strings.ToLower(h)] = strings.Join(vs, ", ")
		}
	}
	env := Envelope{
		Internal:    Routing{RequestQueueName: q.queue, ResultQueueName: q.result, RequestToken: q.token},
		RequestKind: RequestKindPlain,
		Data: Message{
			ID: q.envID, Created: now.Unix(), Deadline: q.score, Payload: rc.Body.Bytes(),
			Metadata: md, Headers: hdrs, Endpoint: rc.Path,
		},
	}
	var err error
	if q.member, err = json.Marshal(env); err != nil {
		return nil, fmt.Errorf("encoding the envelope: %w", err)
	}
	return q, nil
}

// submit runs submitScript. It is not cut short by the client going away: a write Redis may
// already have applied should be acknowledged or fail on its own terms.
func (b *Broker) submit(ctx context.Context, client *redis.Client, q *queued) (string, error) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.RedisTimeout)
	defer cancel()
	// An absolute expiry (PXAT): a relative TTL would start when Redis runs the script, a little
	// after the deadline was computed, and a lookup right at the deadline would still see the
	// request as pending.
	expireAt := q.deadline.Add(expiredGrace).UnixMilli()
	vals, err := submitScript.Run(sctx, client, []string{q.active, q.result, q.cancel, q.queue},
		q.token, expireAt, q.member, q.score, expiredGrace.Milliseconds()).StringSlice()
	if err != nil {
		return "", err
	}
	if len(vals) == 0 {
		return "", errors.New("empty answer from the submit script")
	}
	return vals[0], nil
}

// lookup runs lookupScript; a ready result's mailbox TTL is shrunk to grace (0 deletes it).
func (b *Broker) lookup(ctx context.Context, client *redis.Client, k keys, grace time.Duration) (state, payload string, err error) {
	lctx, cancel := context.WithTimeout(ctx, b.cfg.RedisTimeout)
	defer cancel()
	vals, err := lookupScript.Run(lctx, client, []string{k.result, k.active, k.cancel},
		grace.Milliseconds(), expiredGrace.Milliseconds()).StringSlice()
	if err != nil {
		return "", "", err
	}
	if len(vals) != 2 {
		return "", "", fmt.Errorf("unexpected answer from the lookup script: %d values", len(vals))
	}
	return vals[0], vals[1], nil
}

// cancel runs cancelScript for the copy with token (any live copy when token is empty).
func (b *Broker) cancel(ctx context.Context, client *redis.Client, k keys, token string, dropResult bool) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, b.cfg.RedisTimeout)
	defer cancel()
	drop := "0"
	if dropResult {
		drop = "1"
	}
	n, err := cancelScript.Run(cctx, client, []string{k.active, k.result, k.cancel}, token, drop, cancelMarkerFloor.Milliseconds()).Int()
	return n == 1, err
}

// wait holds the request until its result is stored, its deadline passes (504), or the wait cap
// passes (202 pending). ours says this request created the queued copy: only then does the client
// going away cancel it (a reattached waiter must not cancel another client's request).
//
// A request that vanishes from Redis before its deadline (a Redis restart without persistence)
// is queued again, up to maxResubmits times, so the waiter still gets its result.
func (b *Broker) wait(ctx context.Context, rc *request.Context, client *redis.Client, q *queued, ours bool) error {
	// The hold may outlast server.write_timeout, like a stream.
	_ = http.NewResponseController(rc.Writer).SetWriteDeadline(time.Time{})
	wake, interval, stop := b.watch(ctx, client, q.result)
	defer stop()
	deadline := time.NewTimer(q.deadline.Sub(b.now()))
	defer deadline.Stop()
	var capC <-chan time.Time
	if b.cfg.WaitCap > 0 {
		t := time.NewTimer(b.cfg.WaitCap)
		defer t.Stop()
		capC = t.C
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	resubmits := 0
	var lastErr error
	for {
		state, payload, err := b.lookup(ctx, client, q.keys, b.cfg.FetchGrace)
		switch {
		case err != nil:
			if lastErr == nil && ctx.Err() == nil {
				rc.Log.Info("async-broker: result lookup failed; still waiting", "err", err.Error())
			}
			lastErr = err
		case state == stateReady:
			return b.deliver(rc, payload)
		case state == stateCancelled:
			return errCancelled()
		case state == stateExpired:
			return errDeadline()
		case state == stateUnknown:
			if resubmits >= maxResubmits {
				return &apierror.Error{Status: http.StatusServiceUnavailable, Type: apierror.TypeUnavailable, Code: "REQUEST_LOST",
					Message: "the broker lost the queued request; retry"}
			}
			resubmits++
			outcome, err := b.submit(ctx, client, q)
			if err == nil {
				rc.Log.Info("async-broker: the queued request vanished from Redis (restart without persistence?); queued it again", "outcome", outcome)
				ours = ours || outcome == submitEnqueued
				continue
			}
			lastErr = err
		default:
			lastErr = nil
			report(waitEvent{parked, q.result, ours})
		}
		select {
		case <-ctx.Done():
			if ours {
				// Nobody will read the answer: stop the consumer from running it.
				if _, err := b.cancel(context.WithoutCancel(ctx), client, q.keys, q.token, false); err != nil {
					rc.Log.Info("async-broker: cancelling an abandoned request failed", "err", err.Error())
				}
			}
			report(waitEvent{left, q.result, ours})
			return fmt.Errorf("client went away while waiting for the queued request: %w", context.Cause(ctx))
		case <-deadline.C:
			if state, payload, err := b.lookup(context.WithoutCancel(ctx), client, q.keys, b.cfg.FetchGrace); err == nil && state == stateReady {
				return b.deliver(rc, payload)
			}
			return errDeadline()
		case <-capC:
			if state, payload, err := b.lookup(ctx, client, q.keys, b.cfg.FetchGrace); err == nil && state == stateReady {
				return b.deliver(rc, payload)
			}
			return b.answerAccepted(rc, StatusPending)
		case <-wake:
		case <-tick.C:
		}
	}
}

// deliver answers with a stored result.
func (b *Broker) deliver(rc *request.Context, raw string) error {
	status, body, e := mapResult(raw)
	if e != nil {
		return e
	}
	h := rc.Writer.Header()
	h.Set("Content-Type", "application/json")
	h.Set(upstream.RequestIDHeader, rc.ID)
	rc.Writer.WriteHeader(status)
	_, _ = rc.Writer.Write(body)
	return nil
}

// answerAccepted answers 202 {"id","status"} with a Location to poll.
func (b *Broker) answerAccepted(rc *request.Context, status string) error {
	h := rc.Writer.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Location", broker.RequestsPath+rc.ID)
	rc.Writer.WriteHeader(http.StatusAccepted)
	_, _ = rc.Writer.Write(acceptedBody(rc.ID, status))
	return nil
}

func acceptedBody(id, status string) []byte {
	b, _ := json.Marshal(struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}{id, status})
	return append(b, '\n')
}

// waitHook, when set (by tests), observes waiters: report calls it.
var waitHook atomic.Pointer[func(waitEvent)]

// waitEvent is a waiter's progress.
type waitEvent struct {
	kind    waitEventKind
	mailbox string
	// ours says the waiter created the queued copy.
	ours bool
}

type waitEventKind int

const (
	// parked: the waiter found its request pending and waits for a wake-up (a notification, its
	// poll, the deadline or the wait cap).
	parked waitEventKind = iota
	// left: the client went away; the waiter cancelled the request if it was ours, and returns.
	left
)

// report passes e to waitHook, if set.
func report(e waitEvent) {
	if h := waitHook.Load(); h != nil {
		(*h)(e)
	}
}

// enqueueFailed is the 503 of a request that could not be queued (with Retry-After: 1).
func enqueueFailed(rc *request.Context, err error) *apierror.Error {
	if rc.Writer != nil {
		rc.Writer.Header().Set("Retry-After", "1")
	}
	return &apierror.Error{Status: http.StatusServiceUnavailable, Type: apierror.TypeUnavailable, Code: "ENQUEUE_FAILED",
		Message: "the request could not be queued: the broker (Redis) is unavailable; retry later", Cause: err}
}

func errDeadline() *apierror.Error {
	return &apierror.Error{Status: http.StatusGatewayTimeout, Type: TypeTimeout, Code: ErrCodeDeadlineExceeded,
		Message: "the request did not complete before its deadline"}
}

func errCancelled() *apierror.Error {
	return &apierror.Error{Status: StatusClientClosed, Type: TypeCancelled, Code: ErrCodeCancelled, Message: "the request was cancelled"}
}

// Package asyncbroker is the async-broker step: a bridge between the coordinator and an
// asynchronous request broker (llm-d-async) over Redis. It must be the first step of a pipeline.
//
// A request carrying the mode header (default X-AP-Mode) is handled by mode:
//   - passthrough: the tenant (X-Team) is classified against its reserved quota, the objective and
//     fairness headers are stamped on the forwarded headers, and the pipeline continues;
//   - enqueue: the request is stored durably in the tenant's route queue and answered with
//     202 {"id","status":"pending"}; the result is fetched later with GET /v1/requests/{id};
//   - wait: as enqueue, then the request is held until its result arrives (woken by keyspace
//     notifications, with a polling fallback), its deadline passes (504), or wait_cap_seconds
//     passes (202 pending).
//
// Requests without the header are untouched: that is also how the consumer re-enters the
// coordinator to run a queued request. The step serves GET and DELETE /v1/requests/{id} on the
// coordinator's listener. docs/async-broker.md documents the params and the Redis contract.
package asyncbroker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/epd-dev/coordinator/dataplane/apierror"
	"github.com/epd-dev/coordinator/dataplane/logging"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline/registry"
	"github.com/epd-dev/coordinator/dataplane/request"
)

// StepType is the registered type name.
const StepType = "async-broker"

func init() {
	registry.Register(registry.Type{Name: StepType, New: New,
		First: "it decides whether the request runs in this pipeline at all"})
}

// Request modes (the mode header's values, case-insensitive).
const (
	ModePassthrough = "passthrough"
	ModeEnqueue     = "enqueue"
	ModeWait        = "wait"
)

const (
	// expiredGrace is how long the live marker outlives the deadline: GET answers 504 rather than
	// 410 during it, and the consumer still finds the marker to report DEADLINE_EXCEEDED.
	expiredGrace = time.Hour
	// cancelMarkerFloor is the shortest life of a cancel marker.
	cancelMarkerFloor = time.Minute
	// notifyBackupPoll is the mailbox poll of a waiter woken by keyspace notifications (a lost
	// notification, a Redis restart); pollInterval the poll without notifications.
	notifyBackupPoll = 2 * time.Second
	pollInterval     = 200 * time.Millisecond
	// probeTTL is how long the notify-keyspace-events probe is trusted.
	probeTTL = 30 * time.Second
	// quotaOpenFor is how long quota fails open without asking Redis after a Redis error, so that
	// a Redis outage costs passthrough requests one timeout per interval, not one each.
	quotaOpenFor = time.Second
	// maxResubmits bounds how often a waiter re-queues a request that Redis lost.
	maxResubmits = 3
)

// errClosed is returned once the pipeline that owns the step was replaced.
var errClosed = errors.New("async-broker step is closed (the pipeline was reloaded)")

// Step is the async-broker step. Its Redis client is created on first use: the factory does no
// I/O (the operator builds pipelines to validate them).
type Step struct {
	cfg    *settings
	log    logr.Logger
	getenv func(string) string

	// backupPoll and poll are the waiters' poll intervals (tests shorten them).
	backupPoll, poll time.Duration
	now              func() time.Time

	mu      sync.Mutex
	client  *redis.Client
	closed  bool
	users   int // holders of the client; the last one closes it after Close
	notify  *notifier
	probeAt time.Time
	probeOK bool

	// quotaOpenUntil (Unix nanoseconds) is when quota stops failing open after a Redis error.
	quotaOpenUntil atomic.Int64
}

// New is the step factory. It validates the params (the builder checks that the step is first).
func New(deps registry.Deps, p *params.Params) (pipeline.Step, error) {
	cfg, err := parseSettings(p)
	if err != nil {
		return nil, err
	}
	log := deps.Log
	if log.GetSink() == nil {
		log = logr.Discard()
	}
	s := &Step{cfg: cfg, log: log, getenv: deps.Getenv, backupPoll: notifyBackupPoll, poll: pollInterval, now: time.Now}
	if d := deps.Overrides.BrokerPollInterval; d > 0 {
		s.poll = d
	}
	if d := deps.Overrides.BrokerBackupPollInterval; d > 0 {
		s.backupPoll = d
	}
	return s, nil
}

// Name is the registered type name.
func (*Step) Name() string { return StepType }

// Execute handles a request by its mode header; without one it does nothing.
func (s *Step) Execute(ctx context.Context, rc *request.Context) error {
	raw := strings.TrimSpace(rc.Header.Get(s.cfg.modeHeader))
	if raw == "" {
		return nil
	}
	mode := strings.ToLower(raw)
	switch mode {
	case ModePassthrough, ModeEnqueue, ModeWait:
	default:
		return invalid("unknown %s %q: use passthrough, enqueue or wait", s.cfg.modeHeader, truncate(raw, 64))
	}
	tenant, err := s.tenant(rc.Header)
	if err != nil {
		return err
	}
	if mode == ModePassthrough {
		return s.passthrough(ctx, rc, tenant)
	}
	if rc.Stream {
		e := invalid("stream is only supported in passthrough mode")
		e.Param = "stream"
		return e
	}
	if rc.Model == "" {
		e := invalid("model is required in %s mode (it selects the queue)", mode)
		e.Param = "model"
		return e
	}
	timeout, err := s.timeout(rc.Header, mode)
	if err != nil {
		return err
	}
	return s.queue(ctx, rc, tenant, mode, timeout)
}

// tenant reads the tenant header (default "default").
func (s *Step) tenant(h http.Header) (string, error) {
	t := strings.TrimSpace(h.Get(s.cfg.tenantHeader))
	switch {
	case t == "":
		return DefaultTenant, nil
	case strings.Contains(t, ":"):
		return "", invalid("%s must not contain ':'", s.cfg.tenantHeader)
	case len(t) > maxTenantLen:
		return "", invalid("%s is longer than %d bytes", s.cfg.tenantHeader, maxTenantLen)
	}
	return t, nil
}

// timeout is the request's time budget: the timeout header (positive whole seconds) or the
// mode's default, clamped to the mode's max_seconds.
func (s *Step) timeout(h http.Header, mode string) (time.Duration, error) {
	spec := s.cfg.enqueue
	if mode == ModeWait {
		spec = s.cfg.wait
	}
	d := spec.def
	if v := strings.TrimSpace(h.Get(s.cfg.timeoutHeader)); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 || n > 1<<31 {
			return 0, invalid("%s must be a positive whole number of seconds, got %q", s.cfg.timeoutHeader, truncate(v, 32))
		}
		d = time.Duration(n) * time.Second
	}
	if spec.max > 0 && d > spec.max {
		d = spec.max
	}
	return d, nil
}

// hold returns the Redis client (created on first use) and a func to call when done with it. A
// held client stays open past Close until its last holder is done.
func (s *Step) hold() (*redis.Client, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, errClosed
	}
	if s.client == nil {
		useRedisLogger(s.log)
		s.client = redis.NewClient(s.options())
	}
	s.users++
	var once sync.Once
	return s.client, func() { once.Do(s.unhold) }, nil
}

func (s *Step) unhold() {
	s.mu.Lock()
	s.users--
	var c *redis.Client
	if s.closed && s.users == 0 {
		c, s.client = s.client, nil
	}
	s.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

// options are the client options: the URL's, with timeouts bounded by redis_timeout, few retries
// (the scripts are idempotent), and no optional handshakes that old servers refuse.
func (s *Step) options() *redis.Options {
	o := *s.cfg.redisOpts
	if s.cfg.passwordEnv != "" {
		getenv := s.getenv
		if getenv == nil {
			getenv = os.Getenv
		}
		if pw := getenv(s.cfg.passwordEnv); pw != "" {
			o.Password = pw
		}
	}
	t := s.cfg.redisTimeout
	if o.DialTimeout == 0 {
		o.DialTimeout = t
	}
	if o.ReadTimeout == 0 {
		o.ReadTimeout = t
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = t
	}
	if o.PoolTimeout == 0 {
		o.PoolTimeout = t
	}
	if o.MaxRetries == 0 {
		o.MaxRetries = defaultRedisMaxRetries
	}
	o.DialerRetries = 1
	o.ContextTimeoutEnabled = true
	if o.ClientName == "" {
		o.ClientName = redisClientNamePrefix
	}
	o.DisableIdentity = true
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return &o
}

// Close stops the notification listener and releases the Redis client (once the last holder,
// e.g. a quota release still due, is done). Requests still running keep working.
func (s *Step) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	n := s.notify
	s.notify = nil
	var c *redis.Client
	if s.users == 0 {
		c, s.client = s.client, nil
	}
	s.mu.Unlock()
	if n != nil {
		n.close()
	}
	if c != nil {
		_ = c.Close()
	}
}

// newToken identifies one copy of a request.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// invalid is a 400 with the upstream code.
func invalid(format string, args ...any) *apierror.Error {
	return &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest, Code: "INVALID_REQUEST", Message: fmt.Sprintf(format, args...)}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// redisLog receives go-redis's own messages (dial failures, pub/sub reconnects), which it would
// otherwise print to stderr; go-redis has one logger per process.
var redisLog struct {
	once sync.Once
	log  atomic.Pointer[logr.Logger]
}

// useRedisLogger sends go-redis's messages to log at the verbose level.
func useRedisLogger(log logr.Logger) {
	redisLog.log.Store(&log)
	redisLog.once.Do(func() { redis.SetLogger(redisLogger{}) })
}

type redisLogger struct{}

func (redisLogger) Printf(_ context.Context, format string, v ...any) {
	if l := redisLog.log.Load(); l != nil {
		verbose(*l, "go-redis: "+fmt.Sprintf(format, v...))
	}
}

// verbose logs at the verbose level.
func verbose(log logr.Logger, msg string, kv ...any) {
	log.V(logging.Verbose).Info(msg, kv...)
}

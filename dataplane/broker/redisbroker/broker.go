// Package redisbroker is the Redis runtime of the async-broker step (package broker's Broker):
// the request queue and its Lua scripts, the passthrough quota, the keyspace-notification
// listener that wakes waiters, the result mailbox, the answers of GET/DELETE /v1/requests/{id},
// and the wire format shared with the consumer (llm-d-async, or test/doubles/asyncworker).
//
// The coordinator hands Runtime to the pipelines it builds (builder.Shared.Broker); the
// operator, which only validates pipelines, does not, and so links no Redis client.
// docs/async-broker.md documents the behaviour and the Redis contract.
package redisbroker

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"

	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/broker"
	"github.com/epd-dev/coordinator/dataplane/broker/redisclient"
)

// Options tune the runtime: the waiters' mailbox polls (zero: pollInterval without keyspace
// notifications, notifyBackupPoll behind them). Tests shorten them.
type Options struct {
	PollInterval, BackupPollInterval time.Duration
}

// Runtime is the broker runtime the coordinator hands the pipelines it builds
// (builder.Shared.Broker): each async-broker step gets a Broker of its own settings.
func Runtime(o Options) broker.Runtime {
	return func(cfg *broker.Settings, log logr.Logger, getenv func(string) string) (broker.Broker, error) {
		return New(cfg, log, getenv, o)
	}
}

var _ broker.Broker = (*Broker)(nil)

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

	redisClientName = "coordinator-async-broker"
)

// errClosed is returned once the pipeline that owns the broker was replaced.
var errClosed = errors.New("async-broker step is closed (the pipeline was reloaded)")

// Broker serves one async-broker step. Its Redis client is created on first use: New does no I/O
// (pipelines are built before they serve, and on every reload).
type Broker struct {
	cfg       *broker.Settings
	redisOpts *redis.Options
	log       logr.Logger
	getenv    func(string) string

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

// New builds the broker of a step from its settings. It fails only when go-redis rejects the
// Redis URL the step accepted (broker.CheckRedisURL follows go-redis, so it does not).
func New(cfg *broker.Settings, log logr.Logger, getenv func(string) string, o Options) (*Broker, error) {
	opts, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return nil, err
	}
	if log.GetSink() == nil {
		log = logr.Discard()
	}
	b := &Broker{cfg: cfg, redisOpts: opts, log: log, getenv: getenv,
		backupPoll: notifyBackupPoll, poll: pollInterval, now: time.Now}
	if d := o.PollInterval; d > 0 {
		b.poll = d
	}
	if d := o.BackupPollInterval; d > 0 {
		b.backupPoll = d
	}
	return b, nil
}

// hold returns the Redis client (created on first use) and a func to call when done with it. A
// held client stays open past Close until its last holder is done.
func (b *Broker) hold() (*redis.Client, func(), error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, nil, errClosed
	}
	if b.client == nil {
		redisclient.UseLogger(b.log)
		b.client = redis.NewClient(b.options())
	}
	b.users++
	var once sync.Once
	return b.client, func() { once.Do(b.unhold) }, nil
}

func (b *Broker) unhold() {
	b.mu.Lock()
	b.users--
	var c *redis.Client
	if b.closed && b.users == 0 {
		c, b.client = b.client, nil
	}
	b.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

// options are the client options: the URL's, with timeouts bounded by redis_timeout, few retries
// (the scripts are idempotent), and no optional handshakes that old servers refuse.
func (b *Broker) options() *redis.Options {
	return redisclient.Options(b.redisOpts, b.cfg.PasswordEnv, b.getenv, b.cfg.RedisTimeout, redisClientName)
}

// Close stops the notification listener and releases the Redis client (once the last holder,
// e.g. a quota release still due, is done). Requests still running keep working.
func (b *Broker) Close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	n := b.notify
	b.notify = nil
	var c *redis.Client
	if b.users == 0 {
		c, b.client = b.client, nil
	}
	b.mu.Unlock()
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

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// verbose logs at the verbose level.
func verbose(log logr.Logger, msg string, kv ...any) {
	log.V(logging.Verbose).Info(msg, kv...)
}

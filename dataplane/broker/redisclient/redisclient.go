// Package redisclient is what the coordinator's Redis clients (the async broker's, the rate
// limiter's) share: their options and the process's go-redis logger.
package redisclient

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/epd-dev/coordinator/dataplane/base/logging"
)

// defaultMaxRetries is the retries of a client whose URL sets none.
const defaultMaxRetries = 2

// Options are the options of a coordinator's Redis client (the async broker's, the rate
// limiter's): a copy of the URL's options base, with the password of the environment variable
// passwordEnv (when set and not empty; getenv nil reads the process's), every timeout the URL
// leaves unset bounded by timeout, few retries (callers run idempotent scripts), the client
// name, and no optional handshakes that old servers refuse.
func Options(base *redis.Options, passwordEnv string, getenv func(string) string, timeout time.Duration, name string) *redis.Options {
	o := *base
	if passwordEnv != "" {
		if getenv == nil {
			getenv = os.Getenv
		}
		if pw := getenv(passwordEnv); pw != "" {
			o.Password = pw
		}
	}
	t := timeout
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
		o.MaxRetries = defaultMaxRetries
	}
	o.DialerRetries = 1
	o.ContextTimeoutEnabled = true
	if o.ClientName == "" {
		o.ClientName = name
	}
	o.DisableIdentity = true
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return &o
}

// redisLog receives go-redis's own messages (dial failures, pub/sub reconnects), which it would
// otherwise print to stderr; go-redis has one logger per process.
var redisLog struct {
	once sync.Once
	log  atomic.Pointer[logr.Logger]
}

// UseLogger sends go-redis's messages (one logger per process) to log at the verbose level.
func UseLogger(log logr.Logger) {
	redisLog.log.Store(&log)
	redisLog.once.Do(func() { redis.SetLogger(redisLogger{}) })
}

type redisLogger struct{}

func (redisLogger) Printf(_ context.Context, format string, v ...any) {
	if l := redisLog.log.Load(); l != nil {
		l.V(logging.Verbose).Info("go-redis: " + fmt.Sprintf(format, v...))
	}
}

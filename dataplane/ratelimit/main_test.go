package ratelimit

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// After failed dials go-redis probes the address once a second until the pool is closed; a
	// closed pool's prober exits at its next wake-up.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

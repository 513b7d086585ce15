package redisbroker

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/broker"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
)

// The factory must not touch the network: the operator builds pipelines to validate them, and
// the coordinator builds one on every reload.
func TestFactoryDoesNoIO(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	conns := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(conns)
				return
			}
			conns <- c
		}
	}()
	cfg := config.Default()
	cfg.Pipeline.Steps = []config.Step{{Type: broker.StepType, Params: map[string]any{"redis_url": "redis://" + l.Addr().String()}}, {Type: sinkStep}}
	p, err := builder.Build(cfg, builder.Options{Shared: builder.Shared{Broker: Runtime(Options{})}})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	// A marker connection after the build: connections are accepted in the order they arrive, so
	// any dial the build or the close made is accepted before the marker is.
	marker, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer marker.Close()
	if _, err := marker.Write([]byte("marker")); err != nil {
		t.Fatal(err)
	}
	for c := range conns {
		buf := make([]byte, 6)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := io.ReadFull(c, buf)
		_ = c.Close()
		if err == nil && string(buf) == "marker" {
			return
		}
		t.Fatalf("building and closing the pipeline opened a connection to Redis (it sent %q)", buf)
	}
}

// The client options: the URL's, the password from redis_password_env, the Redis calls bounded
// by redis_timeout unless the URL says otherwise.
func TestClientOptions(t *testing.T) {
	env := map[string]string{"REDIS_PASSWORD": "from-env"}
	for _, tc := range []struct {
		name                string
		own                 map[string]any
		db                  int
		user, password      string
		dial, read, pool    time.Duration
		maxRetries          int
		clientName, network string
	}{
		{name: "defaults", own: map[string]any{"redis_url": "redis://127.0.0.1:6379"},
			dial: 2 * time.Second, read: 2 * time.Second, pool: 2 * time.Second, maxRetries: 2, clientName: "coordinator-async-broker", network: "tcp"},
		{name: "url and timeout", own: map[string]any{"redis_url": "redis://user:s3cret@127.0.0.1:6379/2?dial_timeout=5s&max_retries=4&client_name=me", "redis_timeout": "500ms"},
			db: 2, user: "user", password: "s3cret", dial: 5 * time.Second, read: 500 * time.Millisecond, pool: 500 * time.Millisecond, maxRetries: 4, clientName: "me", network: "tcp"},
		{name: "password env", own: map[string]any{"redis_url": "redis://:url-pw@127.0.0.1:6379/1", "redis_password_env": "REDIS_PASSWORD"},
			db: 1, password: "from-env", dial: 2 * time.Second, read: 2 * time.Second, pool: 2 * time.Second, maxRetries: 2, clientName: "coordinator-async-broker", network: "tcp"},
		{name: "password env unset", own: map[string]any{"redis_url": "unix://:url-pw@/run/redis.sock?db=3", "redis_password_env": "NOT_SET"},
			db: 3, password: "url-pw", dial: 2 * time.Second, read: 2 * time.Second, pool: 2 * time.Second, maxRetries: 2, clientName: "coordinator-async-broker", network: "unix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := params.New("params", tc.own, nil)
			cfg, err := broker.ParseSettings(p)
			if err == nil {
				err = p.Err()
			}
			if err != nil {
				t.Fatal(err)
			}
			b, err := New(cfg, logr.Discard(), func(k string) string { return env[k] }, Options{})
			if err != nil {
				t.Fatal(err)
			}
			o := b.options()
			if o.DB != tc.db || o.Username != tc.user || o.Password != tc.password || o.Network != tc.network {
				t.Errorf("db/user/password/network = %d/%q/%q/%s, want %d/%q/%q/%s", o.DB, o.Username, o.Password, o.Network, tc.db, tc.user, tc.password, tc.network)
			}
			if o.DialTimeout != tc.dial || o.ReadTimeout != tc.read || o.WriteTimeout != tc.read || o.PoolTimeout != tc.pool {
				t.Errorf("dial/read/write/pool timeouts = %s/%s/%s/%s", o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout)
			}
			if o.MaxRetries != tc.maxRetries || o.ClientName != tc.clientName || !o.DisableIdentity || !o.ContextTimeoutEnabled {
				t.Errorf("retries/client name/identity/context timeouts = %d/%s/%v/%v", o.MaxRetries, o.ClientName, o.DisableIdentity, o.ContextTimeoutEnabled)
			}
			b.Close()
			if b.client != nil {
				t.Error("a broker nobody used has a Redis client")
			}
		})
	}
}

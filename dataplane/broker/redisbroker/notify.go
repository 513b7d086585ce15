package redisbroker

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"

	"github.com/epd-dev/coordinator/dataplane/broker"
)

// watch returns what wakes a waiter on a mailbox key: a channel fed by keyspace notifications
// (with the backup poll interval) when they are available, else nil and the poll interval. stop
// releases the subscription.
func (b *Broker) watch(ctx context.Context, client *redis.Client, key string) (wake <-chan struct{}, interval time.Duration, stop func()) {
	if !b.useNotify(ctx, client) {
		return nil, b.poll, func() {}
	}
	n := b.notifier(client)
	if n == nil {
		return nil, b.poll, func() {}
	}
	ch, stop := n.watch(key, b.cfg.RedisTimeout)
	return ch, b.backupPoll, stop
}

// useNotify reports whether waiters can rely on keyspace notifications: wakeup_mode notify says
// yes, poll says no, auto asks Redis (CONFIG GET notify-keyspace-events must enable K and l or A)
// and trusts a successful answer for probeTTL. A failed probe (CONFIG disabled, Redis down)
// means polling for this waiter.
func (b *Broker) useNotify(ctx context.Context, client *redis.Client) bool {
	switch b.cfg.Wakeup {
	case broker.WakeupPoll:
		return false
	case broker.WakeupNotify:
		return true
	}
	b.mu.Lock()
	if !b.probeAt.IsZero() && b.now().Sub(b.probeAt) < probeTTL {
		ok := b.probeOK
		b.mu.Unlock()
		return ok
	}
	b.mu.Unlock()
	pctx, cancel := context.WithTimeout(ctx, b.cfg.RedisTimeout)
	defer cancel()
	res, err := client.ConfigGet(pctx, "notify-keyspace-events").Result()
	if err != nil {
		verbose(b.log, "async-broker: cannot read notify-keyspace-events; waiters poll", "err", err.Error())
		return false
	}
	ok := notifyFlagsOK(res["notify-keyspace-events"])
	b.mu.Lock()
	b.probeAt, b.probeOK = b.now(), ok
	b.mu.Unlock()
	if !ok {
		verbose(b.log, "async-broker: keyspace notifications for lists are off (notify-keyspace-events needs K and l or A); waiters poll")
	}
	return ok
}

// notifyFlagsOK reports flags that publish keyspace events of list commands.
func notifyFlagsOK(flags string) bool {
	return strings.ContainsRune(flags, 'K') && (strings.ContainsRune(flags, 'l') || strings.ContainsRune(flags, 'A'))
}

// notifier returns the broker's notification listener, started on first use (nil once closed).
func (b *Broker) notifier(client *redis.Client) *notifier {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	if b.notify == nil {
		b.notify = newNotifier(client, b.redisOpts.DB, b.log)
	}
	return b.notify
}

// notifier is one pub/sub connection per broker (so per step) that fans keyspace events of mailbox keys out to
// the waiters of each key. go-redis reconnects and resubscribes it after a Redis restart.
type notifier struct {
	ps     *redis.PubSub
	prefix string
	log    logr.Logger

	// subMu orders subscription changes with the map updates they follow.
	subMu sync.Mutex
	mu    sync.Mutex
	subs  map[string]map[chan struct{}]struct{}
	done  chan struct{}
}

func newNotifier(client *redis.Client, db int, log logr.Logger) *notifier {
	n := &notifier{
		ps:     client.Subscribe(context.Background()),
		prefix: "__keyspace@" + strconv.Itoa(db) + "__:",
		log:    log,
		subs:   map[string]map[chan struct{}]struct{}{},
		done:   make(chan struct{}),
	}
	msgs := n.ps.Channel(redis.WithChannelSize(256))
	go n.dispatch(msgs)
	return n
}

func (n *notifier) dispatch(msgs <-chan *redis.Message) {
	defer close(n.done)
	for m := range msgs {
		key, ok := strings.CutPrefix(m.Channel, n.prefix)
		if !ok {
			continue
		}
		n.mu.Lock()
		for ch := range n.subs[key] {
			select {
			case ch <- struct{}{}:
			default: // already signalled
			}
		}
		n.mu.Unlock()
	}
}

// watch subscribes to the key's events. A failed SUBSCRIBE is retried by go-redis on reconnect;
// meanwhile the waiter's backup poll covers it.
func (n *notifier) watch(key string, timeout time.Duration) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	channel := n.prefix + key
	n.subMu.Lock()
	n.mu.Lock()
	set, exists := n.subs[key]
	if !exists {
		set = map[chan struct{}]struct{}{}
		n.subs[key] = set
	}
	set[ch] = struct{}{}
	n.mu.Unlock()
	if !exists {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		if err := n.ps.Subscribe(ctx, channel); err != nil {
			verbose(n.log, "async-broker: subscribing to keyspace events failed; polling covers it", "err", err.Error())
		}
		cancel()
	}
	n.subMu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			n.subMu.Lock()
			defer n.subMu.Unlock()
			n.mu.Lock()
			delete(set, ch)
			last := len(set) == 0
			if last {
				delete(n.subs, key)
			}
			n.mu.Unlock()
			if last {
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				_ = n.ps.Unsubscribe(ctx, channel)
				cancel()
			}
		})
	}
}

// close ends the listener and waits for its goroutine.
func (n *notifier) close() {
	_ = n.ps.Close()
	<-n.done
}

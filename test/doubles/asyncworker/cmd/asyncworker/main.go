// Command asyncworker consumes the async-broker step's Redis queues (see package asyncworker):
// it runs each queued request through the coordinator and stores the answer for
// GET /v1/requests/{id}. It serves until SIGINT or SIGTERM, then puts the requests still
// running back in their queues.
//
//	asyncworker --redis-url redis://127.0.0.1:6379/0 --coordinator http://127.0.0.1:8080 --queue request-sortedset
package main

import (
	"context"
	"io"
	"strings"

	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/test/doubles/asyncworker"
	"github.com/epd-dev/coordinator/test/internal/command"
)

func main() { command.Main(run) }

// run parses args and serves until ctx is done, logging to stderr.
func run(ctx context.Context, args []string, _, stderr io.Writer) error {
	cfg, level, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	cfg.Log = logging.New(level, stderr)
	w, err := asyncworker.New(cfg)
	if err != nil {
		return err
	}
	defer w.Close()
	cfg.Log.Info("asyncworker serving", "queues", cfg.Queues, "coordinator", cfg.Coordinator, "concurrency", cfg.Concurrency)
	err = w.Run(ctx)
	s := w.Stats()
	cfg.Log.Info("asyncworker stopped", "completed", s.Completed, "failed", s.Failed, "cancelled", s.Cancelled,
		"expired", s.Expired, "dropped", s.Dropped, "requeued", s.Requeued)
	return err
}

// parseFlags turns command-line flags into a Config and a log level.
func parseFlags(args []string, stderr io.Writer) (asyncworker.Config, int, error) {
	var cfg asyncworker.Config
	var queues string
	var level int
	fs := command.FlagSet("asyncworker", stderr)
	fs.StringVar(&cfg.RedisURL, "redis-url", "redis://127.0.0.1:6379/0", "the broker's Redis URL")
	fs.StringVar(&cfg.Coordinator, "coordinator", "http://127.0.0.1:8080", "the coordinator's base URL")
	fs.StringVar(&queues, "queue", "request-sortedset", "comma-separated request queues (sorted sets) to serve")
	fs.IntVar(&cfg.Concurrency, "concurrency", 4, "requests run at once")
	fs.DurationVar(&cfg.ResultTTL, "result-ttl", 0, "how long a stored result is kept (default 1h)")
	fs.DurationVar(&cfg.CancelPoll, "cancel-poll", 0, "how often a running request's cancel marker is checked (default 250ms)")
	fs.IntVar(&level, "v", 2, "log verbosity: 1 warn, 2 info, 3 verbose, 4 debug")
	if err := command.Parse(fs, args); err != nil {
		return cfg, 0, err
	}
	for _, q := range strings.Split(queues, ",") {
		if q = strings.TrimSpace(q); q != "" {
			cfg.Queues = append(cfg.Queues, q)
		}
	}
	return cfg, level, nil
}

// Package reload watches the mounted configuration file and swaps in a new pipeline when it
// changes, without a restart and without disturbing requests in flight. It handles Kubernetes'
// ConfigMap updates (an atomic "..data" symlink swap in the mounted directory), in-place writes and
// replacement by rename. A new configuration is parsed, validated and built off the request path;
// an invalid one is rejected and the last good pipeline keeps serving.
package reload

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
)

// Options configure a Watcher.
type Options struct {
	// Path is the config file (e.g. /etc/coordinator/coordinator.yaml).
	Path string
	// Holder receives each new pipeline.
	Holder *pipeline.Holder
	// Startup is the configuration the process started with: the settings it cannot change
	// without a restart are compared with it. Loaded is the file content it came from.
	Startup config.Config
	Loaded  []byte
	// Build constructs a pipeline from a configuration and its file revision (pipeline.Build
	// with the process options and Revision set).
	Build func(cfg config.Config, revision string) (*pipeline.Pipeline, error)
	// LookupEnv supplies COORDINATOR_* overrides (os.LookupEnv when nil).
	LookupEnv func(string) (string, bool)
	// Log receives reload outcomes; Level, when set, follows log_level.
	Log   logr.Logger
	Level *logging.Level
	// Debounce coalesces bursts of file events (default 200ms).
	Debounce time.Duration
	// Poll re-reads the file this often in case an event was missed (default 30s; <0 disables).
	Poll time.Duration
	// OnReload, when set, is called after each attempt (metrics) with the pipeline serving
	// after it: the new one, or the one kept (nil if none).
	OnReload func(ok bool, serving *pipeline.Pipeline)
}

// Status is what the last reloads did, for /debug/pipeline.
type Status struct {
	// Path is the watched file.
	Path string `json:"path"`
	// Watching is true while file events are watched (Run is running).
	Watching bool `json:"watching"`
	// LastAttempt is when the file was last read after a change.
	LastAttempt time.Time `json:"last_attempt,omitzero"`
	// LastError is the last rejected configuration's error ("" after a success).
	LastError string `json:"last_error,omitempty"`
	// LastErrorKey is the key the last error names.
	LastErrorKey string `json:"last_error_key,omitempty"`
	// RejectedRevision is the revision (config.FileRevision) of the file content the last error
	// rejected, so that a reader (the operator) can tell whether the revision it expects was
	// refused: "" after a success, or when the file could not be read.
	RejectedRevision string `json:"rejected_revision,omitempty"`
	// RestartRequired lists settings that changed in the file but only take effect on restart.
	RestartRequired []string `json:"restart_required,omitempty"`
	// Succeeded and Failed count reload attempts.
	Succeeded uint64 `json:"reloads_succeeded"`
	Failed    uint64 `json:"reloads_failed"`
}

// Watcher reloads the pipeline when the configuration file changes.
type Watcher struct {
	opts Options

	mu     sync.Mutex
	status Status
	digest [32]byte
}

// New returns a watcher; call Run to start watching. A file whose content equals Loaded (or the
// last content seen) is never rebuilt.
func New(opts Options) *Watcher {
	if opts.Debounce <= 0 {
		opts.Debounce = 200 * time.Millisecond
	}
	if opts.Poll == 0 {
		opts.Poll = 30 * time.Second
	}
	if opts.LookupEnv == nil {
		opts.LookupEnv = os.LookupEnv
	}
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	return &Watcher{opts: opts, status: Status{Path: opts.Path}, digest: sha256.Sum256(opts.Loaded)}
}

// Status returns a copy of the reload status.
func (w *Watcher) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.status
	s.RestartRequired = append([]string(nil), s.RestartRequired...)
	return s
}

// Run watches the file's directory until ctx ends. Any event in the directory (the ..data swap of
// a ConfigMap volume, a write, a rename over the file) schedules a reload after the debounce
// window; a periodic re-read covers missed events.
func (w *Watcher) Run(ctx context.Context) error {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching %s: %w", w.opts.Path, err)
	}
	defer fw.Close()
	dir := filepath.Dir(w.opts.Path)
	if err := fw.Add(dir); err != nil {
		return fmt.Errorf("watching %s: %w", dir, err)
	}
	w.setWatching(true)
	defer w.setWatching(false)
	var poll <-chan time.Time
	if w.opts.Poll > 0 {
		t := time.NewTicker(w.opts.Poll)
		defer t.Stop()
		poll = t.C
	}
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return nil
			}
			if ev.Op&(fsnotify.Create|fsnotify.Write|fsnotify.Rename|fsnotify.Remove) != 0 {
				debounce.Reset(w.opts.Debounce)
			}
		case err, ok := <-fw.Errors:
			if !ok {
				return nil
			}
			w.opts.Log.Error(err, "config watch error; relying on the periodic re-read", "path", w.opts.Path)
		case <-debounce.C:
			_ = w.Reload() // a rejected configuration is logged and kept in Status
		case <-poll:
			_ = w.Reload()
		}
	}
}

func (w *Watcher) setWatching(on bool) {
	w.mu.Lock()
	w.status.Watching = on
	w.mu.Unlock()
}

// Reload reads the file and, when its content changed, builds and installs the new pipeline. It
// returns the error of a rejected configuration (the previous pipeline keeps serving).
func (w *Watcher) Reload() error {
	data, err := os.ReadFile(w.opts.Path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			// Mid-swap or deleted: keep serving; the next event or poll retries.
			return nil
		}
		return w.fail(fmt.Errorf("reading config: %w", err))
	}
	digest := sha256.Sum256(data)
	w.mu.Lock()
	unchanged := digest == w.digest
	w.mu.Unlock()
	if unchanged {
		return nil
	}
	cfg, err := config.Parse(data, w.opts.LookupEnv)
	if err == nil {
		var p *pipeline.Pipeline
		if p, err = w.opts.Build(cfg, config.FileRevision(data)); err == nil {
			w.install(cfg, p, digest)
			return nil
		}
	}
	// Remember the rejected content so it is not rebuilt (and re-logged) on every poll, unless
	// it waits for something else to change (a mounted tokenizer's files): the next event or
	// poll tries it again.
	var fe *config.FieldError
	if !errors.As(err, &fe) || !fe.Retry {
		w.mu.Lock()
		w.digest = digest
		w.mu.Unlock()
	}
	return w.reject(err, config.FileRevision(data))
}

func (w *Watcher) install(cfg config.Config, p *pipeline.Pipeline, digest [32]byte) {
	if w.opts.Level != nil {
		w.opts.Level.Set(cfg.LogLevel)
	}
	restart := RestartRequired(w.opts.Startup, cfg)
	// The swap and the status change together: whoever sees the new pipeline and then reads the
	// status sees it counted.
	w.mu.Lock()
	old := w.opts.Holder.Swap(p)
	w.digest = digest
	w.status.LastAttempt = time.Now()
	w.status.LastError, w.status.LastErrorKey, w.status.RejectedRevision = "", "", ""
	w.status.RestartRequired = restart
	w.status.Succeeded++
	w.mu.Unlock()
	from := ""
	if old != nil {
		from = old.Revision()
	}
	kv := []any{"revision", p.Revision(), "previous_revision", from, "steps", len(p.Steps()), "pipeline_revision", p.PipelineRevision()}
	if c, weight := p.Canary(); c != nil {
		kv = append(kv, "canary_revision", c.PipelineRevision(), "canary_weight_percent", weight)
	}
	w.opts.Log.V(logging.Info).Info("pipeline reloaded", kv...)
	if len(restart) > 0 {
		w.opts.Log.V(logging.Warn).Info("config changed settings that only take effect after a restart; the running values stay",
			"restart_required", restart, "revision", p.Revision())
	}
	if w.opts.OnReload != nil {
		w.opts.OnReload(true, p)
	}
}

// fail records a reload that could not read the file.
func (w *Watcher) fail(err error) error { return w.reject(err, "") }

// reject records a rejected reload: err, and the revision of the rejected content ("" when the
// file could not be read).
func (w *Watcher) reject(err error, revision string) error {
	w.mu.Lock()
	w.status.LastAttempt = time.Now()
	w.status.LastError = err.Error()
	w.status.LastErrorKey = config.KeyOf(err)
	w.status.RejectedRevision = revision
	w.status.Failed++
	w.mu.Unlock()
	keep, serving := "", w.opts.Holder.Load()
	if serving != nil {
		keep = serving.Revision()
	}
	w.opts.Log.Error(err, "config reload rejected; the last good pipeline keeps serving", "key", config.KeyOf(err), "serving_revision", keep,
		"rejected_revision", revision, "path", w.opts.Path)
	if w.opts.OnReload != nil {
		w.opts.OnReload(false, serving)
	}
	return err
}

// RestartRequired lists the keys of next's config.RestartSettings that differ from running's:
// settings a running process cannot apply. Everything else is applied by a reload.
func RestartRequired(running, next config.Config) []string {
	var keys []string
	was := running.RestartSettings()
	for i, s := range next.RestartSettings() {
		if !reflect.DeepEqual(was[i].Value, s.Value) {
			keys = append(keys, s.Key)
		}
	}
	return keys
}

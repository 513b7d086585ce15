package logging

import "github.com/go-logr/logr"

// WithValuesLazily is log.WithValues(kv...) that costs nothing until a line is written: the
// pairs are added to each emitted record instead of to a derived logger up front. Per-request
// loggers use it, since most requests write no line at the default verbosity.
func WithValuesLazily(log logr.Logger, kv ...any) logr.Logger {
	if log.GetSink() == nil {
		return log
	}
	return log.WithSink(&lazySink{parent: log.GetSink(), kv: kv})
}

// lazySink defers its key/value pairs to the records it emits.
type lazySink struct {
	parent logr.LogSink
	kv     []any
}

func (l *lazySink) Init(info logr.RuntimeInfo) { l.parent.Init(info) }

func (l *lazySink) Enabled(level int) bool { return l.parent.Enabled(level) }

func (l *lazySink) Info(level int, msg string, kv ...any) {
	l.parent.Info(level, msg, l.with(kv)...)
}

func (l *lazySink) Error(err error, msg string, kv ...any) {
	l.parent.Error(err, msg, l.with(kv)...)
}

func (l *lazySink) WithValues(kv ...any) logr.LogSink {
	return &lazySink{parent: l.parent, kv: l.with(kv)}
}

func (l *lazySink) WithName(name string) logr.LogSink {
	return &lazySink{parent: l.parent.WithName(name), kv: l.kv}
}

func (l *lazySink) with(kv []any) []any {
	if len(kv) == 0 {
		return l.kv
	}
	return append(l.kv[:len(l.kv):len(l.kv)], kv...)
}

// Package logging builds the coordinator's structured logger (logr over zap, JSON lines) and
// names its verbosity levels, which follow the upstream coordinator: 1 warn, 2 info, 3 verbose,
// 4 debug, 5 trace. Errors are always logged.
package logging

import (
	"io"
	"os"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Verbosity levels, used as logger.V(level).
const (
	Warn    = 1
	Info    = 2
	Verbose = 3
	Debug   = 4
	Trace   = 5
)

// New returns a JSON logger at the given verbosity writing to w (stderr when nil).
func New(level int, w io.Writer) logr.Logger {
	log, _ := NewLeveled(level, w)
	return log
}

// Level changes a logger's verbosity at run time (a config reload).
type Level struct{ atomic zap.AtomicLevel }

// Set changes the verbosity.
func (l *Level) Set(level int) { l.atomic.SetLevel(zapcore.Level(-level)) }

// Get returns the verbosity.
func (l *Level) Get() int { return -int(l.atomic.Level()) }

// NewLeveled is New plus a handle to change the verbosity later.
func NewLeveled(level int, w io.Writer) (logr.Logger, *Level) {
	if w == nil {
		w = os.Stderr
	}
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = "ts"
	enc.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	enc.EncodeLevel = encodeLevel
	lvl := &Level{atomic: zap.NewAtomicLevelAt(zapcore.Level(-level))}
	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(w), lvl.atomic)
	return zapr.NewLogger(zap.New(core)), lvl
}

// levelNames names zap levels after the coordinator's verbosity scale (logr V(n) is zap level -n).
var levelNames = map[zapcore.Level]string{-Warn: "warn", -Info: "info", -Verbose: "verbose", -Debug: "debug", -Trace: "trace"}

func encodeLevel(l zapcore.Level, enc zapcore.PrimitiveArrayEncoder) {
	if name, ok := levelNames[l]; ok {
		enc.AppendString(name)
		return
	}
	zapcore.LowercaseLevelEncoder(l, enc)
}

// Package params gives step factories typed access to a step's params block: typed accessors
// with defaults and minimums, errors that name the full key, the effective values for
// introspection, and a check that rejects params nobody read.
package params

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/epd-dev/coordinator/dataplane/base/config"
)

// Params gives a step factory typed access to its params block. Errors name the full key (e.g.
// pipeline.steps[3].params.max_parallel); the first one wins and Err reports it, or a key that
// no accessor read (a typo), so a misspelt param never passes silently.
type Params struct {
	path      string
	own       map[string]any
	inherited map[string]any
	used      map[string]bool
	effective map[string]any
	err       error
}

// New wraps a step's params. inherited holds pipeline-level defaults (kv_connector,
// ec_connector, use_openai_format) that apply when the step does not set them.
func New(path string, own, inherited map[string]any) *Params {
	return &Params{path: path, own: own, inherited: inherited, used: map[string]bool{}, effective: map[string]any{}}
}

// Path is the params block's key path.
func (p *Params) Path() string { return p.path }

// Key is the full path of one param.
func (p *Params) Key(name string) string { return p.path + "." + name }

// Fail records an error about one param (unless an earlier error was recorded).
func (p *Params) Fail(name, format string, args ...any) {
	if p.err == nil {
		p.err = &config.FieldError{Key: p.Key(name), Reason: fmt.Sprintf(format, args...)}
	}
}

// FailAt records an error about another key of the configuration (e.g. gateway.address).
func (p *Params) FailAt(key, format string, args ...any) {
	if p.err == nil {
		p.err = &config.FieldError{Key: key, Reason: fmt.Sprintf(format, args...)}
	}
}

// FailStep records an error about the step as a whole (its position in the pipeline), keyed by
// the step entry, e.g. pipeline.steps[3].
func (p *Params) FailStep(format string, args ...any) {
	if p.err == nil {
		p.err = &config.FieldError{Key: strings.TrimSuffix(p.path, ".params"), Reason: fmt.Sprintf(format, args...)}
	}
}

func (p *Params) lookup(name string) (any, bool) {
	p.used[name] = true
	if v, ok := p.own[name]; ok && v != nil {
		return v, true
	}
	v, ok := p.inherited[name]
	return v, ok && v != nil
}

// Has reports whether the param is set (by the step or inherited).
func (p *Params) Has(name string) bool {
	_, ok := p.lookup(name)
	return ok
}

// String reads a string param.
func (p *Params) String(name, def string) string {
	return keep(p, name, p.getString(name, def))
}

func (p *Params) getString(name, def string) string {
	v, ok := p.lookup(name)
	if !ok {
		return def
	}
	s, isStr := v.(string)
	if !isStr {
		p.Fail(name, "must be a string, got %T", v)
		return def
	}
	return s
}

// Bool reads a boolean param.
func (p *Params) Bool(name string, def bool) bool {
	return keep(p, name, p.getBool(name, def))
}

func (p *Params) getBool(name string, def bool) bool {
	v, ok := p.lookup(name)
	if !ok {
		return def
	}
	b, isBool := v.(bool)
	if !isBool {
		p.Fail(name, "must be a boolean, got %T", v)
		return def
	}
	return b
}

// Int reads an integer param (an integral float such as 8.0 is accepted) no smaller than least.
func (p *Params) Int(name string, def, least int) int {
	return keep(p, name, p.getInt(name, def, least))
}

func (p *Params) getInt(name string, def, least int) int {
	v, ok := p.lookup(name)
	if !ok {
		return def
	}
	var n int64
	switch x := v.(type) {
	case int:
		n = int64(x)
	case int64:
		n = x
	case float64:
		if x != math.Trunc(x) || math.Abs(x) > 1<<53 {
			p.Fail(name, "must be an integer, got %v", x)
			return def
		}
		n = int64(x)
	default:
		p.Fail(name, "must be an integer, got %T", v)
		return def
	}
	if n < int64(least) {
		p.Fail(name, "must be at least %d, got %d", least, n)
		return def
	}
	return int(n)
}

// Duration reads a duration param written with a unit ("10s"); zero and negative are rejected.
func (p *Params) Duration(name string, def time.Duration) time.Duration {
	return keep(p, name, p.getDuration(name, def))
}

func (p *Params) getDuration(name string, def time.Duration) time.Duration {
	v, ok := p.lookup(name)
	if !ok {
		return def
	}
	s, isStr := v.(string)
	if !isStr {
		p.Fail(name, "must be a duration string with a unit (e.g. 30s), got %v", v)
		return def
	}
	d, err := config.ParseDuration(s)
	if err != nil {
		p.Fail(name, "%v", err)
		return def
	}
	if d <= 0 {
		p.Fail(name, "must be positive, got %s", s)
		return def
	}
	return d.Std()
}

// StringList reads a list of strings.
func (p *Params) StringList(name string) []string {
	return keep(p, name, p.getStringList(name))
}

func (p *Params) getStringList(name string) []string {
	v, ok := p.lookup(name)
	if !ok {
		return nil
	}
	items, isList := v.([]any)
	if !isList {
		if ss, isSS := v.([]string); isSS {
			return ss
		}
		p.Fail(name, "must be a list of strings, got %T", v)
		return nil
	}
	out := make([]string, 0, len(items))
	for i, it := range items {
		s, isStr := it.(string)
		if !isStr {
			p.Fail(name, "item %d must be a string, got %T", i, it)
			return nil
		}
		out = append(out, s)
	}
	return out
}

// keep records the value a param resolved to, for Effective.
func keep[T any](p *Params, name string, v T) T {
	p.effective[name] = v
	return v
}

// Effective returns every param a factory read with the value it resolved to (defaults included).
// Durations are rendered as strings.
func (p *Params) Effective() map[string]any {
	out := make(map[string]any, len(p.effective))
	for k, v := range p.effective {
		if d, ok := v.(time.Duration); ok {
			v = d.String()
		}
		out[k] = v
	}
	return out
}

// Err returns the first recorded error, or names the params no accessor read.
func (p *Params) Err() error {
	if p.err != nil {
		return p.err
	}
	var unknown []string
	for k := range p.own {
		if !p.used[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	known := make([]string, 0, len(p.used))
	for k := range p.used {
		known = append(known, k)
	}
	sort.Strings(known)
	return &config.FieldError{
		Key:    p.Key(unknown[0]),
		Reason: fmt.Sprintf("unknown parameter (this step accepts: %s)", strings.Join(known, ", ")),
	}
}

// Value reads a param as the configuration decoded it (string, bool, int or float64, []any,
// map[string]any), for steps whose params are structured (lists of objects, maps). The step
// validates the value itself, typically by wrapping an object in New(p.Key(name), obj, nil)
// so that the typed accessors and the unknown-key check apply, with full key paths, one level
// down. The value is reported by Effective as is (see Redact).
func (p *Params) Value(name string) (any, bool) {
	v, ok := p.lookup(name)
	if ok {
		keep(p, name, v)
	}
	return v, ok
}

// Redact replaces what Effective (and so /debug/pipeline) reports for a param that was read,
// e.g. a URL with its password masked.
func (p *Params) Redact(name string, shown any) {
	if _, read := p.effective[name]; read {
		p.effective[name] = shown
	}
}

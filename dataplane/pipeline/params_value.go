package pipeline

// Value reads a param as the configuration decoded it (string, bool, int or float64, []any,
// map[string]any), for steps whose params are structured (lists of objects, maps). The step
// validates the value itself, typically by wrapping an object in NewParams(p.Key(name), obj, nil)
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

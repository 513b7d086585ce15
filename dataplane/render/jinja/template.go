package jinja

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Template is a compiled Jinja template ready for rendering.
type Template struct {
	nodes   []node
	src     string
	globals *scope          // nil: none
	bound   map[string]bool // the names the template binds (boundNames): a constant of one of them may be shadowed
}

// Compile parses a Jinja template source string and returns a compiled
// template that can be rendered multiple times with different data.
func Compile(source string) (*Template, error) {
	segs, err := scan(source)
	if err != nil {
		return nil, fmt.Errorf("jinja scan: %w", err)
	}

	nodes, err := parseTemplate(segs)
	if err != nil {
		return nil, fmt.Errorf("jinja parse: %w", err)
	}

	bound := map[string]bool{}
	boundNames(nodes, bound)
	silentLoops(nodes)
	return &Template{nodes: nodes, src: source, bound: bound}, nil
}

// boundNames adds to into the names nodes bind anywhere: set targets, loop variables (and
// loop), macros, their parameters (and caller, varargs, kwargs), call blocks' arguments.
func boundNames(nodes []node, into map[string]bool) {
	for _, n := range nodes {
		switch n := n.(type) {
		case *ifNode:
			for _, b := range n.branches {
				boundNames(b.body, into)
			}
		case *forNode:
			into[n.keyVar], into[n.valVar], into["loop"] = true, true, true
			boundNames(n.body, into)
			boundNames(n.elseBody, into)
		case *setNode:
			if n.namespace == "" {
				into[n.target] = true
			}
		case *setBlockNode:
			into[n.target] = true
			boundNames(n.body, into)
		case *macroNode:
			into[n.name], into["caller"], into["varargs"], into["kwargs"] = true, true, true, true
			for _, p := range n.params {
				into[p.name] = true
			}
			boundNames(n.body, into)
		case *callNode:
			for _, a := range n.callerArgs {
				into[a] = true
			}
			boundNames(n.body, into)
		case *filterBlockNode:
			boundNames(n.body, into)
		}
	}
}

// silentLoops marks the loops among nodes, at any depth, whose body cannot output: no text, no
// printed expression, no call or filter block (a set block's body outputs into its variable).
// Replaying such an iteration would check what it read, which is what running it does (a
// condition and a set or two: Qwen3's reversed loop that finds the last query), so a memo
// neither keeps nor looks up their iterations.
func silentLoops(nodes []node) (outputs bool) {
	for _, n := range nodes {
		switch n := n.(type) {
		case *textNode:
			outputs = outputs || n.text != ""
		case *outputNode:
			outputs = true
		case *callNode:
			silentLoops(n.body)
			outputs = true
		case *filterBlockNode:
			silentLoops(n.body)
			outputs = true
		case *ifNode:
			for _, b := range n.branches {
				outputs = silentLoops(b.body) || outputs
			}
		case *forNode:
			n.silent = !silentLoops(n.body)
			outputs = silentLoops(n.elseBody) || !n.silent || outputs
		case *setBlockNode:
			silentLoops(n.body)
		case *macroNode:
			silentLoops(n.body)
		}
	}
	return outputs
}

// CompileWith is Compile, with globals: variables every render sees (beneath its data, which
// may shadow them), fixed for the template's life. A memoized iteration does not record reads of
// them, nor of the builtins, unless the template binds the name somewhere (a set in the loop may
// shadow it for some iterations and not others); an iteration is replayed only by a render whose
// data shadows the same constants as the render that kept it (Template.shadows).
func CompileWith(source string, globals map[string]Value) (*Template, error) {
	t, err := Compile(source)
	if err != nil {
		return nil, err
	}
	t.globals = &scope{parent: cachedBuiltins, constant: true}
	for k, v := range globals {
		t.globals.set(k, v)
	}
	return t, nil
}

// Render executes the template with the provided data and returns the
// rendered string. Each call creates an isolated scope so templates are
// safe to render concurrently after compilation.
func (t *Template) Render(data map[string]any) (string, error) {
	// Convert Go data to Value types.
	vals := make(map[string]Value, len(data))
	for k, v := range data {
		vals[k] = FromGoValue(v)
	}

	return t.RenderWith(vals, RenderOptions{})
}

// RenderValues is like Render but accepts pre-converted Value data.
func (t *Template) RenderValues(data map[string]Value) (string, error) {
	return t.RenderWith(data, RenderOptions{})
}

// RenderOptions are a render's options besides its data.
type RenderOptions struct {
	// Memo, when not nil, replays the iterations of loops it kept from earlier renders and keeps
	// this render's (see Memo for what it needs of the template and data).
	Memo Memo
	// SizeHint is the output's expected size in bytes: its buffer is made that large at once
	// (less what RenderAfter expects).
	SizeHint int
	// Stats, when not nil, counts the memoized loops' iterations of the render.
	Stats *MemoStats
	// Spans, when not nil, is set to the outputs of the memoized iterations (kept or replayed)
	// that lie wholly in RenderAfter's rest, in order. Each is the Iteration's own string, so a
	// caller that keeps rest as the expected text of a later render can keep those strings as
	// its pieces: a later replay then writes the very string it is compared with, and the
	// comparison finds them equal by their address, without reading them.
	Spans *[]Span
}

// MemoStats counts the iterations of memoized loops: replayed from the memo, run and kept, run
// and not kept (not to be kept: a macro call, a namespace made, ...).
type MemoStats struct {
	Replayed, Kept, NotKept int
}

// RenderWith is like RenderValues, with o.
func (t *Template) RenderWith(data map[string]Value, o RenderOptions) (string, error) {
	_, out, err := t.render(data, o, nil)
	return out, err
}

// RenderAfter is RenderWith for a render expected to begin with the text expect (in pieces):
// the bytes of the output that match it are compared, never copied, and counted (matched); rest
// is the output after them. o.SizeHint counts the whole output.
func (t *Template) RenderAfter(data map[string]Value, o RenderOptions, expect []string) (matched int, rest string, err error) {
	return t.render(data, o, expect)
}

// =============================================================================

// shadows are the names of data that are also constants (the template's globals, the
// builtins), sorted and joined by NULs: a constant a render's data shadows is found there, not
// among the constants.
func (t *Template) shadows(data map[string]Value) string {
	var names []string
	for name := range data {
		for s := cmp.Or(t.globals, cachedBuiltins); s != nil; s = s.parent {
			if _, ok := s.own(name); ok {
				names = append(names, name)
				break
			}
		}
	}
	slices.Sort(names)
	return strings.Join(names, "\x00")
}

// render executes the AST with the given data and returns the bytes of expect the output
// begins with, and the rest of the output.
func (t *Template) render(data map[string]Value, o RenderOptions, expect []string) (int, string, error) {
	e := evaluator{
		output: output{expect: expect, all: expect},
		memo:   o.Memo,
		stats:  o.Stats,
	}
	if e.stats == nil {
		e.stats = &MemoStats{}
	}
	if e.memo != nil {
		e.render = renders.Add(1)
		e.bound = t.bound
		e.shadows = t.shadows(data)
	}
	hint := o.SizeHint
	for _, p := range expect {
		hint -= len(p)
	}
	if hint > 0 {
		e.output.Grow(hint)
	}

	// Use the cached builtins scope directly. The scope is initialized
	// once at package init and is only read after that (lookupFilter,
	// chained get() through parent links, passed to nested evaluators).
	// No code path writes to e.builtins, so sharing the cached scope
	// across renders is safe and avoids cloning ~20 entries per render.
	e.builtins = cachedBuiltins

	// Create user data scope on top of builtins.
	e.scope = newScope(e.builtins)
	if t.globals != nil {
		e.scope.parent = t.globals
	}
	for k, v := range data {
		e.scope.set(k, v)
	}

	if err := e.execNodes(t.nodes); err != nil {
		return 0, "", err
	}
	if o.Spans != nil {
		*o.Spans = e.output.spans
	}
	return e.output.matched, e.output.String(), nil
}

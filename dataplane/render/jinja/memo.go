package jinja

import (
	"errors"
	"slices"
	"sync/atomic"
	"unsafe"
	"weak"
)

// Memo keeps, across renders, what iterations of a template's loops did, so that a later render
// replays an iteration instead of running it when everything the iteration read from outside
// itself reads the same. A chat template's loop over a conversation's messages is the case in
// mind: a multi-turn client sends every earlier message again, and each iteration but the last
// few reads what it read the turn before.
//
// An iteration is kept as the reads it made of values that existed before it started, in order
// (a variable, or a path of attributes and items from one, with the value found), the writes it
// made to them (a variable of the loop's scope, an attribute of a namespace), the text it output
// and how it ended (break, continue or neither). It is replayed only when each read, made again
// in order over the state the replayed writes leave, finds the same value: a number, string,
// boolean or none by value, a list, dict or callable by identity. The engine is deterministic
// given what it reads, so the replay writes and outputs what running it would.
//
// Identity is held by a weak pointer, so a record keeps no list or dict it read alive, and an
// object collected and another made at its address are never taken for one another. Identity is
// what makes this sound, with two conditions the caller guarantees: a list or dict
// is never changed once made, except a namespace's attributes by set tags (the template calls no
// mutator such as append or update, and sets an attribute only of a namespace), and a value
// found by identity in a later render is one the renders share unchanged (their decoded
// messages). A value made anew by each render (the messages list itself, a namespace) never
// matches one of an earlier render, so an iteration that reads one whole is run again. An
// iteration that calls a macro, makes a namespace, calls a clock or a stateful helper (cycler,
// joiner), or stores a callable is not kept. The one other value that changes, a loop object,
// is read whole by identity (its own loop's, which every render makes anew) or is a nested
// loop's that has ended by the time the iteration is kept: its attributes no longer change.
//
// Only the iterations over dicts of the first run of each loop in a render are looked up or
// kept, and only outside another kept iteration; an iteration kept by a render is not replayed
// by that render (a message sent twice in a conversation is one dict). A loop whose body cannot
// output (silentLoops) is never memoized: checking what its iteration read costs what running
// it does.
//
// The cost: recording adds a few allocations to an iteration (its events and path steps, each
// copied once into the iteration kept, its output copied), and a replay checks each read (a
// variable lookup and a few dict lookups) and compound, then copies the output.
type Memo interface {
	// Iterations sets found[i] to what was kept for the iteration of loop over items[i] (a
	// dict), or nil (items that are not dicts are never kept): a loop's look-ups are made
	// together, before it runs (a cache takes its lock once a loop, not once an iteration).
	// What it finds for a dict met twice in the loop is what an earlier render kept.
	Iterations(loop *Loop, items []Value, found []*Iteration)
	// Keep keeps what a run of loop kept of its iterations, each for its dict (Iteration.Item),
	// together when the run ends (a cache takes its lock once a loop). its is the memo's for the
	// call only.
	Keep(loop *Loop, its []*Iteration)
}

// IterationKey names an iteration of a loop: the loop (a node of a compiled template) and the
// dict it iterates over. The index is not part of it, but one of the reads (loop.index0) when
// the iteration reads it: a loop over messages[::-1] meets each message at a new index each
// turn, and replays when what it does with the index comes out the same.
type IterationKey struct {
	Loop *Loop
	Item *Dict
}

// Loop is a for loop of a compiled template.
type Loop = forNode

// Iteration is what one iteration read, wrote and output. It is immutable once kept.
type Iteration struct {
	sizes   map[any]int64 // the render's container sizes, until Size
	item    *Dict
	events  []memoEvent // in order; a compound's reads follow it
	steps   []pathStep  // the reads' paths, each a range of them
	out     string
	outSize int    // the bytes of out's array
	flow    error  // nil, errBreak or errContinue
	render  uint64 // the render that made it
	shadows string // the constants its render's data shadowed (Template.shadows): reads of the others are not recorded
}

// Item is the dict the iteration iterated over.
func (it *Iteration) Item() *Dict { return it.item }

// renders numbers the renders with a memo: a render never replays an iteration it made (a
// value it made anew, such as a namespace, is the same value there, its content changed
// since).
var renders atomic.Uint64

// Size approximates the bytes the iteration holds and keeps alive, counted up to limit (past
// it, the count stops): its output, events and path steps, and the values they hold: its item
// and what it wrote, whole. A list, dict or callable it read is held by a weak pointer (its
// identity, which is all a replay compares), so it keeps none alive. Within a render each
// container is walked once (what several iterations share is counted for each, not walked again).
func (it *Iteration) Size(limit int64) int64 {
	s := sizer{n: int64(it.outSize) + 96 + int64(len(it.events))*int64(unsafe.Sizeof(memoEvent{})) + int64(len(it.steps))*int64(unsafe.Sizeof(pathStep{})), limit: limit, sizes: it.sizes}
	it.sizes = nil
	if it.item != nil {
		s.n += int64(unsafe.Sizeof(Value{}))
		s.walk(Value{kind: KindDict, v: it.item}) // its own iteration's alone: not noted in sizes
	}
	for i := range it.events {
		ev := &it.events[i]
		s.n += int64(len(ev.root) + len(ev.attr))
		if ev.id == nil {
			s.value(ev.val)
		}
	}
	for i := range it.steps {
		s.value(it.steps[i].key)
	}
	return s.n
}

// sizer adds up the bytes values hold, until the count passes limit (then it stops: what is
// over the limit is not kept, however much over). sizes are the sizes of the containers walked
// whole in the render (nil: none kept).
type sizer struct {
	n, limit int64
	sizes    map[any]int64
}

func (s *sizer) value(v Value) {
	if s.n > s.limit {
		return
	}
	s.n += int64(unsafe.Sizeof(v))
	switch v.kind {
	case KindString:
		s.n += int64(len(v.v.(string)))
	case KindList, KindDict:
		if n, ok := s.sizes[v.v]; ok {
			s.n += n
			return
		}
		n0 := s.n
		s.walk(v)
		if s.sizes != nil && s.n <= s.limit {
			s.sizes[v.v] = s.n - n0
		}
	}
}

// walk adds up what the list or dict v holds.
func (s *sizer) walk(v Value) {
	if v.kind == KindList {
		for _, item := range v.v.(*List).Items {
			s.value(item)
		}
		return
	}
	for k, item := range v.v.(*Dict).Data {
		s.n += int64(len(k)) + 16
		s.value(item)
	}
}

// memoEvent is a read, a compound, or a write of a variable or a namespace's attribute.
type memoEvent struct {
	kind     eventKind
	truth    bool   // a compound is compared by its truth
	span     int32  // a compound's reads: the events after it
	from, to int32  // a read's path: steps[from:to]
	root     string // the variable read or written, or the namespace written
	attr     string // the attribute written, for eventSetAttr
	val      Value  // the value found (its kind alone when id is set) or written; a compound's value, or its truth as a bool
	id       any    // a read list, dict or callable: its identity
	expr     expr   // a compound's expression
}

type eventKind uint8

const (
	eventRead eventKind = iota
	// eventCompound is an expression evaluated in the loop's scope whose value is all that
	// matters, not the reads that made it: a condition (of an if tag or an if expression; its
	// truth) or a set tag's value. When one of its reads differs, it is evaluated again, and the
	// iteration replays if it comes out as it did (an index compared with a namespace's that
	// moved on, as Qwen3's last_query_index; an index computed from the messages' count and the
	// loop's, which both moved on).
	eventCompound
	eventSetVar
	eventSetAttr
)

// pathStep is one attribute (.name: a dict's key) or item ([key]: a list's index or a dict's
// key) of a path.
type pathStep struct {
	attr bool
	from Kind   // the kind of what the step is taken from: a dict or a list
	name string // an attribute's
	key  Value  // an item's
}

// recorder records the iterations of a render, one at a time: base is the loop's scope, where
// the iteration's variables are set; a scope below it is the iteration's own. Its events and
// steps are reused from one iteration to the next, and copied into the iteration kept.
type recorder struct {
	base    *scope
	itemVar string // the loop's variable, whose value is item
	item    *Dict
	written []string // the loop scope's variables this iteration set
	events  []memoEvent
	steps   []pathStep
	abort   bool // the iteration is not to be kept
}

// pathRef is a path being read from a variable outside the iteration (ok), its steps in place
// up to a few.
type pathRef struct {
	ok    bool
	root  string
	n     int
	steps [3]pathStep
	more  []pathStep
}

func (p *pathRef) push(st pathStep) {
	if p.n < len(p.steps) {
		p.steps[p.n] = st
	} else {
		p.more = append(p.more, st)
	}
	p.n++
}

// own reports whether the loop scope's variable name, of value v, is the iteration's own: the
// item itself, or a variable the iteration set before reading it (so it reads what it wrote).
func (r *recorder) own(name string, v Value) bool {
	if name == r.itemVar && v.kind == KindDict && v.v.(*Dict) == r.item {
		return true
	}
	return slices.Contains(r.written, name)
}

func (r *recorder) read(ref *pathRef, v Value) {
	from := len(r.steps)
	r.steps = append(r.steps, ref.steps[:min(ref.n, len(ref.steps))]...)
	r.steps = append(r.steps, ref.more...)
	ev := memoEvent{kind: eventRead, root: ref.root, from: int32(from), to: int32(len(r.steps)), val: v}
	if id := identity(v); id != nil {
		ev.val, ev.id = Value{kind: v.kind}, id
	}
	r.events = append(r.events, ev)
}

// identity is a weak pointer to the list, dict or callable v (nil for another value): equal to
// another's exactly when both are made from the same object, which it does not keep alive (a
// new object at the address of one collected gets a pointer of its own).
func identity(v Value) any {
	switch v.kind {
	case KindList:
		return weak.Make(v.v.(*List))
	case KindDict:
		return weak.Make(v.v.(*Dict))
	case KindCallable:
		return weak.Make(v.v.(*Callable))
	}
	return nil
}

// sameRead reports whether v is what the read ev found: for a list, dict or callable, the object
// its weak pointer still points to (nil once collected), found without making a weak pointer.
func sameRead(v Value, ev *memoEvent) bool {
	if ev.id == nil {
		return same(v, ev.val)
	}
	switch id := ev.id.(type) {
	case weak.Pointer[List]:
		return v.kind == KindList && id.Value() == v.v.(*List)
	case weak.Pointer[Dict]:
		return v.kind == KindDict && id.Value() == v.v.(*Dict)
	case weak.Pointer[Callable]:
		return v.kind == KindCallable && id.Value() == v.v.(*Callable)
	}
	return false
}

// same reports whether a and b are the same value: equal scalars, or the same list, dict or
// callable.
func same(a, b Value) bool {
	if a.kind != b.kind {
		return false
	}
	switch a.kind {
	case KindUndefined, KindNone:
		return true
	case KindBool:
		return a.v.(bool) == b.v.(bool)
	case KindInt:
		return a.v.(int64) == b.v.(int64)
	case KindFloat:
		return a.v.(float64) == b.v.(float64)
	case KindString:
		return a.v.(string) == b.v.(string)
	case KindList:
		return a.v.(*List) == b.v.(*List)
	case KindDict:
		return a.v.(*Dict) == b.v.(*Dict)
	case KindCallable:
		return a.v.(*Callable) == b.v.(*Callable)
	}
	return false
}

// lookup resolves name from the current scope; external reports, while recording, that it was
// found in the loop's scope or above (a value the iteration did not make), but not among the
// constants (builtins, the template's globals) unless the template binds the name (a set in
// the loop shadows the constant from one iteration on: the same iteration elsewhere in the
// loop, a message sent twice or a loop over messages reversed, reads what the set wrote), and
// is not the loop's item (which the iteration's key names: an immutable dict).
func (e *evaluator) lookup(name string) (v Value, external bool) {
	r := e.rec
	below := r != nil
	for s := e.scope; s != nil; s = s.parent {
		if below && s == r.base {
			below = false
		}
		if v, ok := s.own(name); ok {
			if r == nil || below || s.constant && !e.bound[name] {
				return v, false
			}
			return v, s != r.base || !r.own(name, v)
		}
	}
	return Undefined(), r != nil && !below
}

// recordedExpr evaluates a name, attribute, item or call expression while recording, and
// records the read when it is of a path from outside the iteration.
func (e *evaluator) recordedExpr(ex expr) (Value, error) {
	var ref pathRef
	v, err := e.evalRef(ex, &ref)
	if err == nil && ref.ok {
		e.rec.read(&ref, v)
	}
	return v, err
}

// evalRef evaluates ex, and when ex is a path (a variable, then attributes and items of dicts and
// lists) from outside the iteration, sets ref to it. A path ends where a step is not into a dict
// or list (a method of a string, for one): what it stopped at is recorded as read. A call of a
// check (NewCheck) is read through.
func (e *evaluator) evalRef(ex expr, ref *pathRef) (Value, error) {
	switch n := ex.(type) {
	case *nameExpr:
		v, external := e.lookup(n.name)
		if external {
			ref.ok, ref.root = true, n.name
		}
		return v, nil
	case *attrExpr:
		obj, err := e.evalRef(n.obj, ref)
		if err != nil {
			return Undefined(), err
		}
		if obj.IsDict() {
			if v, ok := obj.AsDict().Get(n.attr); ok {
				if ref.ok {
					ref.push(pathStep{attr: true, from: KindDict, name: n.attr})
				}
				return v, nil
			}
		}
		if ref.ok {
			e.rec.read(ref, obj)
			ref.ok = false
		}
		return e.attrOf(obj, n.attr)
	case *itemExpr:
		obj, err := e.evalRef(n.obj, ref)
		if err != nil {
			return Undefined(), err
		}
		key, err := e.evalExpr(n.key)
		if err != nil {
			return Undefined(), err
		}
		if ref.ok && (obj.IsList() || obj.IsDict()) {
			ref.push(pathStep{from: obj.kind, key: key})
			return itemOf(obj, key), nil
		}
		if ref.ok {
			e.rec.read(ref, obj)
			ref.ok = false
		}
		return itemOf(obj, key), nil
	case *callExpr:
		fn, err := e.evalExpr(n.fn)
		if err != nil {
			return Undefined(), err
		}
		if !fn.IsCallable() || !fn.AsCallable().passthrough || len(n.args) != 1 || len(n.kwargs) != 0 {
			return e.call(n, fn)
		}
		v, err := e.evalRef(n.args[0], ref)
		if err != nil {
			return Undefined(), err
		}
		if _, err := fn.AsCallable().Fn([]Value{v}, nil); err != nil {
			return Undefined(), err
		}
		return v, nil
	}
	return e.evalExpr(ex)
}

// callable checks fn before a call while recording: a volatile callable's iteration is not kept.
func (e *evaluator) callable(fn Value) {
	if e.rec != nil && fn.IsCallable() && fn.AsCallable().volatile {
		e.rec.abort = true
	}
}

// recordSet records, while recording, a set tag's write of v to name (ns empty) or to the
// attribute name of the namespace ns.
func (e *evaluator) recordSet(ns, name string, v Value) {
	r := e.rec
	if r == nil {
		return
	}
	if v.IsCallable() {
		r.abort = true // a macro or a bound method, whose meaning is the scope it was made in
		return
	}
	if ns != "" {
		if _, external := e.lookup(ns); !external {
			r.abort = true
			return
		}
		r.events = append(r.events, memoEvent{kind: eventSetAttr, root: ns, attr: name, val: v})
		return
	}
	if e.scope == r.base {
		r.events = append(r.events, memoEvent{kind: eventSetVar, root: name, val: v})
		if !slices.Contains(r.written, name) {
			r.written = append(r.written, name)
		}
	}
}

// evalCompound evaluates a condition (truth) or a set tag's value; while recording, in the
// loop's scope, as one event (eventCompound) followed by its reads.
func (e *evaluator) evalCompound(ex expr, truth bool) (Value, error) {
	r := e.rec
	if r == nil || e.scope != r.base {
		return e.evalExpr(ex)
	}
	mark := len(r.events)
	r.events = append(r.events, memoEvent{kind: eventCompound, expr: ex, truth: truth})
	v, err := e.evalExpr(ex)
	switch span := len(r.events) - mark - 1; {
	case err != nil:
	case span == 0:
		r.events = r.events[:mark] // no read: it comes out the same
	default:
		c := &r.events[mark]
		c.span, c.val = int32(span), v
		if truth {
			c.val = NewBool(v.IsTruthy())
		}
	}
	return v, err
}

// overlay is the state a replay's check sees: the loop scope's variables and the namespaces'
// attributes as the iteration's writes so far left them. An iteration writes a few, so they are
// kept in order and looked up from the latest.
type overlay struct {
	vars  []varWrite
	attrs []attrWrite
	// outer holds what the loop scope's parents bind to the names the checks read, for the run
	// of the loop whose scope is outerBase: a loop's iterations write only its own scope, so what
	// its parents bind is the same for all of them (a namespace's attributes change, not the
	// namespace). A name is found by its text's address, the template's own string (a read's
	// root, a name expression's), where the parents would be searched by hashing it once a read
	// (a chat template's render scope holds more variables than a scope holds in place).
	outerBase *scope
	outer     [8]outerName
	nouter    int
}

// outerName is a name the loop scope's parents bind, by its text's address and length, and its
// value.
type outerName struct {
	p   *byte
	n   int
	val Value
}

type varWrite struct {
	name string
	val  Value
}

type attrWrite struct {
	d    *Dict
	attr string
	val  Value
}

// attr is d's attribute written, if it was.
func (o *overlay) attr(d *Dict, attr string) (Value, bool) {
	for i := len(o.attrs) - 1; i >= 0; i-- {
		if w := &o.attrs[i]; w.d == d && w.attr == attr {
			return w.val, true
		}
	}
	return Undefined(), false
}

// name is the variable name as base and o have it.
func (o *overlay) name(base *scope, name string) Value {
	for i := len(o.vars) - 1; i >= 0; i-- {
		if o.vars[i].name == name {
			return o.vars[i].val
		}
	}
	if v, ok := base.own(name); ok || base.parent == nil {
		return v
	}
	if o.outerBase != base {
		o.outerBase, o.nouter = base, 0
	}
	p := unsafe.StringData(name)
	for i := range o.nouter {
		if on := &o.outer[i]; on.p == p && on.n == len(name) {
			return on.val
		}
	}
	v, _ := base.parent.get(name)
	if o.nouter < len(o.outer) {
		o.outer[o.nouter] = outerName{p, len(name), v}
		o.nouter++
	}
	return v
}

// replays reports whether it, kept for this iteration, reads the same from base (the loop's
// scope) now: each read and compound checked in order, over the writes before it.
func (e *evaluator) replays(it *Iteration, base *scope) bool {
	o := &e.over1
	o.vars, o.attrs = o.vars[:0], o.attrs[:0]
	for i := 0; i < len(it.events); i++ {
		ev := &it.events[i]
		switch ev.kind {
		case eventRead, eventCompound:
			if !e.readsSame(o, base, it, i) {
				return false
			}
			i += int(ev.span)
		case eventSetVar:
			o.vars = append(o.vars, varWrite{ev.root, ev.val})
		case eventSetAttr:
			ns := o.name(base, ev.root)
			if !ns.IsDict() {
				return false
			}
			o.attrs = append(o.attrs, attrWrite{ns.AsDict(), ev.attr, ev.val})
		}
	}
	return true
}

// readsSame reports whether the read or compound it.events[i] reads the same from base and o
// now; a compound whose reads differ, when it comes out as it did.
func (e *evaluator) readsSame(o *overlay, base *scope, it *Iteration, i int) bool {
	ev := &it.events[i]
	if ev.kind == eventRead {
		v, ok := o.resolve(base, ev.root, it.steps[ev.from:ev.to])
		return ok && sameRead(v, ev)
	}
	for j := i + 1; j <= i+int(ev.span); j++ {
		if !e.readsSame(o, base, it, j) {
			return e.holds(o, base, ev)
		}
		j += int(it.events[j].span)
	}
	return true
}

// holds reports whether the compound ev, evaluated again in base over o, comes out as it did.
func (e *evaluator) holds(o *overlay, base *scope, ev *memoEvent) bool {
	check := e.checker
	if check == nil {
		check = &evaluator{builtins: e.builtins}
		e.checker = check
	}
	check.scope, check.over = base, o
	v, err := check.evalExpr(ev.expr)
	if err != nil {
		return false
	}
	if ev.truth {
		return v.IsTruthy() == ev.val.AsBool()
	}
	return same(v, ev.val)
}

// resolve reads root and its steps from base as the overlay has it; ok is false where the path
// would not have continued as recorded (a step into what it was not taken from, an attribute
// the dict lacks).
func (o *overlay) resolve(base *scope, root string, steps []pathStep) (Value, bool) {
	v := o.name(base, root)
	for _, st := range steps {
		if v.kind != st.from {
			return Undefined(), false
		}
		switch {
		case v.IsDict():
			k := st.name
			if !st.attr {
				k = printValue(st.key)
			}
			if w, ok := o.attr(v.AsDict(), k); ok {
				v = w
				continue
			}
			w, ok := v.AsDict().Get(k)
			if !ok && st.attr {
				return Undefined(), false
			}
			if !ok {
				w = Undefined()
			}
			v = w
		case v.IsList() && !st.attr:
			v = itemOf(v, st.key)
		default:
			return Undefined(), false
		}
	}
	return v, true
}

// replay does what it did: its writes to base (the loop's scope) and the namespaces, its output;
// it returns how it ended.
func (e *evaluator) replay(it *Iteration, base *scope) error {
	for i := range it.events {
		ev := &it.events[i]
		switch ev.kind {
		case eventSetVar:
			base.set(ev.root, ev.val)
		case eventSetAttr:
			ns, _ := base.get(ev.root)
			ns.AsDict().Set(ev.attr, ev.val)
		}
	}
	e.output.WriteString(it.out)
	return it.flow
}

// memoIteration runs one iteration of the loop n over item, with base (the loop's scope) set for
// it: replayed from it (what e.memo had kept for it when the loop started, or nil) when what it
// reads is the same, else run and, if it may be, appended to run (what the loop's run keeps:
// its own, as a memoized loop may run inside an iteration of another that is not recorded).
func (e *evaluator) memoIteration(n *forNode, item Value, base *scope, it *Iteration, run *[]*Iteration) error {
	key := IterationKey{Loop: n, Item: item.AsDict()}
	if it != nil && it.render != e.render && it.shadows == e.shadows && e.replays(it, base) {
		e.stats.Replayed++
		start := e.output.Len()
		err := e.replay(it, base)
		e.output.span(start, it.out, it.outSize)
		return err
	}
	r := e.recorder
	if r == nil {
		r = &recorder{}
		e.recorder = r
	}
	r.base, r.events, r.steps, r.abort = base, r.events[:0], r.steps[:0], false
	r.itemVar, r.item, r.written = n.valVar, key.Item, r.written[:0]
	start := e.output.Len()
	e.rec = r
	err := e.execNodes(n.body)
	e.rec = nil
	if r.abort || (err != nil && !errors.Is(err, errBreak) && !errors.Is(err, errContinue)) {
		e.stats.NotKept++
		return err
	}
	e.stats.Kept++
	if e.sizes == nil {
		e.sizes = map[any]int64{}
	}
	out, size := e.output.since(start)
	e.output.span(start, out, size)
	*run = append(*run, &Iteration{sizes: e.sizes, item: key.Item, events: slices.Clone(r.events), steps: slices.Clone(r.steps),
		out: out, outSize: size, flow: err, render: e.render, shadows: e.shadows})
	return err
}

// touch reads the first bytes of what the iterations in kept hold (their events, their paths,
// their output) before the loop replays them, and returns a sum of them. A long conversation's
// kept iterations are rarely in the processor's caches: loads that depend on nothing but
// kept let the processor have many misses in flight at once, where the replays, one after
// another, each waited for its own.
func touch(kept []*Iteration) int {
	sum := 0
	for _, it := range kept {
		if it == nil {
			continue
		}
		if len(it.events) > 0 {
			sum += int(it.events[0].kind) + int(it.events[len(it.events)-1].kind)
		}
		if len(it.steps) > 0 {
			sum += len(it.steps[0].name)
		}
		for i := 0; i < min(len(it.out), touchedOutput); i += 64 { // a message's output, most of it
			sum += int(it.out[i])
		}
	}
	return sum
}

// touchedOutput bounds the bytes of an iteration's output touch reads (a line of 64 bytes at a
// time): enough for a short message's, where most of a long one's comes in as it is copied.
const touchedOutput = 256

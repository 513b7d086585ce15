package jinja

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

var (
	errBreak    = errors.New("break")
	errContinue = errors.New("continue")
)

// =============================================================================
// Scope
// =============================================================================

// scope is one level of variables. Its first few are held in place and found by comparing
// names: the scopes of a render, a loop or a call hold a handful, and hashing a name for each
// set and lookup (a loop sets its variables every iteration) cost a long conversation's render
// more than comparing a few short names. Past fewVars, and for the builtins, a map holds them.
type scope struct {
	few    [fewVars]binding
	nfew   int
	vars   map[string]Value // nil while the scope holds fewVars or fewer
	parent *scope
	// constant: the builtins' or a template's globals, which no render changes.
	constant bool
}

// fewVars is how many variables a scope holds in place.
const fewVars = 8

type binding struct {
	name string
	val  Value
}

func newScope(parent *scope) *scope {
	return &scope{parent: parent}
}

// own is the variable name of this level, not of its parents.
func (s *scope) own(name string) (Value, bool) {
	if s.vars != nil {
		v, ok := s.vars[name]
		return v, ok
	}
	for i := range s.nfew {
		if s.few[i].name == name {
			return s.few[i].val, true
		}
	}
	return Undefined(), false
}

func (s *scope) get(name string) (Value, bool) {
	for ; s != nil; s = s.parent {
		if v, ok := s.own(name); ok {
			return v, true
		}
	}
	return Undefined(), false
}

func (s *scope) set(name string, val Value) {
	if s.vars != nil {
		s.vars[name] = val
		return
	}
	for i := range s.nfew {
		if s.few[i].name == name {
			s.few[i].val = val
			return
		}
	}
	if s.nfew < fewVars {
		s.few[s.nfew] = binding{name, val}
		s.nfew++
		return
	}
	s.vars = make(map[string]Value, 2*fewVars)
	for _, b := range s.few[:s.nfew] {
		s.vars[b.name] = b.val
	}
	s.vars[name] = val
	s.few, s.nfew = [fewVars]binding{}, 0
}

// =============================================================================
// Evaluator
// =============================================================================

type evaluator struct {
	scope    *scope
	builtins *scope
	output   output

	memo     Memo              // nil: no iteration is memoized (memo.go)
	memoized map[*forNode]bool // the loops whose iterations this render looked up
	bound    map[string]bool   // with memo, the names the template binds (Template.bound)
	shadows  string            // with memo, the constants the render's data shadows (Template.shadows)
	rec      *recorder         // not nil while an iteration is recorded
	over     *overlay          // not nil while a kept iteration's condition is checked
	stats    *MemoStats        // not nil with memo
	render   uint64            // with memo, the render's number (renders)
	over1    overlay           // the replays' checks' overlay, reused
	recorder *recorder         // the iterations' recorder, reused
	checker  *evaluator        // the evaluator of the replays' compounds, reused
	sizes    map[any]int64     // the sizes of the containers the render's kept iterations hold
	touched  int               // touch's sums, so that its loads are not dropped
	// filterArgs is the stack of the builtin filters' arguments (evalFilter).
	filterArgs []Value
}

func (e *evaluator) execNodes(nodes []node) error {
	for _, n := range nodes {
		if err := e.execNode(n); err != nil {
			return err
		}
	}
	return nil
}

func (e *evaluator) execNode(n node) error {
	switch nd := n.(type) {
	case *textNode:
		e.output.WriteString(nd.text)
		return nil

	case *outputNode:
		val, err := e.evalExpr(nd.expression)
		if err != nil {
			return err
		}
		e.output.WriteString(printValue(val))
		return nil

	case *ifNode:
		return e.execIf(nd)

	case *forNode:
		return e.execFor(nd)

	case *setNode:
		return e.execSet(nd)

	case *setBlockNode:
		return e.execSetBlock(nd)

	case *macroNode:
		return e.execMacro(nd)

	case *callNode:
		return e.execCall(nd)

	case *filterBlockNode:
		return e.execFilterBlock(nd)

	case *breakNode:
		return errBreak

	case *continueNode:
		return errContinue

	default:
		return fmt.Errorf("unknown node type %T", n)
	}
}

func (e *evaluator) execIf(n *ifNode) error {
	for _, branch := range n.branches {
		if branch.condition == nil {
			// else branch
			return e.execNodes(branch.body)
		}
		cond, err := e.evalCompound(branch.condition, true)
		if err != nil {
			return err
		}
		if cond.IsTruthy() {
			return e.execNodes(branch.body)
		}
	}
	return nil
}

func (e *evaluator) execFor(n *forNode) error {
	iterVal, err := e.evalExpr(n.iter)
	if err != nil {
		return err
	}

	var items []Value
	switch {
	case iterVal.IsList():
		items = iterVal.AsList().Items
	case iterVal.IsDict():
		d := iterVal.AsDict()
		for _, key := range d.Keys {
			items = append(items, NewString(key))
		}
	case iterVal.IsString():
		for _, r := range iterVal.AsString() {
			items = append(items, NewString(string(r)))
		}
	default:
		// Empty iteration.
	}

	// Apply filter if present.
	if n.filterExpr != nil {
		var filtered []Value
		for _, item := range items {
			child := newScope(e.scope)
			child.set(n.valVar, item)
			old := e.scope
			e.scope = child
			fv, err := e.evalExpr(n.filterExpr)
			e.scope = old
			if err != nil {
				return err
			}
			if fv.IsTruthy() {
				filtered = append(filtered, item)
			}
		}
		items = filtered
	}

	if len(items) == 0 {
		if n.elseBody != nil {
			return e.execNodes(n.elseBody)
		}
		return nil
	}

	total := int64(len(items))

	// Pre-allocate the loop dict and child scope once, then reuse them
	// across iterations to avoid per-iteration allocations.
	loop := NewDict()
	ld := loop.AsDict()
	ld.Set("length", NewInt(total))
	place := &loopState{items: items}
	ld.loop = place

	child := newScope(e.scope)
	child.set("loop", loop)

	// Only a loop's first run in a render, outside a recorded iteration, is memoized: a record
	// is never checked against the render that made it. A loop that outputs nothing is not.
	memoize := e.memo != nil && e.rec == nil && !n.silent && !e.memoized[n]
	var kept []*Iteration // with memoize, what e.memo kept for each item
	var run []*Iteration  // with memoize, what this run keeps (given to e.memo when it ends)
	defer func() {
		if len(run) > 0 {
			e.memo.Keep(n, run) // however the run ends: what an error stopped is kept up to it
		}
	}()
	if memoize {
		if e.memoized == nil {
			e.memoized = map[*forNode]bool{}
		}
		e.memoized[n] = true
		kept = make([]*Iteration, len(items))
		e.memo.Iterations(n, items, kept)
		e.touched += touch(kept)
	}

	for i, item := range items {
		// Set loop variable(s).
		if n.keyVar != "" {
			// Destructuring: for key, val in items
			if item.IsList() && item.AsList().Len() >= 2 {
				child.set(n.keyVar, item.AsList().Get(0))
				child.set(n.valVar, item.AsList().Get(1))
			} else {
				child.set(n.keyVar, NewInt(int64(i)))
				child.set(n.valVar, item)
			}
		} else {
			child.set(n.valVar, item)
		}

		// The loop object's attributes are read from its place (loopState).
		place.i = i

		old := e.scope
		e.scope = child

		var err error
		if memoize && item.IsDict() {
			err = e.memoIteration(n, item, child, kept[i], &run)
		} else {
			err = e.execNodes(n.body)
		}
		e.scope = old

		if err != nil {
			if errors.Is(err, errBreak) {
				break
			}
			if errors.Is(err, errContinue) {
				continue
			}
			return err
		}
	}
	return nil
}

func (e *evaluator) execSet(n *setNode) error {
	val, err := e.evalCompound(n.value, false)
	if err != nil {
		return err
	}

	if n.namespace != "" {
		nsVal, ok := e.scope.get(n.namespace)
		if !ok || !nsVal.IsDict() {
			return fmt.Errorf("set: namespace %q not found or not a dict", n.namespace)
		}
		e.recordSet(n.namespace, n.target, val)
		nsVal.AsDict().Set(n.target, val)
		return nil
	}

	e.recordSet("", n.target, val)
	e.scope.set(n.target, val)
	return nil
}

func (e *evaluator) execSetBlock(n *setBlockNode) error {
	bodyEval := evaluator{
		scope:    e.scope,
		builtins: e.builtins,
		rec:      e.rec,
	}
	if err := bodyEval.execNodes(n.body); err != nil {
		return err
	}
	val := NewString(bodyEval.output.String())
	e.recordSet("", n.target, val)
	e.scope.set(n.target, val)
	return nil
}

func (e *evaluator) execMacro(n *macroNode) error {
	// Capture the macro body and params.
	params := n.params
	body := n.body
	parentScope := e.scope

	fn := newVolatile(n.name, func(args []Value, kwargs map[string]Value) (Value, error) {
		child := newScope(parentScope)

		// Bind positional args.
		for i, param := range params {
			if i < len(args) {
				child.set(param.name, args[i])
			} else if v, ok := kwargs[param.name]; ok {
				child.set(param.name, v)
			} else if param.defaultVal != nil {
				defEval := evaluator{scope: child, builtins: e.builtins}
				defVal, err := defEval.evalExpr(param.defaultVal)
				if err != nil {
					return Undefined(), err
				}
				child.set(param.name, defVal)
			} else {
				child.set(param.name, Undefined())
			}
		}

		// Set caller if available.
		if caller, ok := kwargs["caller"]; ok {
			child.set("caller", caller)
		}

		macroEval := evaluator{
			scope:    child,
			builtins: e.builtins,
		}

		if err := macroEval.execNodes(body); err != nil {
			return Undefined(), err
		}

		return NewString(macroEval.output.String()), nil
	})

	e.recordSet("", n.name, fn)
	e.scope.set(n.name, fn)
	return nil
}

func (e *evaluator) execCall(n *callNode) error {
	// Create a caller callable that renders the body.
	callerArgs := n.callerArgs
	body := n.body
	parentScope := e.scope

	if e.rec != nil {
		e.rec.abort = true // the call block's body runs as a macro's caller, in its own scope
	}
	caller := newVolatile("caller", func(args []Value, kwargs map[string]Value) (Value, error) {
		child := newScope(parentScope)
		for i, argName := range callerArgs {
			if i < len(args) {
				child.set(argName, args[i])
			}
		}

		callerEval := evaluator{
			scope:    child,
			builtins: e.builtins,
		}
		if err := callerEval.execNodes(body); err != nil {
			return Undefined(), err
		}
		return NewString(callerEval.output.String()), nil
	})

	// Evaluate the call expression with caller in kwargs.
	callEx, ok := n.expr.(*callExpr)
	if ok {
		fn, err := e.evalExpr(callEx.fn)
		if err != nil {
			return err
		}
		if !fn.IsCallable() {
			return fmt.Errorf("call: expression is not callable")
		}

		var args []Value
		for _, a := range callEx.args {
			av, err := e.evalExpr(a)
			if err != nil {
				return err
			}
			args = append(args, av)
		}

		kwargs := map[string]Value{"caller": caller}
		for _, kw := range callEx.kwargs {
			v, err := e.evalExpr(kw.value)
			if err != nil {
				return err
			}
			kwargs[kw.name] = v
		}

		result, err := fn.AsCallable().Fn(args, kwargs)
		if err != nil {
			return err
		}
		e.output.WriteString(printValue(result))
		return nil
	}

	// Fallback: evaluate expression and call with caller.
	fn, err := e.evalExpr(n.expr)
	if err != nil {
		return err
	}
	if !fn.IsCallable() {
		return fmt.Errorf("call: expression is not callable")
	}

	result, err := fn.AsCallable().Fn(nil, map[string]Value{"caller": caller})
	if err != nil {
		return err
	}
	e.output.WriteString(printValue(result))
	return nil
}

func (e *evaluator) execFilterBlock(n *filterBlockNode) error {
	// Render body to string.
	bodyEval := evaluator{
		scope:    e.scope,
		builtins: e.builtins,
		rec:      e.rec,
	}
	if err := bodyEval.execNodes(n.body); err != nil {
		return err
	}
	bodyStr := bodyEval.output.String()

	// Apply the filter. The filter expression should be a name or filter chain.
	if fe, ok := n.filter.(*nameExpr); ok {
		filterVal, ok := lookupFilter(e.builtins, fe.name)
		if !ok {
			return fmt.Errorf("unknown filter %q", fe.name)
		}
		result, err := filterVal.AsCallable().Fn([]Value{NewString(bodyStr)}, nil)
		if err != nil {
			return err
		}
		e.output.WriteString(printValue(result))
		return nil
	}

	// For more complex filter expressions, just output the body.
	e.output.WriteString(bodyStr)
	return nil
}

// =============================================================================
// Expression evaluation
// =============================================================================

func (e *evaluator) evalExpr(ex expr) (Value, error) {
	switch n := ex.(type) {
	case *litExpr:
		return n.val, nil

	case *nameExpr:
		if e.rec != nil {
			return e.recordedExpr(n)
		}
		if e.over != nil {
			return e.over.name(e.scope, n.name), nil
		}
		v, _ := e.scope.get(n.name)
		return v, nil

	case *attrExpr:
		if e.rec != nil {
			return e.recordedExpr(n)
		}
		return e.evalAttr(n)

	case *itemExpr:
		if e.rec != nil {
			return e.recordedExpr(n)
		}
		return e.evalItem(n)

	case *sliceExpr:
		return e.evalSlice(n)

	case *unaryExpr:
		return e.evalUnary(n)

	case *binExpr:
		return e.evalBinary(n)

	case *condExpr:
		return e.evalCond(n)

	case *callExpr:
		if e.rec != nil {
			return e.recordedExpr(n)
		}
		return e.evalCallExpr(n)

	case *filterExpr:
		return e.evalFilter(n)

	case *testExpr:
		return e.evalTestExpr(n)

	case *listExpr:
		items := make([]Value, len(n.items))
		for i, item := range n.items {
			v, err := e.evalExpr(item)
			if err != nil {
				return Undefined(), err
			}
			items[i] = v
		}
		return NewList(items), nil

	case *dictExpr:
		d := NewDict()
		dict := d.AsDict()
		for _, pair := range n.pairs {
			key, err := e.evalExpr(pair.key)
			if err != nil {
				return Undefined(), err
			}
			val, err := e.evalExpr(pair.value)
			if err != nil {
				return Undefined(), err
			}
			dict.Set(printValue(key), val)
		}
		return d, nil

	default:
		return Undefined(), fmt.Errorf("unknown expression type %T", ex)
	}
}

func (e *evaluator) evalAttr(n *attrExpr) (Value, error) {
	obj, err := e.evalExpr(n.obj)
	if err != nil {
		return Undefined(), err
	}
	if e.over != nil && obj.IsDict() {
		if v, ok := e.over.attr(obj.AsDict(), n.attr); ok {
			return v, nil
		}
	}
	return e.attrOf(obj, n.attr)
}

// attrOf is obj.attr: a dict's key, else a method of a dict, string or list.
func (e *evaluator) attrOf(obj Value, attr string) (Value, error) {
	// Dict attribute access.
	if obj.IsDict() {
		if v, ok := obj.AsDict().Get(attr); ok {
			return v, nil
		}

		// Dict methods.
		return e.dictMethod(obj, attr)
	}

	// String methods.
	if obj.IsString() {
		return e.stringMethod(obj, attr)
	}

	// List methods.
	if obj.IsList() {
		return e.listMethod(obj, attr)
	}

	return Undefined(), nil
}

func (e *evaluator) evalItem(n *itemExpr) (Value, error) {
	obj, err := e.evalExpr(n.obj)
	if err != nil {
		return Undefined(), err
	}

	key, err := e.evalExpr(n.key)
	if err != nil {
		return Undefined(), err
	}
	if e.over != nil && obj.IsDict() {
		if v, ok := e.over.attr(obj.AsDict(), printValue(key)); ok {
			return v, nil
		}
	}
	return itemOf(obj, key), nil
}

// itemOf is obj[key]: a list's item (negative from the end), a dict's key, a string's character.
func itemOf(obj, key Value) Value {
	if obj.IsList() {
		idx := int(toInt64(key))
		list := obj.AsList()
		if idx < 0 {
			idx += list.Len()
		}
		if idx < 0 || idx >= list.Len() {
			return Undefined()
		}
		return list.Get(idx)
	}

	if obj.IsDict() {
		k := printValue(key)
		if v, ok := obj.AsDict().Get(k); ok {
			return v
		}
		return Undefined()
	}

	if obj.IsString() {
		idx := int(toInt64(key))
		s := obj.AsString()
		runes := []rune(s)
		if idx < 0 {
			idx += len(runes)
		}
		if idx < 0 || idx >= len(runes) {
			return Undefined()
		}
		return NewString(string(runes[idx]))
	}

	return Undefined()
}

func (e *evaluator) evalSlice(n *sliceExpr) (Value, error) {
	obj, err := e.evalExpr(n.obj)
	if err != nil {
		return Undefined(), err
	}

	if obj.IsList() {
		list := obj.AsList()
		length := list.Len()
		start, stop, step := resolveSlice(n, e, length)

		// Fast path for the overwhelmingly common step==1 case
		// (e.g. messages[1:] in chat templates). A single allocation
		// of the exact size avoids the geometric growth of append.
		// Aliasing the source slice would be unsafe because List.Append
		// could later mutate beyond Len() into the backing array.
		if step == 1 {
			if start < 0 {
				start = 0
			}
			if stop > length {
				stop = length
			}
			if start >= stop {
				return NewList(nil), nil
			}
			items := make([]Value, stop-start)
			copy(items, list.Items[start:stop])
			return NewList(items), nil
		}

		var items []Value
		if step > 0 {
			// Pre-size to the maximum possible iteration count to
			// avoid append's geometric growth allocations.
			count := (stop - start + step - 1) / step
			if count > 0 {
				items = make([]Value, 0, count)
			}
			for i := start; i < stop; i += step {
				if i >= 0 && i < length {
					items = append(items, list.Items[i])
				}
			}
		} else if step < 0 {
			count := (start - stop - step - 1) / -step
			if count > 0 {
				items = make([]Value, 0, count)
			}
			for i := start; i > stop; i += step {
				if i >= 0 && i < length {
					items = append(items, list.Items[i])
				}
			}
		}
		return NewList(items), nil
	}

	if obj.IsString() {
		s := obj.AsString()

		// ASCII fast path. Most chat-template string slicing operates
		// on tag/role names or message content that is ASCII; for those
		// we can index by byte and skip the []rune conversion entirely.
		// This is the dominant cost in the kronk dense profile because
		// the system prompt can be tens of thousands of bytes.
		if isASCII(s) {
			length := len(s)
			start, stop, step := resolveSlice(n, e, length)

			if step == 1 {
				if start < 0 {
					start = 0
				}
				if stop > length {
					stop = length
				}
				if start >= stop {
					return NewString(""), nil
				}
				return NewString(s[start:stop]), nil
			}

			if step == -1 {
				if start >= length {
					start = length - 1
				}
				if stop < -1 {
					stop = -1
				}
				if start <= stop {
					return NewString(""), nil
				}
				buf := make([]byte, 0, start-stop)
				for i := start; i > stop; i-- {
					buf = append(buf, s[i])
				}
				return NewString(string(buf)), nil
			}
			// Fall through to the general path for unusual steps.
		}

		runes := []rune(s)
		length := len(runes)
		start, stop, step := resolveSlice(n, e, length)
		var result []rune
		if step > 0 {
			for i := start; i < stop; i += step {
				if i >= 0 && i < length {
					result = append(result, runes[i])
				}
			}
		} else if step < 0 {
			for i := start; i > stop; i += step {
				if i >= 0 && i < length {
					result = append(result, runes[i])
				}
			}
		}
		return NewString(string(result)), nil
	}

	return Undefined(), nil
}

// isASCII reports whether s contains only 7-bit ASCII bytes. Used to
// skip the []rune conversion in evalSlice's string branch when byte
// indexing produces the same result as code-point indexing.
func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func resolveSlice(n *sliceExpr, e *evaluator, length int) (int, int, int) {
	step := 1
	if n.step != nil {
		v, _ := e.evalExpr(n.step)
		step = int(toInt64(v))
		if step == 0 {
			step = 1
		}
	}

	var start, stop int

	if step > 0 {
		start = 0
		stop = length
	} else {
		start = length - 1
		stop = -length - 1
	}

	if n.start != nil {
		v, _ := e.evalExpr(n.start)
		start = int(toInt64(v))
		if start < 0 {
			start += length
		}
	}

	if n.stop != nil {
		v, _ := e.evalExpr(n.stop)
		stop = int(toInt64(v))
		if stop < 0 {
			stop += length
		}
	}

	return start, stop, step
}

func (e *evaluator) evalUnary(n *unaryExpr) (Value, error) {
	operand, err := e.evalExpr(n.operand)
	if err != nil {
		return Undefined(), err
	}

	switch n.op {
	case "not":
		return NewBool(!operand.IsTruthy()), nil
	case "-":
		if operand.IsInt() {
			return NewInt(-operand.AsInt()), nil
		}
		if operand.IsFloat() {
			return NewFloat(-operand.AsFloat()), nil
		}
		return NewInt(0), nil
	case "+":
		return operand, nil
	}

	return Undefined(), fmt.Errorf("unknown unary operator %q", n.op)
}

func (e *evaluator) evalBinary(n *binExpr) (Value, error) {
	// Short-circuit for and/or.
	if n.op == "and" {
		left, err := e.evalExpr(n.left)
		if err != nil {
			return Undefined(), err
		}
		if !left.IsTruthy() {
			return left, nil
		}
		return e.evalExpr(n.right)
	}

	if n.op == "or" {
		left, err := e.evalExpr(n.left)
		if err != nil {
			return Undefined(), err
		}
		if left.IsTruthy() {
			return left, nil
		}
		return e.evalExpr(n.right)
	}

	left, err := e.evalExpr(n.left)
	if err != nil {
		return Undefined(), err
	}

	right, err := e.evalExpr(n.right)
	if err != nil {
		return Undefined(), err
	}

	switch n.op {
	case "+":
		return addValues(left, right), nil
	case "-":
		return subValues(left, right), nil
	case "*":
		return mulValues(left, right), nil
	case "/":
		return divValues(left, right), nil
	case "//":
		return floorDivValues(left, right), nil
	case "%":
		return modValues(left, right), nil
	case "**":
		return powValues(left, right), nil
	case "~":
		return NewString(printValue(left) + printValue(right)), nil
	case "==":
		return NewBool(valuesEqual(left, right)), nil
	case "!=":
		return NewBool(!valuesEqual(left, right)), nil
	case "<":
		return NewBool(compareValues(left, right) < 0), nil
	case ">":
		return NewBool(compareValues(left, right) > 0), nil
	case "<=":
		return NewBool(compareValues(left, right) <= 0), nil
	case ">=":
		return NewBool(compareValues(left, right) >= 0), nil
	case "in":
		return NewBool(containsValue(right, left)), nil
	case "not in":
		return NewBool(!containsValue(right, left)), nil
	}

	return Undefined(), fmt.Errorf("unknown binary operator %q", n.op)
}

func (e *evaluator) evalCond(n *condExpr) (Value, error) {
	cond, err := e.evalCompound(n.condition, true)
	if err != nil {
		return Undefined(), err
	}

	if cond.IsTruthy() {
		return e.evalExpr(n.trueExpr)
	}

	if n.falseExpr != nil {
		return e.evalExpr(n.falseExpr)
	}

	return Undefined(), nil
}

func (e *evaluator) evalCallExpr(n *callExpr) (Value, error) {
	fn, err := e.evalExpr(n.fn)
	if err != nil {
		return Undefined(), err
	}
	return e.call(n, fn)
}

// call calls fn, the value of n's callee, with n's arguments.
func (e *evaluator) call(n *callExpr, fn Value) (Value, error) {

	if !fn.IsCallable() {
		return Undefined(), fmt.Errorf("%s is not callable: %s", callableName(n.fn), fn.String())
	}
	e.callable(fn)

	args := make([]Value, len(n.args))
	for i, a := range n.args {
		v, err := e.evalExpr(a)
		if err != nil {
			return Undefined(), err
		}
		args[i] = v
	}

	var kwargs map[string]Value
	if len(n.kwargs) > 0 {
		kwargs = make(map[string]Value, len(n.kwargs))
		for _, kw := range n.kwargs {
			v, err := e.evalExpr(kw.value)
			if err != nil {
				return Undefined(), err
			}
			kwargs[kw.name] = v
		}
	}

	return fn.AsCallable().Fn(args, kwargs)
}

func callableName(ex expr) string {
	switch n := ex.(type) {
	case *nameExpr:
		return n.name

	case *attrExpr:
		return callableName(n.obj) + "." + n.attr

	case *itemExpr:
		return callableName(n.obj) + "[item]"

	default:
		return ex.nodeType()
	}
}

func (e *evaluator) evalFilter(n *filterExpr) (Value, error) {
	input, err := e.evalExpr(n.expr)
	if err != nil {
		return Undefined(), err
	}

	// The builtin filter, found when parsed (e.builtins is cachedBuiltins).
	filterVal, ok := n.builtin, n.isBuiltin
	if !ok {
		// Also check scope for user-defined filters.
		filterVal, ok = e.scope.get(n.name)
		if !ok {
			return Undefined(), fmt.Errorf("unknown filter %q", n.name)
		}
		if e.rec != nil {
			if _, err := e.recordedExpr(&nameExpr{name: n.name}); err != nil {
				return Undefined(), err
			}
		}
	}
	e.callable(filterVal)

	if !filterVal.IsCallable() {
		return Undefined(), fmt.Errorf("filter %q is not callable", n.name)
	}

	// Build args: input as first, then additional args, on the evaluator's stack of them (a
	// filter in an argument pushes its own past them, and pops them before it returns): a
	// builtin filter keeps no slice of its arguments past the call, so one applied in every
	// iteration of a loop allocates nothing for it; another callable (the template's data) gets
	// a copy it may keep.
	start := len(e.filterArgs)
	defer func() {
		clear(e.filterArgs[start:])
		e.filterArgs = e.filterArgs[:start]
	}()
	e.filterArgs = append(e.filterArgs, input)
	for _, a := range n.args {
		v, err := e.evalExpr(a)
		if err != nil {
			return Undefined(), err
		}
		e.filterArgs = append(e.filterArgs, v)
	}
	args := e.filterArgs[start:len(e.filterArgs):len(e.filterArgs)]
	if !n.isBuiltin {
		args = slices.Clone(args)
	}

	var kwargs map[string]Value
	if len(n.kwargs) > 0 {
		kwargs = make(map[string]Value, len(n.kwargs))
		for _, kw := range n.kwargs {
			v, err := e.evalExpr(kw.value)
			if err != nil {
				return Undefined(), err
			}
			kwargs[kw.name] = v
		}
	}

	return filterVal.AsCallable().Fn(args, kwargs)
}

func (e *evaluator) evalTestExpr(n *testExpr) (Value, error) {
	val, err := e.evalExpr(n.expr)
	if err != nil {
		return Undefined(), err
	}

	var testArgs []Value
	for _, a := range n.args {
		v, err := e.evalExpr(a)
		if err != nil {
			return Undefined(), err
		}
		testArgs = append(testArgs, v)
	}

	result, err := evalTest(n.name, val, testArgs)
	if err != nil {
		return Undefined(), err
	}

	if n.negated {
		result = !result
	}

	return NewBool(result), nil
}

// =============================================================================
// String methods
// =============================================================================

func (e *evaluator) stringMethod(obj Value, method string) (Value, error) {
	s := obj.AsString()

	switch method {
	case "strip":
		return e.makeStringFunc("strip", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) > 0 {
				return NewString(strings.Trim(s, printValue(args[0]))), nil
			}
			return NewString(strings.TrimSpace(s)), nil
		}), nil

	case "lstrip":
		return e.makeStringFunc("lstrip", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) > 0 {
				return NewString(strings.TrimLeft(s, printValue(args[0]))), nil
			}
			return NewString(strings.TrimLeftFunc(s, func(r rune) bool {
				return r == ' ' || r == '\t' || r == '\n' || r == '\r'
			})), nil
		}), nil

	case "rstrip":
		return e.makeStringFunc("rstrip", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) > 0 {
				return NewString(strings.TrimRight(s, printValue(args[0]))), nil
			}
			return NewString(strings.TrimRightFunc(s, func(r rune) bool {
				return r == ' ' || r == '\t' || r == '\n' || r == '\r'
			})), nil
		}), nil

	case "split":
		return e.makeStringFunc("split", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) == 0 {
				parts := strings.Fields(s)
				items := make([]Value, len(parts))
				for i, p := range parts {
					items[i] = NewString(p)
				}
				return NewList(items), nil
			}
			sep := printValue(args[0])
			parts := strings.Split(s, sep)
			items := make([]Value, len(parts))
			for i, p := range parts {
				items[i] = NewString(p)
			}
			return NewList(items), nil
		}), nil

	case "startswith":
		return e.makeStringFunc("startswith", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) == 0 {
				return NewBool(false), nil
			}
			return NewBool(strings.HasPrefix(s, printValue(args[0]))), nil
		}), nil

	case "endswith":
		return e.makeStringFunc("endswith", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) == 0 {
				return NewBool(false), nil
			}
			return NewBool(strings.HasSuffix(s, printValue(args[0]))), nil
		}), nil

	case "replace":
		return e.makeStringFunc("replace", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) < 2 {
				return NewString(s), nil
			}
			old := printValue(args[0])
			newStr := printValue(args[1])
			count := -1
			if len(args) > 2 {
				count = int(toInt64(args[2]))
			}
			return NewString(strings.Replace(s, old, newStr, count)), nil
		}), nil

	case "upper":
		return e.makeStringFunc("upper", func(args []Value, kwargs map[string]Value) (Value, error) {
			return NewString(strings.ToUpper(s)), nil
		}), nil

	case "lower":
		return e.makeStringFunc("lower", func(args []Value, kwargs map[string]Value) (Value, error) {
			return NewString(strings.ToLower(s)), nil
		}), nil

	case "title":
		return e.makeStringFunc("title", func(args []Value, kwargs map[string]Value) (Value, error) {
			// Simple title case: capitalize first letter of each word.
			runes := []rune(s)
			inWord := false
			for i, r := range runes {
				if r == ' ' || r == '\t' || r == '\n' {
					inWord = false
				} else if !inWord {
					runes[i] = []rune(strings.ToUpper(string(r)))[0]
					inWord = true
				}
			}
			return NewString(string(runes)), nil
		}), nil

	case "capitalize":
		return e.makeStringFunc("capitalize", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(s) == 0 {
				return NewString(""), nil
			}
			runes := []rune(s)
			runes[0] = []rune(strings.ToUpper(string(runes[0])))[0]
			return NewString(string(runes)), nil
		}), nil

	case "count":
		return e.makeStringFunc("count", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) == 0 {
				return NewInt(0), nil
			}
			return NewInt(int64(strings.Count(s, printValue(args[0])))), nil
		}), nil

	case "find":
		return e.makeStringFunc("find", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) == 0 {
				return NewInt(-1), nil
			}
			return NewInt(int64(strings.Index(s, printValue(args[0])))), nil
		}), nil

	case "format":
		return e.makeStringFunc("format", func(args []Value, kwargs map[string]Value) (Value, error) {
			result := s
			for i, arg := range args {
				placeholder := fmt.Sprintf("{%d}", i)
				result = strings.ReplaceAll(result, placeholder, printValue(arg))
				result = strings.Replace(result, "{}", printValue(arg), 1)
			}
			return NewString(result), nil
		}), nil
	}

	return Undefined(), nil
}

func (e *evaluator) makeStringFunc(name string, fn func([]Value, map[string]Value) (Value, error)) Value {
	return NewCallable("str."+name, fn)
}

// =============================================================================
// List methods
// =============================================================================

func (e *evaluator) listMethod(obj Value, method string) (Value, error) {
	list := obj.AsList()

	switch method {
	case "append":
		return NewCallable("list.append", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) > 0 {
				list.Append(args[0])
			}
			return None(), nil
		}), nil

	case "pop":
		return NewCallable("list.pop", func(args []Value, kwargs map[string]Value) (Value, error) {
			if list.Len() == 0 {
				return Undefined(), fmt.Errorf("pop from empty list")
			}
			idx := list.Len() - 1
			if len(args) > 0 {
				idx = int(toInt64(args[0]))
				if idx < 0 {
					idx += list.Len()
				}
			}
			if idx < 0 || idx >= list.Len() {
				return Undefined(), fmt.Errorf("pop index out of range")
			}
			val := list.Items[idx]
			list.Items = append(list.Items[:idx], list.Items[idx+1:]...)
			return val, nil
		}), nil

	case "insert":
		return NewCallable("list.insert", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) < 2 {
				return None(), nil
			}
			idx := min(max(int(toInt64(args[0])), 0), list.Len())
			list.Items = append(list.Items, Undefined())
			copy(list.Items[idx+1:], list.Items[idx:])
			list.Items[idx] = args[1]
			return None(), nil
		}), nil
	}

	return Undefined(), nil
}

// =============================================================================
// Dict methods
// =============================================================================

func (e *evaluator) dictMethod(obj Value, method string) (Value, error) {
	d := obj.AsDict()

	switch method {
	case "items":
		return NewCallable("dict.items", func(args []Value, kwargs map[string]Value) (Value, error) {
			items := make([]Value, 0, d.Len())
			for _, key := range d.Keys {
				pair := NewList([]Value{NewString(key), d.Data[key]})
				items = append(items, pair)
			}
			return NewList(items), nil
		}), nil

	case "keys":
		return NewCallable("dict.keys", func(args []Value, kwargs map[string]Value) (Value, error) {
			items := make([]Value, 0, d.Len())
			for _, key := range d.Keys {
				items = append(items, NewString(key))
			}
			return NewList(items), nil
		}), nil

	case "values":
		return NewCallable("dict.values", func(args []Value, kwargs map[string]Value) (Value, error) {
			items := make([]Value, 0, d.Len())
			for _, key := range d.Keys {
				items = append(items, d.Data[key])
			}
			return NewList(items), nil
		}), nil

	case "get":
		return NewCallable("dict.get", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) == 0 {
				return Undefined(), nil
			}
			key := printValue(args[0])
			if v, ok := d.Get(key); ok {
				return v, nil
			}
			if len(args) > 1 {
				return args[1], nil
			}
			return None(), nil
		}), nil

	case "pop":
		return NewCallable("dict.pop", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) == 0 {
				return Undefined(), nil
			}
			key := printValue(args[0])
			v, ok := d.Get(key)
			if ok {
				delete(d.Data, key)
				newKeys := make([]string, 0, len(d.Keys)-1)
				for _, k := range d.Keys {
					if k != key {
						newKeys = append(newKeys, k)
					}
				}
				d.Keys = newKeys
				return v, nil
			}
			if len(args) > 1 {
				return args[1], nil
			}
			return Undefined(), nil
		}), nil

	case "update":
		return NewCallable("dict.update", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) > 0 && args[0].IsDict() {
				other := args[0].AsDict()
				for _, key := range other.Keys {
					d.Set(key, other.Data[key])
				}
			}
			return None(), nil
		}), nil
	}

	return Undefined(), nil
}

// =============================================================================
// Arithmetic helpers
// =============================================================================

func addValues(a, b Value) Value {
	if a.IsString() || b.IsString() {
		return NewString(printValue(a) + printValue(b))
	}
	if a.IsList() && b.IsList() {
		items := make([]Value, 0, a.AsList().Len()+b.AsList().Len())
		items = append(items, a.AsList().Items...)
		items = append(items, b.AsList().Items...)
		return NewList(items)
	}
	if a.IsFloat() || b.IsFloat() {
		return NewFloat(toFloat64(a) + toFloat64(b))
	}
	return NewInt(toInt64(a) + toInt64(b))
}

func subValues(a, b Value) Value {
	if a.IsFloat() || b.IsFloat() {
		return NewFloat(toFloat64(a) - toFloat64(b))
	}
	return NewInt(toInt64(a) - toInt64(b))
}

func mulValues(a, b Value) Value {
	if a.IsString() && b.IsInt() {
		return NewString(strings.Repeat(a.AsString(), int(b.AsInt())))
	}
	if a.IsFloat() || b.IsFloat() {
		return NewFloat(toFloat64(a) * toFloat64(b))
	}
	return NewInt(toInt64(a) * toInt64(b))
}

func divValues(a, b Value) Value {
	bf := toFloat64(b)
	if bf == 0 {
		return NewFloat(0)
	}
	return NewFloat(toFloat64(a) / bf)
}

func floorDivValues(a, b Value) Value {
	bi := toInt64(b)
	if bi == 0 {
		return NewInt(0)
	}
	return NewInt(toInt64(a) / bi)
}

func modValues(a, b Value) Value {
	bi := toInt64(b)
	if bi == 0 {
		return NewInt(0)
	}
	return NewInt(toInt64(a) % bi)
}

func powValues(a, b Value) Value {
	return NewFloat(math.Pow(toFloat64(a), toFloat64(b)))
}

func valuesEqual(a, b Value) bool {
	// Cross-type numeric comparison.
	if a.IsNumber() && b.IsNumber() {
		return toFloat64(a) == toFloat64(b)
	}
	// None == None.
	if a.IsNone() && b.IsNone() {
		return true
	}
	return a.Equals(b)
}

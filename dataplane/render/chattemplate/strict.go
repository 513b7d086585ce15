package chattemplate

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/epd-dev/coordinator/dataplane/render/jinja"
)

// The engine never fails on operand types: "x" + {...} prints the dict, and "x" in None is false.
// Jinja2 raises a TypeError for both, so Hugging Face refuses the conversation (DeepSeek-V3's
// template concatenates a tool call's arguments, which must then be a string; gpt-oss's and
// Qwen3's test "..." in message.content, which fails on a null content). prepare makes the
// engine check as Python does where templates rely on it:
//
//   - Printed concatenations that splitConcat splits ({{ "lit" + a + b }}): every operand after
//     the literal must be a string, as Python's str + requires; each is passed through __hf_cat.
//   - Other '+' chains that are a whole printed or assigned expression ({{ a + b }},
//     {% set x = "lit" + a + b %}): the chain is one __hf_add call, Python's + applied left to
//     right (strings, numbers, lists; a TypeError otherwise), a run of strings joined in one
//     allocation, not copied again by every '+' after a long message. The operands are evaluated
//     before the first '+' is applied, not in turn: a chain that fails fails either way.
//   - The right operand of "in" and "not in" must be a container (a string, a list or a dict)
//     or undefined (Jinja2's Undefined iterates as empty): it is passed through __hf_in. The
//     "in" of a for tag is the loop's, not the operator.
//
//   - An attribute or item of an undefined value: Jinja2's Undefined raises (messages[0].role on
//     an empty list); strictAccess passes each named object through __hf_def first, except the
//     names loopScope proves defined where they stand (messages; loop and message in a loop over
//     the conversation): a call the engine makes per access, per message.
//
// Other operators keep the engine's lenient typing. A failed check is a *typeError: the
// conversation's shape, which Load's probes accept as they accept a raise_exception.

// typeError is the TypeError Jinja2 raises on these operands.
type typeError struct{ msg string }

func (e *typeError) Error() string { return "TypeError: " + e.msg }

// strictHelpers are the variables prepare's rewrites call (templateGlobals).
var strictHelpers = map[string]jinja.Value{
	"__hf_cat": operandCheck("__hf_cat", jinja.Value.IsString, "can only concatenate str (not {type}) to str"),
	"__hf_add": jinja.NewCallable("__hf_add", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) < 2 {
			return jinja.Undefined(), &typeError{"__hf_add takes two operands or more"}
		}
		return pyAddChain(args)
	}),
	"__hf_def": operandCheck("__hf_def", func(v jinja.Value) bool { return !v.IsUndefined() },
		"an attribute or item of an undefined value (jinja2.exceptions.UndefinedError)"),
	"__hf_in": operandCheck("__hf_in", func(v jinja.Value) bool {
		return v.IsString() || v.IsList() || v.IsDict() || v.IsUndefined()
	}, "argument of type {type} is not iterable (operator in)"),
}

// operandCheck is a helper of one operand, passed through when ok holds; otherwise it raises the
// TypeError msg, "{type}" in it replaced by the operand's Python type name, quoted.
func operandCheck(name string, ok func(jinja.Value) bool, msg string) jinja.Value {
	return jinja.NewCheck(name, func(v jinja.Value) error {
		if !ok(v) {
			return &typeError{strings.ReplaceAll(msg, "{type}", strconv.Quote(pyTypeName([]jinja.Value{v})))}
		}
		return nil
	})
}

// pyTypeName is Python's name of the type of the single argument.
func pyTypeName(args []jinja.Value) string {
	if len(args) != 1 {
		return "arguments"
	}
	switch v := args[0]; {
	case v.IsUndefined():
		return "Undefined"
	case v.IsNone():
		return "NoneType"
	case v.IsBool():
		return "bool"
	case v.IsInt():
		return "int"
	case v.IsFloat():
		return "float"
	case v.IsString():
		return "str"
	case v.IsList():
		return "list"
	case v.IsDict():
		return "dict"
	}
	return "object"
}

// strictIn wraps the right operand of every "in" / "not in" operator of a tag's expression
// (rewriteTag's output: double-quoted literals) in __hf_in(...). forTag says the tag is a for
// tag, whose first "in" is the loop's. An operand it cannot delimit is left as it is.
func strictIn(expr string, forTag bool) string {
	var out strings.Builder
	skipFirst := forTag
	for i := 0; i < len(expr); i++ {
		c := expr[i]
		switch {
		case c == '"':
			j := literalEnd(expr, i)
			if j < 0 {
				out.WriteString(expr[i:])
				return out.String()
			}
			out.WriteString(expr[i : j+1])
			i = j
		case isIdent(c):
			j := identEnd(expr, i)
			word, attr := expr[i:j], i > 0 && expr[i-1] == '.'
			out.WriteString(word)
			i = j - 1
			if word != "in" || attr {
				continue
			}
			if skipFirst {
				skipFirst = false
				continue
			}
			k := j
			for k < len(expr) && (expr[k] == ' ' || expr[k] == '\t' || expr[k] == '\n') {
				k++
			}
			end := operandEnd(expr, k)
			if end <= k {
				continue
			}
			out.WriteString(expr[j:k])
			out.WriteString("__hf_in(")
			out.WriteString(strictIn(expr[k:end], false))
			out.WriteString(")")
			i = end - 1
		default:
			out.WriteByte(c)
		}
	}
	return out.String()
}

// operandEnd is the end of the postfix expression starting at s[i]: a name or a parenthesized
// group, then any .name, [...] and (...) after it; i when there is none there (a literal, say).
func operandEnd(s string, i int) int {
	j := i
	switch {
	case j < len(s) && s[j] == '(':
		if j = groupEnd(s, j); j < 0 {
			return i
		}
	case j < len(s) && isIdent(s[j]) && !(s[j] >= '0' && s[j] <= '9'):
		j = identEnd(s, j)
		if w := s[i:j]; w == "not" || w == "none" || w == "None" || w == "true" || w == "false" || w == "True" || w == "False" {
			return i
		}
	default:
		return i
	}
	end, closed := accessorsEnd(s, j)
	if !closed {
		return i
	}
	return end
}

// groupEnd is the index after the bracket closing the one at s[i], or -1.
func groupEnd(s string, i int) int {
	depth := 0
	for j := i; j < len(s); j++ {
		switch s[j] {
		case '"':
			if j = literalEnd(s, j); j < 0 {
				return -1
			}
		case '(', '[', '{':
			depth++
		case ')', ']', '}':
			depth--
			if depth == 0 {
				return j + 1
			}
		}
	}
	return -1
}

// pyAddChain is Python's args[0] + args[1] + ... (applied left to right, as pyAdd), a run of
// strings joined at once.
func pyAddChain(args []jinja.Value) (jinja.Value, error) {
	acc := args[0]
	for i := 1; i < len(args); {
		if !acc.IsString() || !args[i].IsString() {
			var err error
			if acc, err = pyAdd(acc, args[i]); err != nil {
				return acc, err
			}
			i++
			continue
		}
		j, size := i, len(acc.AsString())
		for ; j < len(args) && args[j].IsString(); j++ {
			size += len(args[j].AsString())
		}
		var s strings.Builder
		s.Grow(size)
		s.WriteString(acc.AsString())
		for _, a := range args[i:j] {
			s.WriteString(a.AsString())
		}
		acc, i = jinja.NewString(s.String()), j
	}
	return acc, nil
}

// pyAdd is Python's a + b on template values: strings, numbers (bool counts as int) and lists;
// a TypeError otherwise, an undefined operand included (Jinja2's UndefinedError).
func pyAdd(a, b jinja.Value) (jinja.Value, error) {
	num := func(v jinja.Value) bool { return v.IsInt() || v.IsFloat() || v.IsBool() }
	switch {
	case a.IsString() && b.IsString():
		return jinja.NewString(a.AsString() + b.AsString()), nil
	case a.IsList() && b.IsList():
		items := make([]jinja.Value, 0, a.AsList().Len()+b.AsList().Len())
		items = append(append(items, a.AsList().Items...), b.AsList().Items...)
		return jinja.NewList(items), nil
	case num(a) && num(b) && (a.IsFloat() || b.IsFloat()):
		return jinja.NewFloat(pyFloat(a) + pyFloat(b)), nil
	case num(a) && num(b):
		return jinja.NewInt(pyInt(a) + pyInt(b)), nil
	case a.IsString():
		return jinja.Undefined(), &typeError{fmt.Sprintf("can only concatenate str (not %q) to str", pyTypeName([]jinja.Value{b}))}
	}
	return jinja.Undefined(), &typeError{fmt.Sprintf("unsupported operand type(s) for +: %q and %q", pyTypeName([]jinja.Value{a}), pyTypeName([]jinja.Value{b}))}
}

func pyInt(v jinja.Value) int64 {
	if v.IsBool() {
		if v.AsBool() {
			return 1
		}
		return 0
	}
	return v.AsInt()
}

func pyFloat(v jinja.Value) float64 {
	if v.IsFloat() {
		return v.AsFloat()
	}
	return float64(pyInt(v))
}

// strictAdd rewrites expr, when it is a chain of '+' (addChain), to one __hf_add call of its
// operands.
func strictAdd(expr string) string {
	parts := addChain(expr)
	if parts == nil {
		return expr
	}
	return "__hf_add(" + strings.Join(parts, ", ") + ")"
}

// assignAt is the index of the '=' of a set tag's assignment ("set x = ..."), or -1 (a block set).
func assignAt(tag string) int {
	for i := 0; i < len(tag); i++ {
		switch c := tag[i]; {
		case c == '"':
			if i = literalEnd(tag, i); i < 0 {
				return -1
			}
		case c == '=' && (i+1 >= len(tag) || tag[i+1] != '=') && (i == 0 || strings.IndexByte("=!<>", tag[i-1]) < 0):
			return i
		}
	}
	return -1
}

// strictAccess makes every attribute or item access whose object is named (name.a, name[0].b,
// f(x).c) check first that the object is defined: Jinja2's Undefined raises on any attribute or
// item (messages[0].role on an empty list), where the engine gives undefined again. The object is
// passed through __hf_def before each .attr and [item]; a call is not (x.items() stays a method
// call). Literals, filter and test names, and names without an access are left as they are.
func strictAccess(expr string) string { return strictAccessIn(expr, nil) }

// strictAccessIn is strictAccess where the names in defined are surely defined (loopScope's): an
// access on one of them is not checked (its own value, message.content, still is before an
// access of its own).
func strictAccessIn(expr string, defined map[string]bool) string {
	var out strings.Builder
	prevWord, prevSig := "", byte(0) // the last word and the last non-space character written
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"':
			j := literalEnd(expr, i)
			if j < 0 {
				out.WriteString(expr[i:])
				return out.String()
			}
			out.WriteString(expr[i : j+1])
			prevSig, prevWord, i = '"', "", j+1
		case isIdent(c) && !(c >= '0' && c <= '9') && prevSig != '.':
			j := identEnd(expr, i)
			word := expr[i:j]
			if prevSig == '|' || prevWord == "is" || prevWord == "not" && strings.HasSuffix(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(out.String()), "not")), "is") {
				out.WriteString(word) // a filter's or a test's name
				prevSig, prevWord, i = 'a', word, j
				continue
			}
			end := chainEnd(expr, j)
			out.WriteString(rewriteChain(word, expr[j:end], defined))
			prevSig, prevWord, i = 'a', word, end
		case isIdent(c):
			j := identEnd(expr, i)
			out.WriteString(expr[i:j])
			prevSig, prevWord, i = 'a', expr[i:j], j
		default:
			out.WriteByte(c)
			if c != ' ' && c != '\t' && c != '\n' {
				prevSig, prevWord = c, ""
			}
			i++
		}
	}
	return out.String()
}

// chainEnd is the end of the accessors (.name, [...], (...)) that follow a name ending at s[i].
func chainEnd(s string, i int) int {
	end, _ := accessorsEnd(s, i)
	return end
}

// accessorsEnd is the end of the accessors (.name, [...], (...)) from s[i], and whether every
// bracket among them closes (if one does not, the end is where it opens).
func accessorsEnd(s string, i int) (int, bool) {
	for i < len(s) {
		switch s[i] {
		case '.':
			k := identEnd(s, i+1)
			if k == i+1 {
				return i, true
			}
			i = k
		case '[', '(':
			k := groupEnd(s, i)
			if k < 0 {
				return i, false
			}
			i = k
		default:
			return i, true
		}
	}
	return i, true
}

// identEnd is the end of the run of identifier bytes from s[i].
func identEnd(s string, i int) int {
	for i < len(s) && isIdent(s[i]) {
		i++
	}
	return i
}

// rewriteChain rewrites name and its accessors (chainEnd's), the bracketed ones' contents
// rewritten too; the first access is not checked when name is in defined.
func rewriteChain(name, accessors string, defined map[string]bool) string {
	cur := name
	check := func(i int) string {
		if i == 0 && defined[name] {
			return cur
		}
		return "__hf_def(" + cur + ")"
	}
	for i := 0; i < len(accessors); {
		switch accessors[i] {
		case '.':
			k := identEnd(accessors, i+1)
			cur = check(i) + accessors[i:k]
			i = k
		default: // '[' or '('
			k := groupEnd(accessors, i)
			group := accessors[i:i+1] + strictAccessIn(accessors[i+1:k-1], defined) + accessors[k-1:k]
			if accessors[i] == '[' {
				cur = check(i) + group
			} else {
				cur += group
			}
			i = k
		}
	}
	return cur
}

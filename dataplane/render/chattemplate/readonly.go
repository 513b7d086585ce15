package chattemplate

import (
	"regexp"
	"strings"
)

// mutator matches a call of a method that changes the list or dict it is called on: the engine's
// (append, pop, insert, update) and Python's others, which it may grow.
var mutator = regexp.MustCompile(`\.\s*(append|pop|insert|update|extend|remove|clear|setdefault|popitem|sort|reverse)\s*\(`)

// readsInputsOnly reports whether the template src changes no value it is given, so that renders
// may share decoded messages (MessageCache): no tag calls a method that changes a list or a dict,
// and every `set a.b` (the engine writes b into whatever dict a is) sets a name that every set
// tag binds to a namespace(...) the template makes, and that no loop, macro parameter or with
// block binds. Text that merely looks like such a call (in a string literal) counts: the answer
// errs towards no sharing.
func readsInputsOnly(src string) bool {
	values := map[string][]string{} // name: what its plain set tags bind it to ("": a block set's text)
	var dotted []string             // the a of every set a.b
	bound := map[string]bool{}      // names a loop, a macro or a with block binds
	for _, s := range lex(src) {
		if s.kind != segBlock && s.kind != segVar {
			continue
		}
		if mutator.MatchString(s.text) {
			return false
		}
		fields := strings.Fields(s.text)
		if s.kind != segBlock || len(fields) == 0 {
			continue
		}
		switch fields[0] {
		case "for":
			targets, _ := forParts(s.text)
			for _, t := range targets {
				bound[t] = true
			}
		case "macro":
			for _, p := range macroParams(s.text) {
				bound[p] = true
			}
		case "with", "call":
			return false // they bind names this does not follow
		case "set":
			target, value := setParts(s.text)
			if name, _, ok := strings.Cut(target, "."); ok {
				dotted = append(dotted, strings.TrimSpace(name))
				continue
			}
			for _, name := range strings.Split(target, ",") {
				values[strings.TrimSpace(name)] = append(values[strings.TrimSpace(name)], value)
			}
		}
	}
	for _, name := range dotted {
		if bound[name] || len(values[name]) == 0 {
			return false
		}
		for _, v := range values[name] {
			if !strings.HasPrefix(v, "namespace(") {
				return false
			}
		}
	}
	return true
}

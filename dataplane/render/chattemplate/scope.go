package chattemplate

import (
	"regexp"
	"slices"
	"strings"
)

// loopScope knows, tag by tag, the names that are surely defined where a tag stands: messages
// (Render always binds it to a list of objects), the targets of the for loops the tag lies in
// whose items are never undefined, and loop. strictAccess needs no __hf_def check on them:
// message.role in a loop over the conversation checks nothing, and a template's loop bodies
// read such names on every message.
//
// A loop's items are never undefined when it iterates one of the inputs Render decodes from JSON
// (messages, tools, documents: a JSON list holds no undefined value), a slice of one
// (messages[1:], messages[::-1]), or a name every set tag of the template binds to one of those
// (Llama 3's and Gemma 3's loop_messages). Anything else (a list the template builds, a filter's
// output such as map(attribute=...)) may yield undefined items and keeps its checks. A name the
// template rebinds (set message = ...) is never trusted, nor are any when the template has a
// call block, a with block or a recursive loop (they bind names this does not follow). A macro's
// body sees none of the loops around it, and its parameters hide the names they share. messages
// is trusted only while no set tag, for loop or macro parameter binds it.
type loopScope struct {
	disabled   bool
	inputs     map[string]bool // names whose items are never undefined
	rebound    map[string]bool // names some set tag binds
	forTargets []string        // names some for tag or macro parameter binds
	blocks     []scopeBlock
}

// scopeBlock is an open block tag; a for's body (loop and its trusted targets in scope) lasts
// until its else or its end.
type scopeBlock struct {
	kind    string
	body    bool     // a for's before its else, a macro's
	targets []string // a for's targets, a macro's parameters
	trusted bool     // a for's targets are never undefined
}

// inputList matches the decoded inputs whose items are never undefined, and slices of them.
var inputList = regexp.MustCompile(`^(messages|tools|documents)(\[[-0-9: ]*\])?$`)

// newLoopScope reads every tag of segs for the names their set tags bind.
func newLoopScope(segs []segment) *loopScope {
	ls := &loopScope{inputs: map[string]bool{"messages": true, "tools": true, "documents": true}, rebound: map[string]bool{}}
	sets := map[string][]string{} // name: the values set tags bind it to
	for _, s := range segs {
		if s.kind != segBlock {
			continue
		}
		fields := strings.Fields(s.text)
		if len(fields) == 0 {
			continue
		}
		switch fields[0] {
		case "call", "with":
			ls.disabled = true
		case "macro":
			ls.forTargets = append(ls.forTargets, macroParams(s.text)...)
		case "for":
			if strings.Contains(s.text, " recursive") {
				ls.disabled = true
			}
			targets, _ := forParts(s.text)
			ls.forTargets = append(ls.forTargets, targets...)
		case "set":
			target, value := setParts(s.text)
			for _, name := range strings.Split(target, ",") {
				name = strings.TrimSpace(name)
				ls.rebound[name] = true
				sets[name] = append(sets[name], value)
			}
		}
	}
	// A value the pattern matches is a slice of an input; an input is one only while every set
	// tag that rebinds it binds it to one (a slice of another input included).
	safe := func(v string) bool { m := inputList.FindStringSubmatch(v); return m != nil && ls.inputs[m[1]] }
	for changed := true; changed; {
		changed = false
		for name, values := range sets {
			ok := true
			for _, v := range values {
				ok = ok && safe(v)
			}
			if was, seen := ls.inputs[name]; !seen && ok || was && !ok {
				ls.inputs[name], changed = ok, true
			}
		}
	}
	return ls
}

// defined returns the names surely defined inside the tags seen so far (nil: none).
func (ls *loopScope) defined() map[string]bool {
	if ls.disabled {
		return nil
	}
	names := map[string]bool{}
	if ls.unbound("messages") {
		names["messages"] = true
	}
	inLoop := false
	for _, b := range ls.blocks {
		if b.kind == "macro" { // its body sees none of the loops around it
			clear(names)
			if ls.unbound("messages") {
				names["messages"] = true
			}
			inLoop = false
			continue
		}
		if !b.body {
			continue
		}
		inLoop = true
		for _, t := range b.targets { // an inner loop's binding hides an outer one's
			if b.trusted {
				names[t] = true
			} else {
				delete(names, t)
			}
		}
	}
	if inLoop && ls.unbound("loop") {
		names["loop"] = true
	}
	return names
}

// unbound reports whether no set tag, for loop or macro parameter of the template binds name.
func (ls *loopScope) unbound(name string) bool {
	return !ls.rebound[name] && !slices.Contains(ls.forTargets, name)
}

// enter follows the block tag text: a block opens, ends, or a for's else takes its targets out
// of scope. It is called after the tag's own rewriting (a for's iterable is read outside it).
func (ls *loopScope) enter(text string) {
	fields := strings.Fields(text)
	if ls.disabled || len(fields) == 0 {
		return
	}
	kw := fields[0]
	switch {
	case strings.HasPrefix(kw, "end"):
		n := len(ls.blocks)
		if n == 0 || "end"+ls.blocks[n-1].kind != kw { // a block this does not follow: trust nothing
			ls.disabled = true
			return
		}
		ls.blocks = ls.blocks[:n-1]
	case kw == "else" || kw == "elif":
		if n := len(ls.blocks); n > 0 && ls.blocks[n-1].kind == "for" {
			ls.blocks[n-1].body = false
		}
	case kw == "for":
		targets, trusted := ls.loopTargets(text)
		ls.blocks = append(ls.blocks, scopeBlock{kind: "for", body: true, targets: targets, trusted: trusted})
	case kw == "macro":
		ls.blocks = append(ls.blocks, scopeBlock{kind: "macro", body: true, targets: macroParams(text)})
	case kw == "if" || kw == "filter" || kw == "block" || kw == "autoescape" || (kw == "set" && assignAt(rewriteTag(text)) < 0):
		ls.blocks = append(ls.blocks, scopeBlock{kind: kw})
	}
}

// loopTargets are the targets of the for tag text, and whether they are trusted: its items are
// never undefined, it has one target (an item unpacked into several may leave some undefined)
// and no set tag rebinds it.
func (ls *loopScope) loopTargets(text string) (targets []string, trusted bool) {
	targets, iterable := forParts(text)
	trusted = len(targets) == 1 && isName(targets[0]) && !ls.rebound[targets[0]]
	name := iterable
	if m := inputList.FindStringSubmatch(iterable); m != nil {
		name = m[1]
	}
	for _, b := range ls.blocks { // a loop's or a macro's binding hides the input
		trusted = trusted && !slices.Contains(b.targets, name)
	}
	return targets, trusted && isName(name) && ls.inputs[name]
}

// setParts are the target of the set tag text, as written, and the value it binds: "" for a
// block set (set name %}...{% endset: its value is text) and for names unpacked from one value.
func setParts(text string) (target, value string) {
	tag := strings.TrimSpace(rewriteTag(text))
	i := assignAt(tag)
	if i < 0 {
		return strings.TrimSpace(strings.TrimPrefix(tag, "set")), ""
	}
	target = strings.TrimSpace(strings.TrimPrefix(tag[:i], "set"))
	if strings.Contains(target, ",") {
		return target, ""
	}
	return target, strings.TrimSpace(tag[i+1:])
}

// forParts are the targets of the for tag text and its iterable (before any " if " filter).
func forParts(text string) (targets []string, iterable string) {
	body := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(text), "for"))
	in := strings.Index(body, " in ")
	if in < 0 {
		return nil, ""
	}
	for _, t := range strings.Split(body[:in], ",") {
		targets = append(targets, strings.TrimSpace(t))
	}
	iterable = strings.TrimSpace(body[in+len(" in "):])
	if cond := strings.Index(iterable, " if "); cond >= 0 {
		iterable = strings.TrimSpace(iterable[:cond])
	}
	return targets, iterable
}

// macroParams are the parameter names of the macro tag text ("macro name(a, b=1)").
func macroParams(text string) []string {
	open := strings.IndexByte(text, '(')
	if open < 0 {
		return nil
	}
	end := groupEnd(text, open)
	if end < 0 {
		end = len(text) + 1
	}
	var params []string
	depth, start := 0, open+1
	inside := text[:end-1]
	for i := open + 1; i <= len(inside); i++ {
		if i < len(inside) {
			switch inside[i] {
			case '(', '[', '{':
				depth++
				continue
			case ')', ']', '}':
				depth--
				continue
			case ',':
				if depth > 0 {
					continue
				}
			default:
				continue
			}
		}
		p := inside[start:i]
		if eq := strings.IndexByte(p, '='); eq >= 0 {
			p = p[:eq]
		}
		if p = strings.TrimSpace(p); p != "" {
			params = append(params, p)
		}
		start = i + 1
	}
	return params
}

// isName reports whether s is one identifier.
func isName(s string) bool {
	return s != "" && !(s[0] >= '0' && s[0] <= '9') && identEnd(s, 0) == len(s)
}

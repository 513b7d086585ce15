package chattemplate

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// TestLoopScopeChecks holds the accesses prepare leaves unchecked: on messages, on loop in a
// loop's body, and on a loop's target where its items are never undefined; every other access
// keeps its __hf_def.
func TestLoopScopeChecks(t *testing.T) {
	for _, tc := range []struct {
		name, template  string
		unchecked, kept []string // in the prepared source
	}{
		{"a loop over messages", `{% for message in messages %}{{ message.role }}{{ loop.index0 }}{{ message.content.strip() }}{% endfor %}`,
			[]string{"message.role", "loop.index0", "__hf_def(message.content).strip()"}, nil},
		{"messages itself", `{{ messages[0].role }}`, []string{"__hf_def(messages[0]).role"}, nil},
		{"after the loop", `{% for m in messages %}{% endfor %}{{ m.role }}{{ loop.index }}`, nil, []string{"__hf_def(m).role", "__hf_def(loop).index"}},
		{"a loop's else", `{% for m in messages %}{{ m.a }}{% else %}{{ m.b }}{{ loop.c }}{% endfor %}`, []string{"m.a"}, []string{"__hf_def(m).b", "__hf_def(loop).c"}},
		{"a slice, and a name bound to one", `{% set lm = messages[1:] %}{% for m in messages[::-1] %}{{ m.a }}{% endfor %}{% for n in lm %}{{ n.b }}{% endfor %}`,
			[]string{"m.a", "n.b"}, nil},
		{"a name bound to something else too", `{% if x %}{% set lm = messages %}{% else %}{% set lm = [y] %}{% endif %}{% for n in lm %}{{ n.b }}{% endfor %}`,
			nil, []string{"__hf_def(n).b"}},
		{"a list the template builds", `{% for m in [messages[5]] %}{{ m.a }}{% endfor %}`, nil, []string{"__hf_def(m).a"}},
		{"a filter's output", `{% for m in messages | map(attribute="x") %}{{ m.a }}{% endfor %}`, nil, []string{"__hf_def(m).a"}},
		{"a rebound target", `{% for m in messages %}{% set m = x %}{{ m.a }}{% endfor %}`, nil, []string{"__hf_def(m).a"}},
		{"an inner loop hides the target", `{% for m in messages %}{% for m in [x] %}{{ m.a }}{% endfor %}{{ m.b }}{% endfor %}`,
			[]string{"m.b"}, []string{"__hf_def(m).a"}},
		{"two targets", `{% for a, b in messages %}{{ a.x }}{% endfor %}`, nil, []string{"__hf_def(a).x"}},
		{"rebound messages", `{% set messages = x %}{% for m in messages %}{{ m.a }}{% endfor %}{{ messages[0] }}`, nil, []string{"__hf_def(m).a", "__hf_def(messages)[0]"}},
		{"a macro sees no loop", `{% macro f(m) %}{{ m.a }}{{ loop.b }}{% endmacro %}{% for m in messages %}{{ f(m) }}{% endfor %}`,
			nil, []string{"__hf_def(m).a", "__hf_def(loop).b"}},
		{"a macro parameter hides an input", `{% macro f(tools, messages=1) %}{% for t in tools %}{{ t.a }}{% endfor %}{{ messages.b }}{% endmacro %}{% for t in tools %}{{ t.c }}{% endfor %}`,
			[]string{"t.c"}, []string{"__hf_def(t).a", "__hf_def(messages).b"}},
		{"a call block", `{% for m in messages %}{% call f() %}{{ m.a }}{% endcall %}{% endfor %}`, nil, []string{"__hf_def(m).a"}},
		{"a block this does not follow", `{% for m in messages %}{% endfor %}{% endif %}{% for n in messages %}{{ n.a }}{% endfor %}`, nil, []string{"__hf_def(n).a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := prepare(tc.template)
			for _, want := range tc.unchecked {
				if !strings.Contains(got, want) {
					t.Errorf("prepare(%s) = %s: no %s", tc.template, got, want)
				}
			}
			for _, want := range tc.kept {
				if !strings.Contains(got, want) {
					t.Errorf("prepare(%s) = %s: no %s (the check is gone)", tc.template, got, want)
				}
			}
		})
	}
}

// TestLoopScopeStrict renders what Jinja2 refuses with an UndefinedError where a loop's target or
// a macro's parameter is undefined: the checks prepare keeps must fail it too.
func TestLoopScopeStrict(t *testing.T) {
	const guard = `{% if messages[0].bad is defined %}`
	for _, tc := range []struct{ name, template string }{
		{"a list the template builds", guard + `{% for m in [messages[5]] %}{{ m.role }}{% endfor %}{% endif %}`},
		{"a filter's output", guard + `{% for m in messages | map(attribute="x") %}{{ m.role }}{% endfor %}{% endif %}`},
		{"a rebound target", guard + `{% for m in messages %}{% set m = messages[5] %}{{ m.role }}{% endfor %}{% endif %}`},
		{"an inner loop hides the target", guard + `{% for m in messages %}{% for m in [messages[5]] %}{{ m.role }}{% endfor %}{% endfor %}{% endif %}`},
		{"a macro's parameter", `{% macro f(m) %}{{ m.role }}{% endmacro %}` + guard + `{% for m in messages %}{{ f() }}{% endfor %}{% endif %}`},
		{"a macro's parameter hides tools", `{% macro f(tools) %}{% for t in tools %}{{ t.role }}{% endfor %}{% endmacro %}` + guard + `{{ f([messages[5]]) }}{% endif %}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := loadInline(t, tc.template).Render(json.RawMessage(`[{"role": "user", "content": "a", "bad": 1}]`), Options{})
			if err == nil || !strings.Contains(err.Error(), "an attribute or item of an undefined value") {
				t.Fatalf("Render = %q, %v; want the UndefinedError", got, err)
			}
		})
	}
}

func TestMacroParams(t *testing.T) {
	for _, tc := range []struct {
		text string
		want []string
	}{
		{` macro f(a, b=1, c=[1, 2], d="x") `, []string{"a", "b", "c", "d"}},
		{` macro f() `, nil},
		{` macro f `, nil},
		{` macro render(tools, ns=namespace(a=1, b=2)) `, []string{"tools", "ns"}},
	} {
		if got := macroParams(tc.text); !slices.Equal(got, tc.want) {
			t.Errorf("macroParams(%q) = %q, want %q", tc.text, got, tc.want)
		}
	}
}

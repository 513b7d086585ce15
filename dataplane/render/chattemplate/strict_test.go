package chattemplate

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestStrictIn(t *testing.T) {
	for _, tc := range []struct {
		expr  string
		isFor bool
		want  string
	}{
		{`"x" in message.content`, false, `"x" in __hf_in(message.content)`},
		{`"a" in m["k"].v[0] or b not in (c or [])`, false, `"a" in __hf_in(m["k"].v[0]) or b not in __hf_in((c or []))`},
		{`for m in messages if "x" in m`, true, `for m in messages if "x" in __hf_in(m)`},
		{`x in [1, 2]`, false, `x in [1, 2]`}, // a literal list is a container
		{`"in" + x.in`, false, `"in" + x.in`}, // inside a literal, an attribute
		{`x in "abc"`, false, `x in "abc"`},
	} {
		if got := strictIn(tc.expr, tc.isFor); got != tc.want {
			t.Errorf("strictIn(%q, %t) = %q, want %q", tc.expr, tc.isFor, got, tc.want)
		}
	}
}

func TestStrictAccess(t *testing.T) {
	for _, tc := range []struct{ expr, want string }{
		{`messages[0].role == "system"`, `__hf_def(__hf_def(messages)[0]).role == "system"`},
		{`x.items()`, `__hf_def(x).items()`}, // a method call is not wrapped
		{`tool.parameters.properties.items()`, `__hf_def(__hf_def(__hf_def(tool).parameters).properties).items()`},
		{`m is defined and m.c is not none`, `m is defined and __hf_def(m).c is not none`},
		{`a | map(attribute="b") | join(", ")`, `a | map(attribute="b") | join(", ")`}, // filter names, kwargs
		{`x is not string`, `x is not string`},                                         // a test's name
		{`"x".join(y.z)`, `"x".join(__hf_def(y).z)`},
		{`namespace(found=false)`, `namespace(found=false)`},
		{`loop_messages[loop.index:]`, `__hf_def(loop_messages)[__hf_def(loop).index:]`},
		{`f(a.b).c[d.e]`, `__hf_def(__hf_def(f(__hf_def(a).b)).c)[__hf_def(d).e]`},
	} {
		if got := strictAccess(tc.expr); got != tc.want {
			t.Errorf("strictAccess(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

func TestStrictAdd(t *testing.T) {
	for _, tc := range []struct{ expr, want string }{
		{`a + b + "c"`, `__hf_add(a, b, "c")`},
		{`a + (b - c)`, `__hf_add(a, (b - c))`},
		{`a - b + c`, `a - b + c`},   // not a '+' chain: the engine's typing
		{`a + b == c`, `a + b == c`}, // ditto
		{`x[i + 1]`, `x[i + 1]`},     // inside brackets
		{`a | tojson + b`, `__hf_add(a | tojson, b)`},
	} {
		if got := strictAdd(tc.expr); got != tc.want {
			t.Errorf("strictAdd(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
	for _, tc := range []struct {
		tag  string
		want int
	}{{`set x = 1`, 6}, {`set ns.a = b == c`, 9}, {`set x`, -1}, {`set x = "=" + y`, 6}} {
		if got := assignAt(tc.tag); got != tc.want {
			t.Errorf("assignAt(%q) = %d, want %d", tc.tag, got, tc.want)
		}
	}
}

// TestStrictTypes renders what Jinja2 refuses with a TypeError: the engine must fail too (not
// with a TemplateError: the template did not raise), and accept what Jinja2 accepts.
func TestStrictTypes(t *testing.T) {
	for _, tc := range []struct {
		name, template, messages string
		want                     string // "" for an error naming wantErr
		wantErr                  string
	}{
		{"concat dict", `{{ "a" + (messages[0].args if messages[0].args is defined else "") + "b" }}`, `[{"args": {"k": 1}}]`, "", `can only concatenate str (not "dict") to str`},
		{"concat none", `{{ "a" + messages[0].content }}`, `[{"content": null}]`, "", `not "NoneType"`},
		{"concat strings", `{{ "a" + messages[0].content + "b" }}`, `[{"content": "x"}]`, "axb", ""},
		{"in none", `{% if "x" in messages[0].content %}y{% endif %}`, `[{"content": null}]`, "", `argument of type "NoneType" is not iterable`},
		{"not in int", `{% if "x" not in messages[0].n %}y{% endif %}`, `[{"n": 3}]`, "", `argument of type "int" is not iterable`},
		{"in string", `{% if "x" in messages[0].content %}y{% endif %}`, `[{"content": "axb"}]`, "y", ""},
		{"in dict", `{{ "content" in messages[0] }}`, `[{"content": null}]`, "True", ""},
		{"in undefined", `{{ "x" in messages[0].missing }}`, `[{"content": ""}]`, "False", ""},
		{"for loop", `{% for m in messages %}{{ m.content }}{% endfor %}`, `[{"content": "a"}, {"content": "b"}]`, "ab", ""},
		{"item of an empty list", `{% if messages[0].role == "system" %}s{% endif %}`, `[]`, "", "an attribute or item of an undefined value"},
		{"missing key's attribute", `{% if messages[0].role == "user" %}{{ messages[0].q.r }}{% endif %}`, `[{"role": "user"}]`, "", "an attribute or item of an undefined value"},
		{"undefined alone is fine", `{{ messages[1] is defined }}{{ messages[0].q is defined }}`, `[{"role": "user"}]`, "FalseFalse", ""},
		{"attribute of none is undefined", `{{ messages[0].content.x is defined }}`, `[{"content": null}]`, "False", ""},
		{"add strings", `{% set s = messages[0].content + "!" %}{{ s }}`, `[{"content": "a"}]`, "a!", ""},
		{"add numbers", `{% if messages[0].n is defined %}{{ messages[0].n + 1 }} {{ messages[0].n + 0.5 }} {{ messages[0].b + 1 }}{% endif %}`, `[{"n": 2, "b": true}]`, "3 2.5 2", ""},
		{"add lists", `{{ (messages[0].l + [3]) | length }}`, `[{"l": [1, 2]}]`, "3", ""},
		{"add none to string", `{% set s = messages[0].content + "!" %}{{ s }}`, `[{"content": null}]`, "", `unsupported operand type(s) for +: "NoneType" and "str"`},
		{"add a chain of strings", `{% set s = "<" + messages[0].role + ">" + messages[0].content | trim + "</" + messages[0].role + ">" %}{{ s }}`, `[{"role": "user", "content": " hi "}]`, "<user>hi</user>", ""},
		{"add a chain of numbers", `{% if messages[0].n is defined %}{{ messages[0].n + 1 + 0.5 }} {{ messages[0].b + messages[0].n + 1 }}{% endif %}`, `[{"n": 2, "b": true}]`, "3.5 4", ""},
		{"add a chain of lists", `{% if messages[0].l is defined %}{% set x = messages[0].l + [3] + [4, 5] %}{{ x | join(",") }}{% endif %}`, `[{"l": [1, 2]}]`, "1,2,3,4,5", ""},
		{"add strings then a number", `{% if messages[0].n is defined %}{{ "a" + messages[0].content + messages[0].n + "b" }}{% endif %}`, `[{"content": "x", "n": 1}]`, "", `can only concatenate str (not "int") to str`},
		{"add numbers then a string", `{% if messages[0].n is defined %}{% set s = messages[0].n + 1 + messages[0].content %}{% endif %}`, `[{"content": "x", "n": 1}]`, "", `unsupported operand type(s) for +: "int" and "str"`},
		{"add a string to a list", `{% if messages[0].l is defined %}{% set x = messages[0].l + [3] + "x" %}{% endif %}`, `[{"l": [1]}]`, "", `unsupported operand type(s) for +: "list" and "str"`},
		{"add number to string", `{% if messages[0].n is defined %}{{ messages[0].content + messages[0].n }}{% endif %}`, `[{"content": "a", "n": 1}]`, "", `can only concatenate str (not "int") to str`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := loadInline(t, tc.template).Render(json.RawMessage(tc.messages), Options{})
			var te *TemplateError
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Render: %v", err)
			case tc.wantErr == "" && got != tc.want:
				t.Fatalf("Render = %q, want %q", got, tc.want)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Render = %q, %v; want an error containing %q", got, err, tc.wantErr)
			case errors.As(err, &te):
				t.Fatalf("Render: %v is a TemplateError (a raise_exception), want a render error", err)
			}
		})
	}
}

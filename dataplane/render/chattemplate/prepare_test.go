package chattemplate

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/render/jinja"
)

// TestWhitespaceAndLiterals pins Jinja2's lexer behaviour with HF's trim_blocks and lstrip_blocks
// (each want is what Jinja2 3.1 renders), which prepare reimplements in place of the engine's.
func TestWhitespaceAndLiterals(t *testing.T) {
	for _, tc := range []struct{ template, want string }{
		{"{% for m in messages %}{{ m.role }} {% endfor %}", "system user "},
		{"{% for m in messages %}{{ m.role }}\n{% endfor %}", "system\nuser\n"},
		{"<s>\n{{ bos_token }}{%- if true %}y{% endif %}", "<s>\n<s>y"},
		{"{% if true %}{{ bos_token }}\nfoo{% endif %}", "<s>\nfoo"},
		{"{% set a = 1 %} {% if true %}y{% endif %}", " y"},
		{"a\n\u00a0 {% if true %}y{% endif %}", "a\ny"},
		{"{% if true -%}{{ bos_token }}  z{% endif %}", "<s>  z"},
		{"a {#- c #} b", "a b"},
		{"line\n  {# c #}\nnext", "line\nnext"},
		{"{%+ if true %}y{% endif %}", "y"},
		{"  {% raw %}  {{ x }}\n{% endraw %}\nz", "  {{ x }}\nz"},
		{"{% if true +%}\nkeep{% endif %}", "\nkeep"},
		{"x\n    {%+ if true %}y{% endif %}", "x\n    y"},
		{"  {% if true %}\n    a\n  {% endif %}\n", "    a\n"},
		{"{%- for m in messages -%}\n  [{{ m.role }}]\n{%- endfor -%}\n  end  ", "[system][user]end  "},
		{"{{ '\\r|\\x41|\\u00e9|\\101|\\q|\\'|\"' }}{{ \"a\\\"b\" }}", "\r|A|é|A|\\q|'|\"a\"b"},
		{"{% raw -%}   x  {%- endraw %}|", "x|"},
		{"t \t\n{%- if true %}\n\n{% endif %}\n", "t\n"},
		{"a}}b%}c#}d{ e{x", "a}}b%}c#}d{ e{x"},
		{"{{ '{{ not a tag }}' }}{% if '%}' %}ok{% endif %}", "{{ not a tag }}ok"},
	} {
		t.Run(tc.template, func(t *testing.T) {
			got, err := loadInline(t, tc.template).Render(json.RawMessage(`[{"role": "system"}, {"role": "user"}]`), Options{})
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			if got != tc.want {
				t.Errorf("got  %q\nwant %q\nprepared %q", got, tc.want, prepare(tc.template))
			}
		})
	}
}

func TestRewriteTag(t *testing.T) {
	for _, tc := range []struct{ tag, want string }{
		{" x | tojson ", ` x | __hf_tojson `},
		{" x|tojson(indent=2)|trim ", ` x|__hf_tojson(indent=2)|__hf_trim `},
		{" x |\n trim('a') ", " x |\n __hf_trim(\"a\") "},
		{" 'a | tojson' ~ x|tojsonish ", ` "a | tojson" ~ x|tojsonish `},
		{` "q\"t" | length `, ` "q\"t" | length `},
		{` 'it\'s' `, ` "it's" `},
		{` 'x\r\\' `, " \"x\r\\\\\" "},
		{` 'open `, ` 'open `},
	} {
		if got := rewriteTag(tc.tag); got != tc.want {
			t.Errorf("rewriteTag(%q) = %q, want %q", tc.tag, got, tc.want)
		}
	}
}

// TestSplitConcat pins which output expressions are printed operand by operand, and checks that
// the engine prints each split exactly as it prints the whole expression, whatever the operands
// hold (strings, numbers, lists, dicts, None, undefined, filters, calls).
func TestSplitConcat(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string // nil: printed whole
	}{
		{`"<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>" + "\n"`, []string{`"<|im_start|>"`, `m.role`, `"\n"`, `m.content`, `"<|im_end|>"`, `"\n"`}},
		{`"a" + n + f + l + d + none + missing`, []string{`"a"`, `n`, `f`, `l`, `d`, `none`, `missing`}},
		{`"a" + m.content | trim + "b"`, []string{`"a"`, `m.content | trim`, `"b"`}},
		{`"a" + (n + 1) + n * 2 + l[0] + d["k"] + "x+y".upper()`, []string{`"a"`, `(n + 1)`, `n * 2`, `l[0]`, `d["k"]`, `"x+y".upper()`}},
		{`"a\"+" + n`, []string{`"a\"+"`, `n`}},
		{`n + "a"`, nil},       // a number first: n + "a" still joins, but n + 1 would add
		{`"a" * 2 + n`, nil},   // the first operand is not a bare literal
		{`"a" + n - 1`, nil},   // '-' at the top level
		{`"a" + n ~ "b"`, nil}, // '~' binds less tightly
		{`"a" + n if n else "b"`, nil},
		{`"a" + n == "a1"`, nil},
		{`"a" + n is string`, nil},
		{`"a" + n in l`, nil},
		{`not "a" + n`, nil},
		{`"a" + 1e+3`, nil},
		{`"a" + + n`, nil},
		{`"a"`, nil},
		{`m.content`, nil},
	} {
		got := splitConcat(tc.expr)
		if !slices.Equal(got, tc.want) {
			t.Errorf("splitConcat(%s) = %q, want %q", tc.expr, got, tc.want)
		}
	}
	vars := map[string]any{"n": 7, "f": 2.5, "l": []any{1, "two", nil}, "d": map[string]any{"k": "v"}, "none": nil,
		"m": map[string]any{"role": "user", "content": "  hi  "}}
	for _, expr := range []string{
		`"<" + m.role + "\n" + m.content + ">"`,
		`"a" + n + f + l + d + none + missing`,
		`"a" + m.content | trim + "b"`,
		`"a" + (n + 1) + n * 2 + l[0] + d["k"] + "x+y".upper()`,
	} {
		whole, err := jinja.Compile("{{ " + expr + " }}")
		if err != nil {
			t.Fatal(err)
		}
		split, err := jinja.Compile("{{ " + strings.Join(splitConcat(expr), " }}{{ ") + " }}")
		if err != nil {
			t.Fatal(err)
		}
		want, err1 := whole.Render(vars)
		got, err2 := split.Render(vars)
		if err1 != nil || err2 != nil || got != want {
			t.Errorf("%s: split prints %q (%v), whole %q (%v)", expr, got, err2, want, err1)
		}
	}
}

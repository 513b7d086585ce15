package chattemplate

import (
	"encoding/json"
	"testing"
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

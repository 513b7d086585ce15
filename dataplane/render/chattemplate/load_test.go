package chattemplate

import (
	"encoding/json"
	"strings"
	"testing"
)

const echoTemplate = `{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}`

func TestLoadSources(t *testing.T) {
	listed := []map[string]string{{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}, {"name": "rag", "template": "R"}}
	for _, tc := range []struct {
		name  string
		files map[string]string
		tmpl  string // Load's name argument
		tools bool
		want  string
	}{
		{"tokenizer_config string", map[string]string{"tokenizer_config.json": configJSON(t, "cfg", nil)}, "", false, "cfg"},
		{"list: default", map[string]string{"tokenizer_config.json": configJSON(t, listed, nil)}, "", false, "D"},
		{"list: tool_use when tools are given", map[string]string{"tokenizer_config.json": configJSON(t, listed, nil)}, "", true, "T"},
		{"list: by name", map[string]string{"tokenizer_config.json": configJSON(t, listed, nil)}, "rag", true, "R"},
		{"chat_template.json over tokenizer_config", map[string]string{
			"tokenizer_config.json": configJSON(t, "cfg", nil), "chat_template.json": `{"chat_template": "json"}`}, "", false, "json"},
		{"chat_template.jinja over both", map[string]string{
			"tokenizer_config.json": configJSON(t, "cfg", nil), "chat_template.json": `{"chat_template": "json"}`, "chat_template.jinja": "jinja\n"}, "", false, "jinja"},
		{"additional_chat_templates", map[string]string{
			"tokenizer_config.json": configJSON(t, "cfg", nil), "additional_chat_templates/rag.jinja": "extra"}, "rag", false, "extra"},
		{"no chat_template in config but a .jinja", map[string]string{"tokenizer_config.json": `{"eos_token": "</s>"}`, "chat_template.jinja": "{{ eos_token }}"}, "", false, "</s>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := Load(modelDir(t, tc.files), tc.tmpl)
			if err != nil {
				t.Fatal(err)
			}
			opts := Options{}
			if tc.tools {
				opts.Tools = json.RawMessage(probeTools)
			}
			got, err := tmpl.Render(json.RawMessage(`[]`), opts)
			if err != nil || got != tc.want {
				t.Errorf("Render = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestLoadSpecialTokens(t *testing.T) {
	dir := modelDir(t, map[string]string{
		"tokenizer_config.json": configJSON(t, "{{ bos_token }}|{{ eos_token }}|{{ unk_token }}|{{ pad_token }}", map[string]any{
			"bos_token": map[string]any{"__type": "AddedToken", "content": "<|begin|>", "lstrip": false},
			"eos_token": "<|eot|>", "unk_token": nil, "pad_token": "<pad>", "add_bos_token": true,
		}),
		"special_tokens_map.json": `{"pad_token": {"content": "<|pad|>"}, "unk_token": "<unk>"}`,
	})
	tmpl, err := Load(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := tmpl.Render(json.RawMessage(`[]`), Options{}); err != nil || got != "<|begin|>|<|eot|>|<unk>|<|pad|>" {
		t.Errorf("Render = %q, %v", got, err)
	}
	if tmpl.BOSToken() != "<|begin|>" || tmpl.EOSToken() != "<|eot|>" || tmpl.UnkToken() != "<unk>" || tmpl.PadToken() != "<|pad|>" {
		t.Errorf("tokens: %q %q %q %q", tmpl.BOSToken(), tmpl.EOSToken(), tmpl.UnkToken(), tmpl.PadToken())
	}
	if v, ok := tmpl.AddBOSToken(); !v || !ok {
		t.Errorf("AddBOSToken() = %t, %t; want true, true", v, ok)
	}
	if _, ok := tmpl.AddEOSToken(); ok {
		t.Error("AddEOSToken() present; the config has none")
	}
}

// TestLoadErrors: what the engine cannot run fails Load, naming the file and the problem; a
// template's own raise_exception on some probes does not.
func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		tmpl  string
		want  []string // substrings of the error; none means Load succeeds
	}{
		{"no config", map[string]string{"chat_template.jinja": "x"}, "", []string{"tokenizer_config.json: not found"}},
		{"no template", map[string]string{"tokenizer_config.json": `{}`}, "", []string{"no chat template"}},
		{"unknown name", map[string]string{"tokenizer_config.json": configJSON(t, []map[string]string{{"name": "default", "template": "x"}}, nil)}, "rag",
			[]string{`no chat template named "rag" (have default)`}},
		{"bad token", map[string]string{"tokenizer_config.json": configJSON(t, "x", map[string]any{"eos_token": 3})}, "", []string{"tokenizer_config.json: eos_token"}},
		{"bad chat_template.json", map[string]string{"tokenizer_config.json": `{}`, "chat_template.json": `{"chat_template": `}, "", []string{"chat_template.json"}},
		{"syntax error", map[string]string{"tokenizer_config.json": `{}`, "chat_template.jinja": "{% for m in messages %}x"}, "",
			[]string{"chat_template.jinja", "unclosed for block"}},
		{"unknown statement, at its original line", map[string]string{"tokenizer_config.json": configJSON(t, "a\n{#- c\n -#}\n{% include 'x' %}", nil)}, "",
			[]string{"tokenizer_config.json", `line 4: unknown statement "include"`}},
		{"unknown filter on every probe", map[string]string{"tokenizer_config.json": configJSON(t, "{{ messages | nosuch }}", nil)}, "",
			[]string{"tokenizer_config.json", `unknown filter "nosuch"`, `probe "user"`}},
		{"unknown test in the tools branch", map[string]string{"tokenizer_config.json": configJSON(t, "{% if tools %}{{ tools is nosuchtest }}{% endif %}", nil)}, "",
			[]string{`unknown test "nosuchtest"`, "tools=true"}},
		{"unknown method in the tool-call branch", map[string]string{"tokenizer_config.json": configJSON(t,
			"{% for m in messages %}{% if m.tool_calls %}{{ m.content.isdigit() }}{% endif %}{% endfor %}", nil)}, "",
			[]string{"not callable", `probe "tool-call"`}},
		{"unknown filter in the named template", map[string]string{"tokenizer_config.json": configJSON(t,
			[]map[string]string{{"name": "default", "template": "x"}, {"name": "tool_use", "template": "{{ tools | nosuch }}"}}, nil)}, "",
			[]string{`(chat_template "tool_use")`, `unknown filter "nosuch"`}},
		{"raise_exception on some probes is fine", map[string]string{"tokenizer_config.json": configJSON(t,
			"{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"+echoTemplate, nil)}, "", nil},
		{"raise_exception on every probe", map[string]string{"tokenizer_config.json": configJSON(t, "{{ raise_exception('never') }}", nil)}, "",
			[]string{"rejects every probe conversation: never"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(modelDir(t, tc.files), tc.tmpl)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Load succeeded, want an error with %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

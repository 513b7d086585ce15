package chattemplate

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

const twoMessages = `[{"role": "system", "content": "  Sys\n"}, {"role": "user", "content": "Hi\tthere"}]`

func TestRenderFeatures(t *testing.T) {
	clock := func() time.Time { return time.Date(2024, 7, 4, 15, 4, 5, 0, time.UTC) }
	for _, tc := range []struct {
		name     string
		template string
		messages string
		opts     Options
		want     string
	}{
		{"messages and loop", `{% for m in messages %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ m.role }};{% endfor %}`,
			twoMessages, Options{}, "01TrueFalse2system;12FalseTrue2user;"},
		{"namespace", `{% set ns = namespace(n=0, last=-1) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}{{ ns.n }},{{ ns.last }}`,
			twoMessages, Options{}, "2,1"},
		{"slicing", `{% for m in messages[::-1] %}{{ m.role }} {% endfor %}|{{ messages[1:]|length }}|{{ messages[-1].role }}|{{ 'abcdef'[1:4] }}|{{ 'abc'[::-1] }}`,
			twoMessages, Options{}, "user system |1|user|bcd|cba"},
		{"add_generation_prompt", `{{ add_generation_prompt }}{% if add_generation_prompt %}<|assistant|>{% endif %}`,
			twoMessages, Options{AddGenerationPrompt: true}, "True<|assistant|>"},
		{"special tokens", `{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ unk_token is defined }}|{{ additional_special_tokens|join(',') }}`,
			twoMessages, Options{}, "<s>|</s>|<pad>|False|<a>,<b>"},
		{"tools absent is None", `{{ tools is defined }} {{ tools is none }} {{ documents is none }}`, twoMessages, Options{}, "True True True"},
		{"tools given", `{% for t in tools %}{{ t.function.name }} {{ t | tojson }}{% endfor %}`, twoMessages,
			Options{Tools: json.RawMessage(`[{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}]`)},
			`f {"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}`},
		{"tools null is None", `{{ tools is none }}`, twoMessages, Options{Tools: json.RawMessage(`null`)}, "True"},
		{"kwargs", `{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}{{ bos_token }}{% if extra is defined %}{{ extra.k }}{% endif %}`, twoMessages,
			Options{Kwargs: map[string]json.RawMessage{"enable_thinking": json.RawMessage(`false`), "bos_token": json.RawMessage(`"<BOS>"`), "extra": json.RawMessage(`{"k": [1]}`)}},
			"<think></think><BOS>[1]"},
		{"tojson key order and nesting", `{{ messages[0] | tojson }}`, `[{"zeta": 1, "alpha": {"y": [1, 2.5, null, true, false], "b": "x"}, "mid": {}}]`, Options{},
			`{"zeta": 1, "alpha": {"y": [1, 2.5, null, true, false], "b": "x"}, "mid": {}}`},
		{"tojson duplicate key keeps first position, last value", `{{ messages[0] | tojson }}`, `[{"a": 1, "b": 2, "a": 3}]`, Options{}, `{"a": 3, "b": 2}`},
		{"tojson strings as Python", `{{ messages[0].content | tojson }}`, `[{"content": "<b>&'x' \"q\" \\ é 🎉 \u2028 \u0001 \u007f \n\t\r\b\f"}]`, Options{},
			`"<b>&'x' \"q\" \\ é 🎉 ` + "\u2028" + ` \u0001 ` + "\u007f" + ` \n\t\r\b\f"`},
		{"tojson numbers as Python", `{% if messages[0].n is defined %}{{ messages[0].n | tojson }}{% endif %}`, `[{"n": [1.0, 0.5, 1e16, 1234567890123456.0, 0.0001, 0.00001, -0.0, 1e2, 9007199254740993, -7, 1.5e-7, 123456789012345678901234567890]}]`, Options{},
			`[1.0, 0.5, 1e+16, 1234567890123456.0, 0.0001, 1e-05, -0.0, 100.0, 9007199254740993, -7, 1.5e-07, 1.2345678901234568e+29]`},
		{"tojson indent keeps order", `{{ messages[0] | tojson(indent=2) }}`, `[{"z": [1, {"b": 2, "a": []}], "a": {}}]`, Options{},
			"{\n  \"z\": [\n    1,\n    {\n      \"b\": 2,\n      \"a\": []\n    }\n  ],\n  \"a\": {}\n}"},
		{"tojson separators, sort_keys, ensure_ascii", `{% if messages[0]['é'] is defined %}{{ messages[0] | tojson(separators=(',', ':'), sort_keys=true) }} {{ messages[0]['é'] | tojson(ensure_ascii=true) }}{% endif %}`,
			`[{"é": "é🎉", "a": 1}]`, Options{}, `{"a":1,"é":"é🎉"} "\u00e9\ud83c\udf89"`},
		{"tojson of a template dict keeps literal order", `{% set d = {'b': 1, 'a': [1, 'x']} %}{{ d | tojson }}|{{ d.b }}|{{ d['a'][1] }}`, twoMessages, Options{}, `{"b": 1, "a": [1, "x"]}|1|x`},
		{"string methods", `{{ messages[0].content.strip() }}|{{ messages[0].content.lstrip() }}|{{ '\n\n\tx\n'.lstrip('\n') }}|{{ 'x\r\n'.rstrip('\n') }}|{{ 'a</think>b'.split('</think>')[-1] }}|{{ messages[-1].content.startswith('Hi') }}|{{ 'ab'.endswith('b') }}|{{ 'aXa'.replace('a', 'b') }}|{{ 'ab'.upper() }}`,
			twoMessages, Options{}, "Sys|Sys\n|\tx\n|x\r|b|True|True|bXb|AB"},
		{"trim as Python str.strip", `[{{ messages[0].content | trim }}][{{ messages[1].content | trim }}][{{ 'xxaxx' | trim('x') }}]`,
			`[{"content": "\u001c \u00a0\u3000 a b\u2028\u0085"}, {"content": "\ufeffkeep\u200b"}]`, Options{}, "[a b][\ufeffkeep\u200b][a]"},
		{"strftime_now", `{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S %A %-d %j %p %%') }}`, twoMessages, Options{Now: clock},
			"04 Jul 2024|2024-07-04 15:04:05 Thursday 4 186 PM %"},
		{"macros", `{% macro r(m, p='>') %}{{ p }}{{ m.role }}{% endmacro %}{{ r(messages[0]) }}{{ r(messages[1], p='#') }}`, twoMessages, Options{}, ">system#user"},
		{"is defined / none / string / mapping", `{{ foo is defined }}|{{ messages[0].name is defined }}|{{ messages[0].tool_calls is not defined }}|{{ messages[0].content is string }}|{{ messages[0] is mapping }}|{{ none is none }}`,
			twoMessages, Options{}, "False|False|True|True|True|True"},
		{"items", `{% for k, v in messages[0]|items %}{{ k }}={{ v }};{% endfor %}{% for k, v in messages[0].items() %}{{ k }};{% endfor %}`,
			`[{"z": 1, "a": "x"}]`, Options{}, "z=1;a=x;z;a;"},
		{"content parts", `{% for p in messages[0].content %}{% if p.type == 'text' %}{{ p.text }}{% else %}<{{ p.type }}>{% endif %}{% endfor %}`,
			`[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]}]`, Options{}, "a<image>b"},
		{"tool calls and reasoning fields", `{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.name }}{{ c.function.arguments | tojson }}{% endfor %}{% endif %}{{ m.reasoning_content }}{{ m.tool_call_id }}{% endfor %}`,
			`[{"role": "assistant", "content": "", "reasoning_content": "think", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"b": 1, "a": 2}}}]}, {"role": "tool", "tool_call_id": "c1", "content": "r"}]`,
			Options{}, `f{"b": 1, "a": 2}thinkc1`},
		{"one trailing newline dropped, CRLF normalized", "a\r\nb\n\n", twoMessages, Options{}, "a\nb\n"},
		{"trim_blocks and lstrip_blocks", "A\n  {% if true %}\n    B\n  {% endif %}\nC {{- ' D ' -}} E", twoMessages, Options{}, "A\n    B\nC D E"},
		{"raw and string literals are not rewritten", `{% raw %}{{ x | tojson }}{% endraw %}{{ 'a | trim' }}{{ "b |tojson" | length }}`, twoMessages, Options{}, "{{ x | tojson }}a | trim9"},
		{"continue_final_message", `{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}`,
			`[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The answer is "}]`, Options{ContinueFinalMessage: true},
			"<user>Hi</user><assistant>The answer is "},
		{"continue_final_message keeps spacing the template kept", `{% for m in messages %}[{{ m.content }}]{% endfor %}`,
			`[{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "  b c"}]}]`, Options{ContinueFinalMessage: true},
			`[[{'type': 'text', 'text': 'a'}, {'type': 'text', 'text': '  b c`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := loadInline(t, tc.template).Render(json.RawMessage(tc.messages), tc.opts)
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			if got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestRenderErrors(t *testing.T) {
	const echo = `{% for m in messages %}{{ m.content }}{% endfor %}`
	for _, tc := range []struct {
		name     string
		template string
		messages string
		opts     Options
		limits   *Limits
		want     string
		raised   bool
	}{
		{"raise_exception", `{% if messages|length > 2 %}{{ raise_exception('too many: ' ~ messages|length) }}{% endif %}`,
			`[{}, {}, {}]`, Options{}, nil, "template raised: too many: 3", true},
		{"messages not an array", echo, `{"role": "user"}`, Options{}, nil, "messages must be a JSON array", false},
		{"message not an object", echo, `["hi"]`, Options{}, nil, "messages[0] must be an object", false},
		{"invalid JSON", echo, `[{"a": }]`, Options{}, nil, "messages: invalid JSON", false},
		{"tools not an array", echo, `[]`, Options{Tools: json.RawMessage(`{"a": 1}`)}, nil, "tools must be a JSON array", false},
		{"reserved kwarg", echo, `[]`, Options{Kwargs: map[string]json.RawMessage{"messages": json.RawMessage(`[]`)}}, nil, `kwarg "messages" is reserved`, false},
		{"internal kwarg", echo, `[]`, Options{Kwargs: map[string]json.RawMessage{"__hf_tojson": json.RawMessage(`1`)}}, nil, `kwarg "__hf_tojson" is reserved`, false},
		{"continue and generation prompt", echo, `[]`, Options{ContinueFinalMessage: true, AddGenerationPrompt: true}, nil, "not compatible", false},
		{"continue without the final text", `x`, `[{"role": "user", "content": "Hi"}]`, Options{ContinueFinalMessage: true}, nil, "does not appear", false},
		{"tojson of undefined", `{% if messages[0].role is not defined %}{{ messages[0].nope | tojson }}{% endif %}`, `[{}]`, Options{}, nil, "tojson: object of type Undefined", false},
		{"unknown filter in a branch probes miss", `{% if messages|length > 7 %}{{ 'x' | nosuchfilter }}{% endif %}`, `[{}, {}, {}, {}, {}, {}, {}, {}]`, Options{}, nil, `unknown filter "nosuchfilter"`, false},
		{"input bytes", echo, `[{"content": "0123456789"}]`, Options{}, &Limits{MaxInputBytes: 10, MaxDepth: 10, MaxMessages: 10, MaxOutputBytes: 100}, "input of 27 bytes exceeds the limit of 10", false},
		{"depth", echo, `[{"content": [[[[1]]]]}]`, Options{}, &Limits{MaxInputBytes: 100, MaxDepth: 4, MaxMessages: 10, MaxOutputBytes: 100}, "nested deeper than 4 levels", false},
		{"messages", echo, `[{}, {}, {}]`, Options{}, &Limits{MaxInputBytes: 100, MaxDepth: 4, MaxMessages: 2, MaxOutputBytes: 100}, "3 messages exceed the limit of 2", false},
		{"values in messages", echo, `[{"content": [1, 2, 3]}]`, Options{}, &Limits{MaxInputBytes: 100, MaxDepth: 4, MaxMessages: 2, MaxOutputBytes: 100, MaxValues: 5}, "more than 5 JSON values", false},
		{"values across messages, tools and kwargs", echo, `[{"content": "a"}]`, Options{Tools: json.RawMessage(`[{"a": 1}]`), Kwargs: map[string]json.RawMessage{"k": json.RawMessage(`[1, 2]`)}},
			&Limits{MaxInputBytes: 100, MaxDepth: 4, MaxMessages: 2, MaxOutputBytes: 100, MaxValues: 6}, "more than 6 JSON values", false},
		{"output bytes", echo, `[{"content": "0123456789"}]`, Options{}, &Limits{MaxInputBytes: 100, MaxDepth: 4, MaxMessages: 2, MaxOutputBytes: 5}, "output of 10 bytes exceeds the limit of 5", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := loadInline(t, tc.template)
			if tc.limits != nil {
				tmpl = tmpl.WithLimits(*tc.limits)
			}
			_, err := tmpl.Render(json.RawMessage(tc.messages), tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
			var te *TemplateError
			if errors.As(err, &te) != tc.raised {
				t.Errorf("errors.As(*TemplateError) = %t, want %t", !tc.raised, tc.raised)
			}
		})
	}
}

// TestRenderAfter: a turn rendered after the turn before's text matches as much of it as it
// begins with, and what it returns after the match is the rest of Render's text; with
// continue_final_message it matches nothing and returns the whole.
func TestRenderAfter(t *testing.T) {
	tmpl := loadInline(t, `{% for m in messages %}<{{ m.role }}>{{ m.content }}</>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}`)
	turn1 := json.RawMessage(`[{"role":"user","content":"hi"}]`)
	turn2 := json.RawMessage(`[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"more"}]`)
	edited := json.RawMessage(`[{"role":"user","content":"ho"},{"role":"assistant","content":"hello"},{"role":"user","content":"more"}]`)
	prev, err := tmpl.Render(turn1, Options{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		msgs    json.RawMessage
		opts    Options
		expect  []string
		matched int
	}{
		{"next turn", turn2, Options{AddGenerationPrompt: true}, []string{prev}, len(prev)},
		{"in pieces", turn2, Options{AddGenerationPrompt: true}, []string{prev[:3], "", prev[3:]}, len(prev)},
		{"more expected than matches", turn2, Options{AddGenerationPrompt: true}, []string{prev + "hex"}, len(prev) + 2},
		{"an edited history", edited, Options{AddGenerationPrompt: true}, []string{prev}, len("<user>h")},
		{"nothing expected", turn2, Options{AddGenerationPrompt: true}, nil, 0},
		{"continue_final_message", turn2, Options{ContinueFinalMessage: true}, []string{prev}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := tmpl.Render(tc.msgs, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			matched, rest, err := tmpl.RenderAfter(tc.msgs, tc.opts, tc.expect)
			if err != nil {
				t.Fatal(err)
			}
			if matched != tc.matched {
				t.Errorf("matched %d bytes, want %d", matched, tc.matched)
			}
			if got := strings.Join(tc.expect, "")[:matched] + rest; got != want {
				t.Errorf("got %q, want %q", got, want)
			}
		})
	}
}

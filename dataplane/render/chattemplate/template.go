package chattemplate

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/epd-dev/coordinator/dataplane/render/jinja"
)

// Template is a model's compiled chat template plus the special tokens HF passes to it. It is safe
// for concurrent use.
type Template struct {
	main    *compiled
	toolUse *compiled // HF's "tool_use" template, used when tools are given and Load had no name
	tokens  map[string]string
	extra   []string // additional_special_tokens
	addBOS  *bool
	addEOS  *bool
	limits  Limits
	// readsInputsOnly: its templates change no value they are given (renders may share decoded
	// messages).
	readsInputsOnly bool
}

// compiled is one template source, ready to render.
type compiled struct {
	file string
	src  string
	tmpl *jinja.Template
}

// Options are the per-request inputs of Render besides the messages.
type Options struct {
	// Tools is a JSON array of tool definitions; nil (or JSON null) passes tools=None, as HF does
	// when the request has none.
	Tools json.RawMessage
	// AddGenerationPrompt asks the template to open an assistant turn.
	AddGenerationPrompt bool
	// ContinueFinalMessage cuts the output right after the final message's content so the model
	// continues it (HF semantics); it excludes AddGenerationPrompt.
	ContinueFinalMessage bool
	// Kwargs are extra template variables (vLLM's chat_template_kwargs, e.g. enable_thinking);
	// they may override the special tokens but not messages, tools, documents,
	// add_generation_prompt or the template functions.
	Kwargs map[string]json.RawMessage
	// Now is strftime_now's clock; nil means time.Now.
	Now func() time.Time
	// Validated says that the messages, Tools and Kwargs are valid JSON already (values of a
	// parsed request body): they are not validated again.
	Validated bool
	// Strings, when not nil, keeps the long strings decoded for the renders that share it (a
	// conversation's next turn finds its earlier messages decoded).
	Strings *StringCache
	// MessageCache, when not nil, keeps the messages decoded for the renders that share it, found
	// by MessageItems (the messages array's elements, in order: a split the caller made anyway),
	// when the messages are Validated and the template changes no value it is given.
	MessageCache *MessageCache
	MessageItems []json.RawMessage
	// MessageFound, when not nil, is MessageItems looked up in MessageCache already (Find), in
	// the same order: each is used instead of a second look-up.
	MessageFound []FoundMessage
	// Iterations, when not nil with MessageCache (and under the same conditions), keeps what the
	// iterations of the template's loops over messages did, and replays those whose reads are
	// unchanged (jinja.Memo).
	Iterations *IterationCache
	// Spans, when not nil with Iterations, is set to the outputs of the iterations replayed or
	// kept that lie wholly in RenderAfter's rest (jinja.RenderOptions.Spans).
	Spans *[]jinja.Span
}

// TemplateError is the error Render returns when the template itself calls raise_exception: the
// request's shape is one the template rejects (a client error, not a server one).
type TemplateError struct {
	File    string // the template's origin
	Message string // raise_exception's argument
}

// Error implements error.
func (e *TemplateError) Error() string {
	return fmt.Sprintf("%s: template raised: %s", e.File, e.Message)
}

// Load reads dir/tokenizer_config.json: chat_template (a string, or a list of {name, template}:
// "default" unless a name is given, and with no name a "tool_use" one for renders with tools, as
// transformers picks; dir/chat_template.jinja, else dir/chat_template.json, takes precedence as
// in transformers, and dir/additional_chat_templates/NAME.jinja adds named ones),
// the special tokens bos_token, eos_token, unk_token, sep_token, pad_token, cls_token,
// mask_token and additional_special_tokens (a string or an AddedToken object {content: ...};
// dir/special_tokens_map.json overrides them, as in transformers) and add_bos_token/add_eos_token
// if present.
//
// The template is compiled and then rendered with probe conversations (see probe.go), so that a
// construct the engine does not support fails here rather than on a request. Errors name the file.
func Load(dir string, name string) (*Template, error) {
	cfg, err := readConfig(dir)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: %w", err)
	}
	srcs, err := readSources(dir, cfg)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: %w", err)
	}
	if len(srcs) == 0 {
		return nil, fmt.Errorf("chattemplate: %s: no chat template (looked for chat_template.jinja, chat_template.json and tokenizer_config.json's chat_template)", dir)
	}
	want := name
	if want == "" {
		want = "default"
	}
	i := slices.IndexFunc(srcs, func(s source) bool { return s.name == want })
	if i < 0 {
		names := make([]string, len(srcs))
		for j, s := range srcs {
			names[j] = s.name
		}
		return nil, fmt.Errorf("chattemplate: %s: no chat template named %q (have %s)", dir, want, strings.Join(names, ", "))
	}
	t := &Template{addBOS: cfg.AddBOSToken, addEOS: cfg.AddEOSToken, limits: DefaultLimits()}
	if t.main, err = compile(srcs[i]); err != nil {
		return nil, err
	}
	if j := slices.IndexFunc(srcs, func(s source) bool { return s.name == "tool_use" }); name == "" && j >= 0 && j != i {
		if t.toolUse, err = compile(srcs[j]); err != nil {
			return nil, err
		}
	}
	t.readsInputsOnly = readsInputsOnly(t.main.src) && (t.toolUse == nil || readsInputsOnly(t.toolUse.src))
	if t.tokens, t.extra, err = cfg.specialTokens(); err != nil {
		return nil, fmt.Errorf("chattemplate: %s: %w", filepath.Join(dir, "tokenizer_config.json"), err)
	}
	for _, c := range []*compiled{t.main, t.toolUse} {
		if c != nil {
			if err := t.probe(c); err != nil {
				return nil, err
			}
		}
	}
	return t, nil
}

func compile(s source) (*compiled, error) {
	tmpl, err := jinja.CompileWith(prepare(s.text), templateGlobals)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: %s: %w", s.file, err)
	}
	return &compiled{file: s.file, src: s.text, tmpl: tmpl}, nil
}

// BOSToken returns bos_token, or "" when the tokenizer has none.
func (t *Template) BOSToken() string { return t.tokens["bos_token"] }

// EOSToken returns eos_token, or "".
func (t *Template) EOSToken() string { return t.tokens["eos_token"] }

// UnkToken returns unk_token, or "".
func (t *Template) UnkToken() string { return t.tokens["unk_token"] }

// PadToken returns pad_token, or "".
func (t *Template) PadToken() string { return t.tokens["pad_token"] }

// AddBOSToken returns tokenizer_config.json's add_bos_token, if present.
func (t *Template) AddBOSToken() (value, ok bool) { return boolField(t.addBOS) }

// AddEOSToken returns tokenizer_config.json's add_eos_token, if present.
func (t *Template) AddEOSToken() (value, ok bool) { return boolField(t.addEOS) }

// contentLoop is a for loop over a message's content, as vLLM looks for one in a template's AST
// to tell its content format ("for part in message['content']", "for c in m.content").
var contentLoop = regexp.MustCompile(`\bfor\s+\w+\s+in\s+\w+\s*(\.\s*content\b|\[\s*['"]content['"]\s*\])`)

// ContentFormat is how the template expects a message's content, as vLLM detects it: "openai"
// (a list of typed parts) when the template loops over a message's content, else "string" (the
// text parts joined by newlines).
func (t *Template) ContentFormat() string {
	for _, c := range []*compiled{t.main, t.toolUse} {
		if c != nil && contentLoop.MatchString(c.src) {
			return "openai"
		}
	}
	return "string"
}

func boolField(b *bool) (bool, bool) {
	if b == nil {
		return false, false
	}
	return *b, true
}

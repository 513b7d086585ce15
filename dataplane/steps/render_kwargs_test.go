package steps

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/render/tokenizer"
)

// kwargsModel is the test tokenizer with a template that prints the kwargs it is given.
func kwargsModel(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(localModel(t), "tokenizer.json"), filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	cfg, err := json.Marshal(map[string]any{"chat_template": `{% for m in messages %}{{ m.content }}{% endfor %}` +
		`{% if enable_thinking is defined %} think={{ enable_thinking }}{% endif %}{% if custom is defined %} custom={{ custom }}{% endif %}`})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestRenderTemplateKwargs: only the chat_template_kwargs in the step's allow list reach the
// template, the others are dropped (as vLLM drops the kwargs its template does not read), and a
// kwarg naming a variable the renderer sets is a 400 naming it.
func TestRenderTemplateKwargs(t *testing.T) {
	dir := kwargsModel(t)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		allow  []string // the step's chat_template_kwargs; nil for the default
		kwargs string
		want   string // the rendered text, or
		msg    string // the 400's message
	}{
		{"default list passes enable_thinking", nil, `{"enable_thinking": false}`, "hi think=False", ""},
		{"default list drops the rest", nil, `{"enable_thinking": true, "custom": "x"}`, "hi think=True", ""},
		{"an operator's list", []string{"custom"}, `{"enable_thinking": true, "custom": "x"}`, "hi custom=x", ""},
		{"an empty list drops all", []string{}, `{"enable_thinking": true}`, "hi", ""},
		{"reserved", nil, `{"add_generation_prompt": false}`, "", `"add_generation_prompt" cannot be set in chat_template_kwargs`},
		{"reserved even if listed", []string{"custom"}, `{"messages": []}`, "", `"messages" cannot be set in chat_template_kwargs`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			own := map[string]any{"tokenizer": dir}
			if tc.allow != nil {
				own["chat_template_kwargs"] = slices.Clone(tc.allow)
			}
			s, err := newLocalRender(t, own, builder.Deps{})
			if err != nil {
				t.Fatal(err)
			}
			rc, _ := newRC(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":`+tc.kwargs+`}`, nil)
			err = s.Execute(context.Background(), rc)
			if tc.msg != "" {
				e := apierror.From(err)
				if err == nil || e.Status != 400 || e.Param != "chat_template_kwargs" || !strings.Contains(e.Message, tc.msg) {
					t.Fatalf("err = %v (%d, param %q), want a 400 on chat_template_kwargs containing %q", err, e.Status, e.Param, tc.msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := tok.Encode(nil, tc.want, false); !slices.Equal(rc.TokenIDs(), want) {
				t.Fatalf("tokens %v, want those of %q: %v", rc.TokenIDs(), tc.want, want)
			}
		})
	}
}

// TestRenderTemplateKwargsParam: the allow list may not name a reserved variable.
func TestRenderTemplateKwargsParam(t *testing.T) {
	_, err := newLocalRender(t, map[string]any{"tokenizer": kwargsModel(t), "chat_template_kwargs": []any{"enable_thinking", "tools"}}, builder.Deps{})
	if err == nil || !strings.Contains(err.Error(), "chat_template_kwargs") || !strings.Contains(err.Error(), `"tools" cannot be a kwarg`) {
		t.Fatalf("err = %v, want a failure naming chat_template_kwargs and \"tools\"", err)
	}
}

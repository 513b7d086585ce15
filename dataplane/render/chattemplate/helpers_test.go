package chattemplate

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// modelDir writes files (name → content) into a fresh directory.
func modelDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// configJSON is a tokenizer_config.json with the given chat_template and extra fields.
func configJSON(t *testing.T, template any, extra map[string]any) string {
	t.Helper()
	cfg := map[string]any{"chat_template": template}
	for k, v := range extra {
		cfg[k] = v
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// loadInline loads a template given inline, with Qwen-like special tokens.
func loadInline(t *testing.T, template string) *Template {
	t.Helper()
	tmpl, err := Load(modelDir(t, map[string]string{"tokenizer_config.json": configJSON(t, template, map[string]any{
		"bos_token": "<s>", "eos_token": map[string]any{"__type": "AddedToken", "content": "</s>"}, "pad_token": "<pad>", "unk_token": nil,
		"additional_special_tokens": []string{"<a>", "<b>"},
	})}), "")
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return tmpl
}

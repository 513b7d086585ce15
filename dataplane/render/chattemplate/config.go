package chattemplate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// source is one chat template as found on disk.
type source struct {
	name string // "default", "tool_use", ...
	file string // where it came from, for errors
	text string
}

// tokenizerConfig is what Load reads from tokenizer_config.json.
type tokenizerConfig struct {
	ChatTemplate json.RawMessage
	AddBOSToken  *bool
	AddEOSToken  *bool
	Tokens       map[string]json.RawMessage // specialTokenKeys and additional_special_tokens
}

// specialTokenKeys are the special tokens HF passes to templates, in its order.
var specialTokenKeys = []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}

const additionalSpecialTokens = "additional_special_tokens"

// readJSONFile reads path into v; a missing file is reported with ok=false.
func readJSONFile(path string, v any) (ok bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	return true, nil
}

// readConfig reads dir/tokenizer_config.json and, over it as transformers does,
// dir/special_tokens_map.json.
func readConfig(dir string) (*tokenizerConfig, error) {
	path := filepath.Join(dir, "tokenizer_config.json")
	var raw map[string]json.RawMessage
	ok, err := readJSONFile(path, &raw)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%s: not found", path)
	}
	var cfg tokenizerConfig
	cfg.ChatTemplate = raw["chat_template"]
	for key, dst := range map[string]**bool{"add_bos_token": &cfg.AddBOSToken, "add_eos_token": &cfg.AddEOSToken} {
		if v, ok := raw[key]; ok && string(v) != "null" {
			if err := json.Unmarshal(v, dst); err != nil {
				return nil, fmt.Errorf("%s: %s: %w", path, key, err)
			}
		}
	}
	cfg.Tokens = map[string]json.RawMessage{}
	for _, key := range append(slices.Clone(specialTokenKeys), additionalSpecialTokens) {
		if v, ok := raw[key]; ok {
			cfg.Tokens[key] = v
		}
	}
	var overrides map[string]json.RawMessage
	if _, err := readJSONFile(filepath.Join(dir, "special_tokens_map.json"), &overrides); err != nil {
		return nil, err
	}
	for key, v := range overrides {
		if slices.Contains(specialTokenKeys, key) || key == additionalSpecialTokens {
			cfg.Tokens[key] = v
		}
	}
	return &cfg, nil
}

// specialTokens returns the special tokens that are set, and additional_special_tokens.
func (cfg *tokenizerConfig) specialTokens() (map[string]string, []string, error) {
	tokens := map[string]string{}
	var extra []string
	for key, raw := range cfg.Tokens {
		if key == additionalSpecialTokens {
			var err error
			if extra, err = tokenList(raw); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", key, err)
			}
			continue
		}
		content, err := tokenContent(raw)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", key, err)
		}
		if content != "" { // HF passes only the tokens that are set
			tokens[key] = content
		}
	}
	return tokens, extra, nil
}

func tokenList(raw json.RawMessage) ([]string, error) {
	var items []json.RawMessage
	if string(raw) == "null" {
		return nil, nil
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, errors.New("want a list of tokens")
	}
	out := make([]string, 0, len(items))
	for _, item := range items {
		s, err := tokenContent(item)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// tokenContent reads a special token: a string, null, or an AddedToken object {"content": ...}.
func tokenContent(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
		return "", fmt.Errorf("want a string or an object with a content string, got %.80s", raw)
	}
	return *obj.Content, nil
}

// readSources finds the chat templates, in transformers' precedence: dir/chat_template.jinja,
// else dir/chat_template.json, else tokenizer_config.json's chat_template (a string, or a list of
// {name, template}); plus dir/additional_chat_templates/NAME.jinja.
func readSources(dir string, cfg *tokenizerConfig) ([]source, error) {
	var srcs []source
	jinjaPath := filepath.Join(dir, "chat_template.jinja")
	jsonPath := filepath.Join(dir, "chat_template.json")
	if data, err := os.ReadFile(jinjaPath); err == nil {
		srcs = append(srcs, source{name: "default", file: jinjaPath, text: string(data)})
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	} else {
		var wrapped struct {
			ChatTemplate json.RawMessage `json:"chat_template"`
		}
		ok, err := readJSONFile(jsonPath, &wrapped)
		if err != nil {
			return nil, err
		}
		raw, file := cfg.ChatTemplate, filepath.Join(dir, "tokenizer_config.json")
		if ok {
			raw, file = wrapped.ChatTemplate, jsonPath
		}
		if srcs, err = parseTemplateField(raw, file); err != nil {
			return nil, err
		}
	}
	extra, err := filepath.Glob(filepath.Join(dir, "additional_chat_templates", "*.jinja"))
	if err != nil {
		return nil, err
	}
	for _, path := range extra {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		name := strings.TrimSuffix(filepath.Base(path), ".jinja")
		srcs = slices.DeleteFunc(srcs, func(s source) bool { return s.name == name })
		srcs = append(srcs, source{name: name, file: path, text: string(data)})
	}
	return srcs, nil
}

// parseTemplateField reads a chat_template value: a string or a list of {name, template}.
func parseTemplateField(raw json.RawMessage, file string) ([]source, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return []source{{name: "default", file: file, text: s}}, nil
	}
	var list []struct {
		Name     *string `json:"name"`
		Template *string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("%s: chat_template: want a string or a list of {name, template}", file)
	}
	var srcs []source
	for i, e := range list {
		if e.Name == nil || e.Template == nil {
			return nil, fmt.Errorf("%s: chat_template[%d]: want {name, template}", file, i)
		}
		srcs = append(srcs, source{name: *e.Name, file: fmt.Sprintf("%s (chat_template %q)", file, *e.Name), text: *e.Template})
	}
	return srcs, nil
}

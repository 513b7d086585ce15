package render

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/epd-dev/coordinator/dataplane/render/chattemplate"
	"github.com/epd-dev/coordinator/dataplane/render/tokenizer"
	"github.com/epd-dev/coordinator/dataplane/state/body"
)

// fixture is a model directory: the qwen-like test tokenizer and a ChatML template (string
// content, tools through tojson, a raise_exception for a leading tool message).
const fixture = "testdata/chatml"

// modelDir copies the fixture into a fresh directory, with template instead of its own when set.
func modelDir(t *testing.T, template string) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		data, err := os.ReadFile(filepath.Join(fixture, name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "tokenizer_config.json" && template != "" {
			data, _ = json.Marshal(map[string]any{"chat_template": template, "eos_token": "<|im_end|>"})
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func open(t *testing.T, dir string, o Options) *Model {
	t.Helper()
	m, err := Open(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// TestChat: a conversation renders to the ids of its template's text, as the tokenizer encodes
// it, with the request's switches.
func TestChat(t *testing.T) {
	dir := modelDir(t, "")
	m := open(t, dir, Options{})
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  ChatRequest
		text string // what the template must have rendered
	}{
		{"a turn and the generation prompt", ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":"hello there"}]`), AddGenerationPrompt: true},
			"<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"},
		{"no generation prompt", ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":"hi"}]`)},
			"<|im_start|>user\nhi<|im_end|>\n"},
		{"text parts joined by newlines", ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b\u00e9"}]}]`)},
			"<|im_start|>user\na\nbé<|im_end|>\n"},
		{"tools in the client's key order; arguments decoded", ChatRequest{
			Messages: json.RawMessage(`[{"role":"user","content":"w?"},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"z\": 1, \"a\": [true]}"}}]}]`),
			Tools:    json.RawMessage(`[{"type":"function","function":{"name":"f","parameters":{"z":{},"a":{}}}}]`)},
			"<|im_start|>system\n{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"z\": {}, \"a\": {}}}}\n<|im_end|>\n" +
				"<|im_start|>user\nw?<|im_end|>\n<|im_start|>assistant\n<tool_call>{\"z\": 1, \"a\": [true]}<|im_end|>\n"},
		{"special tokens added when asked", ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), AddSpecialTokens: true},
			"<|im_start|>user\nx<|im_end|>\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := m.Chat(nil, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			want := tok.Encode(nil, tc.text, tc.req.AddSpecialTokens)
			if !slices.Equal(got, want) {
				t.Fatalf("ids %v\nwant %v (the ids of %q)", got, want, tc.text)
			}
		})
	}
}

// TestChatErrors: what a client gets wrong is an error of the client's, naming it.
func TestChatErrors(t *testing.T) {
	m := open(t, modelDir(t, ""), Options{})
	tests := map[string]struct {
		req  ChatRequest
		want string
	}{
		"not an array":             {ChatRequest{Messages: json.RawMessage(`{"role":"user"}`)}, "messages must be an array"},
		"a message not an object":  {ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":"a"},7]`)}, "messages[1] must be an object"},
		"an image part":            {ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,"}}]}]`)}, `messages[0].content[0]: a "image_url" part`},
		"a text part without text": {ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":[{"type":"text"}]}]`)}, "messages[0].content[0].text must be a string"},
		"arguments not JSON":       {ChatRequest{Messages: json.RawMessage(`[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{oops"}}]}]`)}, "messages[0].tool_calls[0].function.arguments is not JSON"},
		"the template refuses":     {ChatRequest{Messages: json.RawMessage(`[{"role":"tool","content":"r"}]`)}, "a tool message cannot come first"},
		"a reserved kwarg":         {ChatRequest{Messages: json.RawMessage(`[]`), Kwargs: map[string]json.RawMessage{"messages": json.RawMessage(`[]`)}}, `kwarg "messages" is reserved`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := m.Chat(nil, tc.req)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	var te *chattemplate.TemplateError
	if _, err := m.Chat(nil, ChatRequest{Messages: json.RawMessage(`[{"role":"tool","content":"r"}]`)}); !errors.As(err, &te) {
		t.Fatalf("a template's raise_exception is %T, want *chattemplate.TemplateError", err)
	}
}

// TestTemplateMessages: the conversion vLLM applies before a template sees the messages, that
// untouched messages are passed as they are (no copy), the converted array's elements, and that
// a converted conversation converts to itself.
func TestTemplateMessages(t *testing.T) {
	tests := map[string]struct {
		in, format, want string
	}{
		"strings pass as they are": {in: `[{"role":"user","content":"a"}, {"role":"assistant","content":"b"}]`, format: "string", want: `[{"role":"user","content":"a"}, {"role":"assistant","content":"b"}]`},
		"parts joined, keys in order": {in: `[{"role":"user","content":"a"},{"content":[{"type":"text","text":"x"},{"type":"text","text":"y"}],"role":"user","name":"n"}]`, format: "string",
			want: `[{"role":"user","content":"a"},{"content":"x\ny","role":"user","name":"n"}]`},
		"parts kept for an openai-format template": {in: `[{"role":"user","content":[{"type":"text","text":"x"}]}]`, format: "openai", want: `[{"role":"user","content":[{"type":"text","text":"x"}]}]`},
		"null and absent content":                  {in: `[{"role":"assistant","content":null},{"role":"assistant"}]`, format: "string", want: `[{"role":"assistant","content":""},{"role":"assistant","content":""}]`},
		"arguments: a string, empty, absent, an object": {in: `[{"role":"assistant","content":"","tool_calls":[{"function":{"name":"a","arguments":"{\"k\":[1]}"}},{"function":{"name":"b","arguments":""}},{"function":{"name":"c"}},{"function":{"name":"d","arguments":{"o":1}}}]}]`, format: "string",
			want: `[{"role":"assistant","content":"","tool_calls":[{"function":{"name":"a","arguments":{"k":[1]}}},{"function":{"name":"b","arguments":{}}},{"function":{"name":"c","arguments":{}}},{"function":{"name":"d","arguments":{"o":1}}}]}]`},
		"only an assistant's tool calls are decoded": {in: `[{"role":"user","content":"","tool_calls":[{"function":{"name":"a","arguments":"{}"}}]}]`, format: "string",
			want: `[{"role":"user","content":"","tool_calls":[{"function":{"name":"a","arguments":"{}"}}]}]`},
		"changed between unchanged ones": {in: `[{"role":"user","content":"a"}, {"role":"assistant","content":null}, {"role":"user","content":"b"},{"role":"user"}]`, format: "string",
			want: `[{"role":"user","content":"a"}, {"role":"assistant","content":""},{"role":"user","content":"b"},{"role":"user","content":""}]`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := []byte(tc.in)
			got, items, err := convertMessages(in, nil, tc.format, true, nil)
			if err != nil {
				t.Fatal(err)
			}
			// The elements split by a caller (the media scan) convert as the array does; a split
			// of other bytes is not used.
			split, _ := body.Array(in)
			foreign, _ := body.Array([]byte(tc.in))
			for _, sp := range [][]json.RawMessage{split, foreign} {
				if again, _, err := convertMessages(in, sp, tc.format, true, nil); err != nil || string(again) != string(got) {
					t.Fatalf("converted from a split: %s, %v; want %s", again, err, got)
				}
			}
			// A converted message converts to itself (what lets a message the cache holds skip
			// the conversion): converting again, or with every message known, changes nothing.
			for _, known := range []func([]byte) bool{nil, func([]byte) bool { return true }} {
				again, _, err := convertMessages(got, nil, tc.format, true, known)
				if err != nil || string(again) != string(got) {
					t.Fatalf("converted again: %s, %v; want %s", again, err, got)
				}
			}
			if string(got) != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
			// The elements returned are the converted array's, in order.
			var want []string
			for _, m := range body.Objects(got) {
				want = append(want, string(m))
			}
			if fmt.Sprintf("%q", items) != fmt.Sprintf("%q", want) {
				t.Fatalf("elements %q, want %q", items, want)
			}
			if tc.in == tc.want && &got[0] != &in[0] {
				t.Fatal("an unchanged conversation was copied")
			}
		})
	}
}

// TestShared: a directory is loaded once while its files are unchanged, and again when they
// change; the last Close unloads it.
func TestShared(t *testing.T) {
	dir := modelDir(t, "")
	a, err := Open(dir, Options{CacheBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	b := open(t, dir, Options{CacheBytes: 1 << 20})
	if a != b {
		t.Fatal("the same files and options were loaded twice")
	}
	if c := open(t, dir, Options{}); c == a {
		t.Fatal("other options shared a model")
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"chat_template":"{{ messages[0].content }}"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	d := open(t, dir, Options{CacheBytes: 1 << 20})
	if d == a {
		t.Fatal("changed files were not loaded again")
	}
	a.Close()
	loaded.mu.Lock()
	_, still := loaded.m[b.key]
	loaded.mu.Unlock()
	if !still || b.refs != 1 {
		t.Fatalf("closing one of two holders unloaded the model (refs %d)", b.refs)
	}
}

// TestOpenErrors name the file at fault.
func TestOpenErrors(t *testing.T) {
	dir := modelDir(t, "")
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"chat_template":"{{ messages | nosuchfilter }}"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, Options{}); err == nil || !strings.Contains(err.Error(), "tokenizer_config.json") {
		t.Fatalf("err %v, want one naming tokenizer_config.json", err)
	}
	if _, err := Open(t.TempDir(), Options{}); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Fatalf("an empty directory: err %v", err)
	}
}

// TestCache: a multi-turn conversation sent again with one more turn finds its earlier messages
// in the cache, and the ids are the same as without a cache.
func TestCache(t *testing.T) {
	dir := modelDir(t, "")
	cached := open(t, dir, Options{CacheBytes: 1 << 20})
	plain := open(t, dir, Options{})
	long := strings.Repeat("a long message that is worth caching, ", 20)
	turn1 := `[{"role":"user","content":"` + long + `"},{"role":"assistant","content":"` + long + `ok"}]`
	turn2 := strings.TrimSuffix(turn1, "]") + `,{"role":"user","content":"and then?"}]`
	for i, msgs := range []string{turn1, turn2} {
		req := ChatRequest{Messages: json.RawMessage(msgs), AddGenerationPrompt: true}
		got, err := cached.Chat(nil, req)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := plain.Chat(nil, req)
		if !slices.Equal(got, want) {
			t.Fatalf("turn %d: cached ids differ from uncached", i+1)
		}
	}
	hits, misses, bytes := cached.CacheStats()
	if hits < 2 || misses == 0 || bytes == 0 {
		t.Fatalf("cache hits %d misses %d bytes %d: the second turn should find the first two messages", hits, misses, bytes)
	}
}

// TestCollector: the caches of the loaded models are exported by directory, and an unloaded
// model's series go away.
func TestCollector(t *testing.T) {
	dir := modelDir(t, "")
	m, err := Open(dir, Options{CacheBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("worth caching ", 40)
	req := ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":"` + long + `"}]`)}
	for range 2 {
		if _, err := m.Chat(nil, req); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(Collector("coordinator"))
	want := `
# HELP coordinator_render_cache_hits_total Segments of rendered prompts (text between special tokens) found in the in-process renderer's cache.
# TYPE coordinator_render_cache_hits_total counter
coordinator_render_cache_hits_total{tokenizer="` + dir + `"} 1
# HELP coordinator_render_cache_misses_total Segments of rendered prompts encoded because the cache did not hold them.
# TYPE coordinator_render_cache_misses_total counter
coordinator_render_cache_misses_total{tokenizer="` + dir + `"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "coordinator_render_cache_hits_total", "coordinator_render_cache_misses_total"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "coordinator_render_cache_bytes"); err != nil || n != 1 {
		t.Fatalf("bytes series: %d, %v", n, err)
	}
	m.Close()
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Fatalf("%d series after the model was unloaded, %v", n, err)
	}
}

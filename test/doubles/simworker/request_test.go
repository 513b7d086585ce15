package simworker

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// mustJSON encodes v.
func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRequestPromptKey(t *testing.T) {
	text := "the quick brown fox"
	chatIDs := []int{BOSTokenID, UserTokenID, WordTokenID("the"), WordTokenID("quick"), WordTokenID("brown"), WordTokenID("fox")}
	chatKey := PromptKey(chatIDs)
	promptKey := PromptKey(TokenizePrompt(text))
	imgMsgs := func(uuid string) []obj {
		return []obj{{"role": "user", "content": []obj{
			{"type": "text", "text": "look"},
			{"type": "image_url", "image_url": obj{"url": dataURL([]byte("png"))}, "uuid": uuid},
		}}}
	}
	tests := []struct {
		name string
		path string
		body any
		want string
	}{
		{"chat text", PathChatCompletions, userChat(text, nil), chatKey},
		{"chat ignores sampling", PathChatCompletions, userChat(text, obj{"max_tokens": 7, "temperature": 0.3, "stream": true}), chatKey},
		{"chat ignores kv params", PathChatCompletions, userChat(text, obj{"kv_transfer_params": obj{"do_remote_decode": true}}), chatKey},
		{"chat with tokens", PathChatCompletions, userChat("other words", obj{"tokens": obj{"token_ids": chatIDs}}), chatKey},
		{"chat ignores uuid", PathChatCompletions, obj{"messages": imgMsgs("x")}, mustKey(t, PathChatCompletions, obj{"messages": imgMsgs("y")})},
		{"completion text", PathCompletions, completion(text, obj{"max_tokens": 3}), promptKey},
		{"completion tokens", PathCompletions, completion(TokenizePrompt(text), nil), promptKey},
		{"generate", PathGenerate, generate(TokenizePrompt(text), obj{"max_tokens": 1}, nil), promptKey},
		{"generate ignores extra args", PathGenerate, generate(TokenizePrompt(text), obj{"max_tokens": 9, "extra_args": obj{"kv_transfer_params": obj{"do_remote_prefill": true}}}, nil), promptKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := RequestPromptKey(tt.path, mustJSON(t, tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("key = %s, want %s", got, tt.want)
			}
		})
	}
	if chatKey == promptKey {
		t.Error("chat and completion keys of the same text should differ (role token)")
	}
	if _, err := RequestPromptKey("/v1/models", []byte(`{}`)); err == nil {
		t.Error("RequestPromptKey accepted a non-inference path")
	}
}

// mustKey computes a request's prompt key.
func mustKey(t *testing.T, path string, body any) string {
	t.Helper()
	k, err := RequestPromptKey(path, mustJSON(t, body))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestParseInferenceErrors(t *testing.T) {
	tests := []struct {
		name    string
		kind    apiKind
		body    string
		wantErr string
	}{
		{"chat invalid json", kindChat, `{`, "invalid JSON"},
		{"chat no messages", kindChat, `{"model":"m"}`, "messages is required"},
		{"chat bad max_tokens", kindChat, `{"messages":[{"role":"user","content":"a"}],"max_tokens":0}`, "max_tokens must be between"},
		{"chat bad max_completion_tokens", kindChat, `{"messages":[{"role":"user","content":"a"}],"max_completion_tokens":-1}`, "max_completion_tokens must be between"},
		{"completion no prompt", kindCompletion, `{"model":"m"}`, "prompt is required"},
		{"completion object prompt", kindCompletion, `{"prompt":{"a":1}}`, "prompt must be a string"},
		{"completion empty token prompt", kindCompletion, `{"prompt":[]}`, "prompt must be a string"},
		{"generate no tokens", kindGenerate, `{"sampling_params":{}}`, "token_ids is required"},
		{"generate no sampling", kindGenerate, `{"token_ids":[1]}`, "sampling_params is required"},
		{"generate bad max", kindGenerate, `{"token_ids":[1],"sampling_params":{"max_tokens":0}}`, "sampling_params.max_tokens must be between"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseInference(tt.kind, []byte(tt.body))
			if err == nil || err.status != http.StatusBadRequest || !strings.Contains(err.msg, tt.wantErr) {
				t.Fatalf("err = %v, want 400 containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestLeg(t *testing.T) {
	tests := []struct {
		name    string
		kind    apiKind
		body    string
		want    leg
		wantErr string
	}{
		{"no params", kindChat, `{"messages":[{"role":"user","content":"a"}]}`, legLocal, ""},
		{"null params", kindChat, `{"messages":[{"role":"user","content":"a"}],"kv_transfer_params":null}`, legLocal, ""},
		{"prefill leg", kindChat, `{"messages":[{"role":"user","content":"a"}],"kv_transfer_params":{"do_remote_decode":true}}`, legPrefill, ""},
		{"remote prefill", kindCompletion, `{"prompt":"a","kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false}}`, legRemotePrefill, ""},
		{"both false", kindCompletion, `{"prompt":"a","kv_transfer_params":{"do_remote_prefill":false}}`, legLocal, ""},
		{"generate extra args", kindGenerate, `{"token_ids":[1],"sampling_params":{"extra_args":{"kv_transfer_params":{"do_remote_decode":true}}}}`, legPrefill, ""},
		{"generate top-level fallback", kindGenerate, `{"token_ids":[1],"sampling_params":{},"kv_transfer_params":{"do_remote_prefill":true}}`, legRemotePrefill, ""},
		{"non-boolean", kindChat, `{"messages":[{"role":"user","content":"a"}],"kv_transfer_params":{"do_remote_decode":"yes"}}`, 0, "must be a boolean"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, perr := parseInference(tt.kind, []byte(tt.body))
			if perr != nil {
				t.Fatal(perr)
			}
			got, err := in.leg()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.msg, tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("leg = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestPreferIfAvailable(t *testing.T) {
	tests := []struct {
		values []string
		want   bool
	}{
		{nil, false},
		{[]string{"if-available"}, true},
		{[]string{"If-Available"}, true},
		{[]string{"respond-async, if-available"}, true},
		{[]string{"wait=10", "IF-AVAILABLE; foo=bar"}, true},
		{[]string{"if-available=true"}, true},
		{[]string{"if-availables"}, false},
		{[]string{"return=minimal"}, false},
	}
	for _, tt := range tests {
		h := http.Header{}
		for _, v := range tt.values {
			h.Add("Prefer", v)
		}
		if got := PreferIfAvailable(h); got != tt.want {
			t.Errorf("PreferIfAvailable(%q) = %v, want %v", tt.values, got, tt.want)
		}
	}
}

func TestOutputCycling(t *testing.T) {
	in := &inference{words: []string{"a", "b", "c"}, promptIDs: []int{BOSTokenID, 7, ImageTokenID, 8}}
	if got := strings.Join(in.outputWords(7), " "); got != "a b c a b c a" {
		t.Errorf("outputWords = %q", got)
	}
	if got := in.outputTokenIDs(5); len(got) != 5 || got[0] != 7 || got[1] != 8 || got[2] != 7 {
		t.Errorf("outputTokenIDs = %v", got)
	}
	empty := &inference{}
	if got := empty.outputWords(2); got[0] != fallbackWord || got[1] != fallbackWord {
		t.Errorf("fallback words = %v", got)
	}
	if got := empty.outputTokenIDs(1); got[0] != WordTokenID(fallbackWord) {
		t.Errorf("fallback ids = %v", got)
	}
}

package simworker

import (
	"bytes"
	"encoding/base64"
	"slices"
	"testing"
)

func TestWordTokenID(t *testing.T) {
	for _, word := range []string{"hello", "world", "", "ünïcode", "a-very-long-word-with-dashes"} {
		id := WordTokenID(word)
		if id < 100 || id >= 30100 {
			t.Errorf("WordTokenID(%q) = %d, out of [100, 30100)", word, id)
		}
		if id != WordTokenID(word) {
			t.Errorf("WordTokenID(%q) is not deterministic", word)
		}
	}
	// fnv32a("hello") = 0x4f9f2cab = 1335831723; 1335831723 % 30000 = 1723.
	if got, want := WordTokenID("hello"), 100+1335831723%30000; got != want {
		t.Errorf("WordTokenID(hello) = %d, want %d", got, want)
	}
}

func TestTokenize(t *testing.T) {
	tests := []struct {
		name       string
		text       string
		wantText   []int
		wantPrompt []int
	}{
		{"empty", "", []int{}, []int{BOSTokenID}},
		{"whitespace", " \t\n ", []int{}, []int{BOSTokenID}},
		{"words", "hello  world\nhello", []int{WordTokenID("hello"), WordTokenID("world"), WordTokenID("hello")},
			[]int{BOSTokenID, WordTokenID("hello"), WordTokenID("world"), WordTokenID("hello")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := TokenizeText(tt.text); !slices.Equal(got, tt.wantText) {
				t.Errorf("TokenizeText = %v, want %v", got, tt.wantText)
			}
			if got := TokenizePrompt(tt.text); !slices.Equal(got, tt.wantPrompt) {
				t.Errorf("TokenizePrompt = %v, want %v", got, tt.wantPrompt)
			}
		})
	}
}

func TestRoleTokenID(t *testing.T) {
	tests := map[string]int{"system": 3, "user": 4, "assistant": 5, "tool": 6, "developer": 6, "": 6}
	for role, want := range tests {
		if got := RoleTokenID(role); got != want {
			t.Errorf("RoleTokenID(%q) = %d, want %d", role, got, want)
		}
	}
}

func TestPromptKey(t *testing.T) {
	a := PromptKey([]int{1, 2, 3})
	tests := []struct {
		name string
		ids  []int
		same bool
	}{
		{"identical", []int{1, 2, 3}, true},
		{"reordered", []int{3, 2, 1}, false},
		{"prefix", []int{1, 2}, false},
		{"longer", []int{1, 2, 3, 0}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := PromptKey(tt.ids) == a; got != tt.same {
				t.Errorf("PromptKey(%v) == PromptKey([1 2 3]) is %v, want %v", tt.ids, got, tt.same)
			}
		})
	}
	if len(a) != 64 {
		t.Errorf("PromptKey length %d, want 64 hex digits", len(a))
	}
	// SHA-256 of the empty input.
	if got := PromptKey(nil); got != "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" {
		t.Errorf("PromptKey(nil) = %s", got)
	}
}

func TestImageBytes(t *testing.T) {
	payload := []byte{0x89, 'P', 'N', 'G', 0, 1, 2}
	b64 := base64.StdEncoding.EncodeToString(payload)
	tests := []struct {
		name    string
		url     string
		want    []byte
		wantErr bool
	}{
		{"data url", "data:image/png;base64," + b64, payload, false},
		{"unpadded data url", "data:image/png;base64," + base64.RawStdEncoding.EncodeToString(payload), payload, false},
		{"http url", "http://example.com/cat.png", []byte("http://example.com/cat.png"), false},
		{"non-base64 data url", "data:text/plain,hello", []byte("data:text/plain,hello"), false},
		{"invalid base64", "data:image/png;base64,!!!", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ImageBytes(tt.url)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if !bytes.Equal(got, tt.want) {
				t.Errorf("ImageBytes = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestImageFeatures(t *testing.T) {
	tests := []struct {
		n          int
		wantTokens int
	}{{0, 4}, {1, 5}, {60, 64}, {61, 4}, {1000, 4 + 1000%61}}
	for _, tt := range tests {
		b := bytes.Repeat([]byte{7}, tt.n)
		if got := ImageTokenCount(b); got != tt.wantTokens {
			t.Errorf("ImageTokenCount(%d bytes) = %d, want %d", tt.n, got, tt.wantTokens)
		}
		blob := ImageKwargsBlob(b)
		if len(blob) != ImageKwargsSize(tt.n) || len(blob) != 4096+3*tt.n {
			t.Errorf("ImageKwargsBlob(%d bytes) has %d bytes", tt.n, len(blob))
		}
		if !bytes.Equal(blob, ImageKwargsBlob(b)) {
			t.Errorf("ImageKwargsBlob is not deterministic")
		}
	}
	if ImageHash([]byte("a")) == ImageHash([]byte("b")) {
		t.Error("ImageHash collides")
	}
	if bytes.Equal(ImageKwargsBlob([]byte("a")), ImageKwargsBlob([]byte("b"))) {
		t.Error("ImageKwargsBlob does not depend on the image")
	}
}

// cache_salt partitions the prompt key, as vLLM's salt partitions its prefix cache.
func TestSaltedPromptKey(t *testing.T) {
	body := func(salt string) []byte {
		if salt == "" {
			return []byte(`{"model":"m","prompt":"same words"}`)
		}
		return []byte(`{"model":"m","prompt":"same words","cache_salt":"` + salt + `"}`)
	}
	keys := map[string]string{}
	for _, salt := range []string{"", "a", "b"} {
		k, err := RequestPromptKey("/v1/completions", body(salt))
		if err != nil {
			t.Fatal(err)
		}
		for other, ok := range keys {
			if ok == k {
				t.Fatalf("salts %q and %q share the key %s", other, salt, k)
			}
		}
		keys[salt] = k
		if again, _ := RequestPromptKey("/v1/completions", body(salt)); again != k {
			t.Fatalf("salt %q: key %s then %s", salt, k, again)
		}
	}
	if _, err := RequestPromptKey("/v1/completions", []byte(`{"prompt":"x","cache_salt":5}`)); err == nil {
		t.Fatal("a cache_salt that is not a string is accepted")
	}
}

package simworker

import (
	"encoding/base64"
	"slices"
	"strings"
	"testing"
)

func TestChatRenderEndpoint(t *testing.T) {
	for _, role := range []Role{RolePrefill, RoleDecode, RoleBoth, RoleEncode} {
		t.Run(string(role), func(t *testing.T) {
			w := startWorker(t, Config{Role: role})

			text := post(t, w, PathChatRender, userChat("hello world", obj{"model": "m", "max_completion_tokens": 5, "temperature": 0.5, "stream": true}))
			mustStatus(t, text, 200)
			for _, want := range []string{`"mm_hashes":{"image":[]}`, `"mm_placeholders":{"image":[]}`, `"kwargs_data":{"image":[]}`, `"stream":false`, `"request_id":"render-`} {
				if !strings.Contains(string(text.body), want) {
					t.Errorf("text render %s lacks %s", text.body, want)
				}
			}
			got := decode[RenderResult](t, text.body)
			if want := []int{BOSTokenID, UserTokenID, WordTokenID("hello"), WordTokenID("world")}; !slices.Equal(got.TokenIDs, want) {
				t.Errorf("token_ids = %v, want %v", got.TokenIDs, want)
			}
			if got.Model != "m" || got.SamplingParams["max_tokens"] != 5.0 || got.SamplingParams["temperature"] != 0.5 {
				t.Errorf("render = %+v", got)
			}

			img1, img2 := []byte("first image"), slices.Repeat([]byte("second"), 40)
			body := obj{"messages": []obj{{"role": "user", "content": []obj{
				{"type": "image_url", "image_url": obj{"url": dataURL(img1)}},
				{"type": "text", "text": "compare"},
				{"type": "image_url", "image_url": obj{"url": dataURL(img2)}},
			}}}}
			mm := post(t, w, PathChatRender, body)
			mustStatus(t, mm, 200)
			res := decode[RenderResult](t, mm.body)
			l1, l2 := ImageTokenCount(img1), ImageTokenCount(img2)
			wantIDs := slices.Concat([]int{BOSTokenID, UserTokenID}, placeholders(l1), []int{WordTokenID("compare")}, placeholders(l2))
			if !slices.Equal(res.TokenIDs, wantIDs) {
				t.Errorf("token_ids = %v, want %v", res.TokenIDs, wantIDs)
			}
			f := res.Features
			if !slices.Equal(f.MMHashes["image"], []string{ImageHash(img1), ImageHash(img2)}) {
				t.Errorf("mm_hashes = %v", f.MMHashes)
			}
			if want := []RenderPlaceholder{{2, l1}, {3 + l1, l2}}; !slices.Equal(f.MMPlaceholders["image"], want) {
				t.Errorf("mm_placeholders = %v, want %v", f.MMPlaceholders, want)
			}
			if res.Model != "sim-model" {
				t.Errorf("model = %q", res.Model)
			}
			for i, img := range [][]byte{img1, img2} {
				blob, err := base64.StdEncoding.DecodeString(f.KwargsData["image"][i])
				if err != nil || string(blob) != string(ImageKwargsBlob(img)) {
					t.Errorf("kwargs_data[%d] is not ImageKwargsBlob (err %v)", i, err)
				}
			}
		})
	}
}

func TestRenderErrors(t *testing.T) {
	w := startWorker(t, Config{})
	tests := []struct {
		name    string
		path    string
		body    string
		wantMsg string
	}{
		{"chat invalid json", PathChatRender, `{"messages":`, "invalid JSON"},
		{"chat not object", PathChatRender, `[1]`, "invalid JSON"},
		{"chat no messages", PathChatRender, `{}`, "messages is required"},
		{"chat bad part", PathChatRender, `{"messages":[{"role":"user","content":[{"type":"video"}]}]}`, "unsupported content part"},
		{"completion invalid json", PathCompletionRender, `nope`, "invalid JSON"},
		{"completion token prompt", PathCompletionRender, `{"prompt":[1,2]}`, "prompt must be a string"},
		{"completion missing prompt", PathCompletionRender, `{}`, "prompt must be a string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := post(t, w, tt.path, tt.body)
			mustStatus(t, r, 400)
			e := decode[ErrorBody](t, r.body).Error
			if e.Type != "BadRequestError" || e.Code != 400 || !strings.Contains(e.Message, tt.wantMsg) {
				t.Errorf("error = %+v, want message containing %q", e, tt.wantMsg)
			}
			if !strings.Contains(string(r.body), `"param":null`) {
				t.Errorf("error body %s lacks param:null", r.body)
			}
		})
	}
}

func TestCompletionRenderEndpoint(t *testing.T) {
	w := startWorker(t, Config{Role: RoleDecode})
	r := post(t, w, PathCompletionRender, completion("one two  three", obj{"max_tokens": 4, "seed": 3}))
	mustStatus(t, r, 200)
	if !strings.HasPrefix(string(r.body), "[") || !strings.Contains(string(r.body), `"features":null`) {
		t.Errorf("body %s is not a one-element array with null features", r.body)
	}
	got := decode[[]RenderResult](t, r.body)
	if len(got) != 1 {
		t.Fatalf("got %d results", len(got))
	}
	if want := TokenizePrompt("one two three"); !slices.Equal(got[0].TokenIDs, want) {
		t.Errorf("token_ids = %v, want %v", got[0].TokenIDs, want)
	}
	if got[0].SamplingParams["max_tokens"] != 4.0 || got[0].SamplingParams["seed"] != 3.0 || got[0].Features != nil {
		t.Errorf("result = %+v", got[0])
	}
}

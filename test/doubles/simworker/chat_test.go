package simworker

import (
	"encoding/base64"
	"slices"
	"strings"
	"testing"
)

// placeholders returns n image placeholder tokens.
func placeholders(n int) []int { return slices.Repeat([]int{ImageTokenID}, n) }

// dataURL returns a base64 data URL of b.
func dataURL(b []byte) string { return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b) }

func TestRenderChat(t *testing.T) {
	img := []byte("fake image bytes")
	hi, there := WordTokenID("hi"), WordTokenID("there")
	tests := []struct {
		name       string
		messages   string
		wantIDs    []int
		wantImages []RenderedMedia
		wantLast   string
		wantErr    string
	}{
		{
			name:     "string contents and roles",
			messages: `[{"role":"system","content":"hi"},{"role":"user","content":"hi there"},{"role":"assistant","content":"there"},{"role":"tool","content":"hi"}]`,
			wantIDs:  []int{BOSTokenID, SystemTokenID, hi, UserTokenID, hi, there, AssistantTokenID, there, OtherRoleTokenID, hi},
			wantLast: "hi there",
		},
		{
			name:     "null content",
			messages: `[{"role":"assistant","content":null},{"role":"user","content":"hi"}]`,
			wantIDs:  []int{BOSTokenID, AssistantTokenID, UserTokenID, hi},
			wantLast: "hi",
		},
		{
			name:       "text and data-url image parts, uuid ignored",
			messages:   `[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"` + dataURL(img) + `"},"uuid":"abc"},{"type":"text","text":"there"}]}]`,
			wantIDs:    slices.Concat([]int{BOSTokenID, UserTokenID, hi}, placeholders(ImageTokenCount(img)), []int{there}),
			wantImages: []RenderedMedia{{Hash: ImageHash(img), Offset: 3, Length: ImageTokenCount(img), Bytes: img}},
			wantLast:   "hi there",
		},
		{
			name:       "http image url uses the url bytes",
			messages:   `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/a.png"}}]}]`,
			wantIDs:    slices.Concat([]int{BOSTokenID, UserTokenID}, placeholders(ImageTokenCount([]byte("http://x/a.png")))),
			wantImages: []RenderedMedia{{Hash: ImageHash([]byte("http://x/a.png")), Offset: 2, Length: ImageTokenCount([]byte("http://x/a.png")), Bytes: []byte("http://x/a.png")}},
		},
		{name: "missing", messages: ``, wantErr: "messages is required"},
		{name: "null", messages: `null`, wantErr: "messages is required"},
		{name: "empty", messages: `[]`, wantErr: "must not be empty"},
		{name: "not an array", messages: `{"role":"user"}`, wantErr: "must be an array"},
		{name: "bad content", messages: `[{"role":"user","content":42}]`, wantErr: "messages[0].content"},
		{name: "unknown part", messages: `[{"role":"user","content":[{"type":"image_embeds"}]}]`, wantErr: "unsupported content part type"},
		{name: "input_audio without data", messages: `[{"role":"user","content":[{"type":"input_audio","input_audio":{"format":"wav"}}]}]`, wantErr: "input_audio part without input_audio.data"},
		{name: "video without url", messages: `[{"role":"user","content":[{"type":"video_url","video_url":{}}]}]`, wantErr: "video_url part without video_url.url"},
		{name: "image without url", messages: `[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]`, wantErr: "without image_url.url"},
		{name: "text without text", messages: `[{"role":"user","content":[{"type":"text"}]}]`, wantErr: "text part without text"},
		{name: "bad base64", messages: `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,@@"}}]}]`, wantErr: "invalid base64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := RenderChat([]byte(tt.messages))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.TokenIDs, tt.wantIDs) {
				t.Errorf("TokenIDs = %v, want %v", got.TokenIDs, tt.wantIDs)
			}
			if len(got.Images) != len(tt.wantImages) {
				t.Fatalf("Images = %+v, want %+v", got.Images, tt.wantImages)
			}
			for i, want := range tt.wantImages {
				g := got.Images[i]
				if g.Hash != want.Hash || g.Offset != want.Offset || g.Length != want.Length || string(g.Bytes) != string(want.Bytes) {
					t.Errorf("Images[%d] = %+v, want %+v", i, g, want)
				}
			}
			if got.LastUserText != tt.wantLast {
				t.Errorf("LastUserText = %q, want %q", got.LastUserText, tt.wantLast)
			}
		})
	}
}

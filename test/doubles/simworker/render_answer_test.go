package simworker

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http/httptest"
	"testing"
)

// TestWriteRenderMatchesEncodingJSON checks the streamed render answer
// byte for byte against encoding/json marshaling the RenderResult.
func TestWriteRenderMatchesEncodingJSON(t *testing.T) {
	img1, img2 := randomBytes(5000), []byte("http://x/y.png")
	images := []chatImage{
		{offset: 2, size: len(img1), sum: sha256.Sum256(img1)},
		{offset: 12, size: len(img2), sum: sha256.Sum256(img2)},
	}
	sampling := map[string]any{"max_tokens": json.RawMessage(`5`), "stop": json.RawMessage(`[ "<b>" , "x" ]`)}
	tests := []struct {
		name string
		list bool
		in   renderAnswer
	}{
		{"text chat", false, renderAnswer{requestID: "render-1-ab", model: "m", tokenIDs: []int{1, 4, 100}, features: true, sampling: map[string]any{}}},
		{"images", false, renderAnswer{requestID: "render-2", model: `a "quoted" <model>`, tokenIDs: []int{1, 4, 32000}, images: images, features: true, sampling: sampling}},
		{"completions", true, renderAnswer{requestID: "render-3", model: "sim-model", tokenIDs: []int{1, -2, 30099}, sampling: sampling}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := RenderResult{RequestID: tt.in.requestID, Model: tt.in.model, TokenIDs: tt.in.tokenIDs, SamplingParams: tt.in.sampling}
			if tt.in.features {
				res.Features = &RenderFeatures{
					MMHashes:       map[string][]string{"image": {}},
					MMPlaceholders: map[string][]RenderPlaceholder{"image": {}},
					KwargsData:     map[string][]string{"image": {}},
				}
				for i, img := range [][]byte{img1, img2}[:len(tt.in.images)] {
					f, im := res.Features, tt.in.images[i]
					f.MMHashes["image"] = append(f.MMHashes["image"], ImageHash(img))
					f.MMPlaceholders["image"] = append(f.MMPlaceholders["image"], RenderPlaceholder{im.offset, ImageTokenCount(img)})
					f.KwargsData["image"] = append(f.KwargsData["image"], base64.StdEncoding.EncodeToString(ImageKwargsBlob(img)))
				}
			}
			var v any = res
			if tt.list {
				v = []RenderResult{res}
			}
			want := mustJSON(t, v)
			rec := httptest.NewRecorder()
			writeRender(rec, tt.list, tt.in)
			if got := rec.Body.String(); got != string(want) {
				t.Errorf("got  %.300s\nwant %.300s", got, want)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" || rec.Code != 200 {
				t.Errorf("status %d, Content-Type %q", rec.Code, ct)
			}
		})
	}
}

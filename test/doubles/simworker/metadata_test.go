package simworker

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// The chat render answers each image's mm_metadata (ImageMetadata, parallel to mm_hashes) unless
// the worker renders like a vLLM before #54659; a text-only render has none.
func TestChatRenderMetadata(t *testing.T) {
	img1, img2 := []byte("first image"), slices.Repeat([]byte("second"), 40)
	msgs := []obj{{"role": "user", "content": []obj{imagePart(img1), {"type": "text", "text": "compare"}, imagePart(img2)}}}
	t.Run("current vLLM", func(t *testing.T) {
		w := startWorker(t, Config{})
		res := rendered(t, w, msgs)
		got := res.Features.MMMetadata["image"]
		if len(got) != 2 || got[0] == nil || *got[0] != ImageMetadata(img1) || got[1] == nil || *got[1] != ImageMetadata(img2) {
			t.Fatalf("mm_metadata = %v", res.Features.MMMetadata)
		}
		if len(res.Features.KwargsData["image"]) != 2 {
			t.Fatal("kwargs_data must still be rendered (the encode legs need it)")
		}
		raw, _ := base64.StdEncoding.DecodeString(*got[0])
		if want := `{"image_grid_thw":[1,2,` + itoa(2*ImageTokenCount(img1)) + `],"size":11,"mm_hash":"` + ImageHash(img1) + `"}`; string(raw) != want {
			t.Fatalf("metadata %s, want %s", raw, want)
		}
		if len(*got[1]) > 200 {
			t.Fatalf("metadata of %d bytes, want a small item", len(*got[1]))
		}
		text := post(t, w, PathChatRender, userChat("hello", nil))
		mustStatus(t, text, 200)
		if strings.Contains(string(text.body), "mm_metadata") {
			t.Fatalf("text-only render carries mm_metadata: %s", text.body)
		}
	})
	t.Run("vLLM before #54659", func(t *testing.T) {
		w := startWorker(t, Config{RenderWithoutMetadata: true})
		r := post(t, w, PathChatRender, obj{"messages": msgs})
		mustStatus(t, r, 200)
		if strings.Contains(string(r.body), "mm_metadata") || !strings.Contains(string(r.body), "kwargs_data") {
			t.Fatalf("render %.300s", r.body)
		}
	})
}

// The streamed render answer with mm_metadata is what encoding/json makes of the RenderResult.
func TestWriteRenderMetadataMatchesEncodingJSON(t *testing.T) {
	img1, img2 := randomBytes(5000), []byte("http://x/y.png")
	images := []chatImage{{offset: 2, size: len(img1), sum: sha256.Sum256(img1)}, {offset: 12, size: len(img2), sum: sha256.Sum256(img2)}}
	res := RenderResult{RequestID: "render-1", Model: "m", TokenIDs: []int{1, 4, 32000}, SamplingParams: map[string]any{}, Features: &RenderFeatures{
		MMHashes:       map[string][]string{"image": nil},
		MMPlaceholders: map[string][]RenderPlaceholder{"image": nil},
		KwargsData:     map[string][]string{"image": nil},
		MMMetadata:     map[string][]*string{"image": nil},
	}}
	for i, img := range [][]byte{img1, img2} {
		f, meta := res.Features, ImageMetadata(img)
		f.MMHashes["image"] = append(f.MMHashes["image"], ImageHash(img))
		f.MMPlaceholders["image"] = append(f.MMPlaceholders["image"], RenderPlaceholder{images[i].offset, ImageTokenCount(img)})
		f.KwargsData["image"] = append(f.KwargsData["image"], base64.StdEncoding.EncodeToString(ImageKwargsBlob(img)))
		f.MMMetadata["image"] = append(f.MMMetadata["image"], &meta)
	}
	rec := httptest.NewRecorder()
	writeRender(rec, false, renderAnswer{requestID: res.RequestID, model: res.Model, tokenIDs: res.TokenIDs, images: images, features: true, metadata: true, sampling: res.SamplingParams})
	if got, want := rec.Body.String(), string(mustJSON(t, res)); got != want {
		t.Errorf("got  %.400s\nwant %.400s", got, want)
	}
}

// metadataLeg is a generate or completions leg for one image rendered on w: its features carry
// mm_metadata and, with kwargs, kwargs_data; ec (nil: none) are its ec_transfer_params, kv its
// kv_transfer_params (nil: none), maxTokens its limit.
func metadataLeg(t *testing.T, w *Worker, kind apiKind, img []byte, kwargs bool, ec, kv any, maxTokens int) (string, obj) {
	t.Helper()
	res := rendered(t, w, []obj{{"role": "user", "content": []obj{{"type": "text", "text": "see"}, imagePart(img)}}})
	f := res.Features
	feats := obj{"mm_hashes": f.MMHashes, "mm_placeholders": f.MMPlaceholders, "mm_metadata": f.MMMetadata}
	if kwargs {
		feats["kwargs_data"] = f.KwargsData
	}
	if kind == kindCompletion {
		b := completion(res.TokenIDs, obj{"max_tokens": maxTokens, "features": feats})
		if ec != nil {
			b["ec_transfer_params"] = ec
		}
		if kv != nil {
			b["kv_transfer_params"] = kv
		}
		return PathCompletions, b
	}
	extra := obj{}
	if ec != nil {
		extra["ec_transfer_params"] = ec
	}
	if kv != nil {
		extra["kv_transfer_params"] = kv
	}
	return PathGenerate, generate(res.TokenIDs, obj{"max_tokens": maxTokens, "extra_args": extra}, obj{"features": feats})
}

// As vLLM does, the generate and completions endpoints take items with mm_metadata but no
// kwargs_data only with ec_transfer_params (the encoder outputs come from the EC connector), and
// then answer exactly what the same request with kwargs_data answers. The metadata must be the
// one rendered for the item's hash and match the encoder output its descriptor names.
func TestMetadataOnlyItems(t *testing.T) {
	e := startWorker(t, Config{Role: RoleEncode, Name: "e0"})
	img := []byte("a picture of a lighthouse at dusk")
	h := ImageHash(img)
	enc := post(t, e, PathChatCompletions, encodeChat(t, e, img, nil))
	mustStatus(t, enc, 200)
	ec := ecOf(t, enc)
	prefillKV := obj{"do_remote_decode": true}
	for _, kind := range []apiKind{kindGenerate, kindCompletion} {
		name := map[apiKind]string{kindGenerate: "generate", kindCompletion: "completions"}[kind]
		t.Run(name, func(t *testing.T) {
			p := startWorker(t, Config{Role: RolePrefill})
			both := startWorker(t, Config{Role: RoleBoth})

			path, body := metadataLeg(t, p, kind, img, false, nil, prefillKV, 1)
			r := post(t, p, path, body)
			mustStatus(t, r, 400)
			if msg := errorMessage(t, r); msg != "metadata-only multimodal items require ec_transfer_params" {
				t.Fatalf("message %q", msg)
			}
			// Not on a decode or local leg either: the rule is the request's.
			path, body = metadataLeg(t, both, kind, img, false, nil, nil, 3)
			mustStatus(t, post(t, both, path, body), 400)

			// With kwargs_data too, the two are merged: no EC needed.
			path, body = metadataLeg(t, p, kind, img, true, nil, prefillKV, 1)
			mustStatus(t, post(t, p, path, body), 200)

			// Metadata-only with the encoder's descriptors: served.
			path, body = metadataLeg(t, p, kind, img, false, ec, prefillKV, 1)
			mustStatus(t, post(t, p, path, body), 200)

			// The same answer as with kwargs_data.
			path, withMeta := metadataLeg(t, both, kind, img, false, ec, nil, 3)
			_, withKwargs := metadataLeg(t, both, kind, img, true, nil, nil, 3)
			delete(withKwargs["features"].(obj), "mm_metadata")
			a, b := post(t, both, path, withMeta), post(t, both, path, withKwargs)
			mustStatus(t, a, 200)
			mustStatus(t, b, 200)
			if answerOf(t, kind, a) != answerOf(t, kind, b) || answerOf(t, kind, a) == "" {
				t.Fatalf("answers differ: with mm_metadata %s, with kwargs_data %s", a.body, b.body)
			}
		})
	}

	t.Run("metadata checks", func(t *testing.T) {
		p := startWorker(t, Config{Role: RolePrefill})
		other := []byte("another picture")
		tests := map[string]struct {
			edit func(feats obj, extra obj)
			msg  string
		}{
			"another image's metadata": {
				edit: func(f, _ obj) { f["mm_metadata"] = obj{"image": []string{ImageMetadata(other)}} },
				msg:  "features.mm_metadata.image[0] was rendered for mm_hash " + ImageHash(other) + ", not " + h,
			},
			"not base64": {
				edit: func(f, _ obj) { f["mm_metadata"] = obj{"image": []string{"%%%"}} },
				msg:  "features.mm_metadata.image[0] is not base64",
			},
			"not a rendered item": {
				edit: func(f, _ obj) {
					f["mm_metadata"] = obj{"image": []string{base64.StdEncoding.EncodeToString([]byte(`{"pixel_values":[1]}`))}}
				},
				msg: "is not an item the render service produced",
			},
			"placeholder mismatch": {
				edit: func(f, _ obj) {
					f["mm_placeholders"] = obj{"image": []obj{{"offset": 3, "length": 1}}}
				},
				msg: "the placeholder has 1",
			},
			"one item too many": {
				edit: func(f, _ obj) { f["mm_metadata"] = obj{"image": []string{ImageMetadata(img), ImageMetadata(img)}} },
				msg:  "features.mm_metadata.image must have one item per mm_hash (1 hashes, 2 items)",
			},
			"encoder output of another size": {
				// The hash and grid agree, but the image it describes is 61 bytes larger.
				edit: func(f, _ obj) {
					forged := `{"image_grid_thw":[1,2,` + itoa(2*ImageTokenCount(img)) + `],"size":` + itoa(len(img)+61) + `,"mm_hash":"` + h + `"}`
					f["mm_metadata"] = obj{"image": []string{base64.StdEncoding.EncodeToString([]byte(forged))}}
				},
				msg: "EC transfer failed: mm_hash " + h + ": mm_metadata describes a " + itoa(len(img)+61) + "-byte image",
			},
		}
		for name, tc := range tests {
			t.Run(name, func(t *testing.T) {
				path, body := metadataLeg(t, p, kindGenerate, img, false, ec, prefillKV, 1)
				tc.edit(body["features"].(obj), body["sampling_params"].(obj)["extra_args"].(obj))
				r := post(t, p, path, body)
				mustStatus(t, r, 400)
				if msg := errorMessage(t, r); !strings.Contains(msg, tc.msg) {
					t.Fatalf("message %q, want %q", msg, tc.msg)
				}
			})
		}
	})
}

// answerOf is the generated text or token ids of an answer.
func answerOf(t *testing.T, kind apiKind, r reply) string {
	t.Helper()
	if kind == kindCompletion {
		c := decode[TextCompletion](t, r.body)
		return c.Choices[0].Text
	}
	g := decode[GenerateResponse](t, r.body)
	b, _ := json.Marshal(g.Choices[0].TokenIDs)
	return string(b)
}

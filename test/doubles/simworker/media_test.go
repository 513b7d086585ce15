package simworker

import (
	"encoding/base64"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// audioURLPart, inputAudioPart and videoPart are the content parts of the other modalities.
func audioURLPart(b []byte) obj {
	return obj{"type": "audio_url", "audio_url": obj{"url": "data:audio/wav;base64," + base64.StdEncoding.EncodeToString(b)}}
}

func inputAudioPart(b []byte) obj {
	return obj{"type": "input_audio", "input_audio": obj{"data": base64.StdEncoding.EncodeToString(b), "format": "mp3"}}
}

func videoPart(b []byte) obj {
	return obj{"type": "video_url", "video_url": obj{"url": "data:video/mp4;base64," + base64.StdEncoding.EncodeToString(b)}}
}

// mixed is a user message with text, an image, an audio_url, an input_audio and a video, and
// the bytes of its media parts in order.
func mixed() ([]obj, [][]byte) {
	img, aud, clip, vid := []byte("an image"), []byte("some wav audio"), []byte("an mp3 clip, longer"), []byte("a short video file")
	return []obj{{"role": "user", "content": []obj{
		{"type": "text", "text": "hi"}, imagePart(img), audioURLPart(aud), inputAudioPart(clip), videoPart(vid),
	}}}, [][]byte{img, aud, clip, vid}
}

// mixedModalities are the modalities of mixed's media parts.
var mixedModalities = []string{ModalityImage, ModalityAudio, ModalityAudio, ModalityVideo}

func TestMediaHashCoversTheModality(t *testing.T) {
	b := []byte("the same bytes")
	if MediaHash(ModalityImage, b) != ImageHash(b) || MediaTokenCount(ModalityImage, b) != ImageTokenCount(b) ||
		string(MediaKwargsBlob(ModalityImage, b)) != string(ImageKwargsBlob(b)) || MediaMetadata(ModalityImage, b) != ImageMetadata(b) {
		t.Fatal("an image's Media* values differ from its Image* ones")
	}
	seen := map[string]string{}
	for _, m := range []string{ModalityImage, ModalityAudio, ModalityVideo} {
		h := MediaHash(m, b)
		if !validHash(h) {
			t.Fatalf("%s hash %q", m, h)
		}
		if other, dup := seen[h]; dup {
			t.Fatalf("%s and %s items of the same bytes share the mm_hash %s", other, m, h)
		}
		seen[h] = m
		if got := len(MediaKwargsBlob(m, b)); got != ImageKwargsSize(len(b)) {
			t.Fatalf("%s kwargs blob of %d bytes, want %d", m, got, ImageKwargsSize(len(b)))
		}
	}
	for m, want := range map[string]int{ModalityImage: 4 + 14%61, ModalityAudio: 3 + 14%37, ModalityVideo: 8 + 14%53} {
		if got := MediaTokenCount(m, b); got != want {
			t.Errorf("%s tokens %d, want %d", m, got, want)
		}
	}
}

// RenderChat tokenizes every modality with its own placeholder token, in document order, and
// hashes each item with its modality.
func TestRenderChatMedia(t *testing.T) {
	msgs, bytes := mixed()
	got, err := RenderChat(mustJSON(t, msgs))
	if err != nil {
		t.Fatal(err)
	}
	want := []int{BOSTokenID, UserTokenID, WordTokenID("hi")}
	var media []RenderedMedia
	for i, b := range bytes {
		m := mixedModalities[i]
		media = append(media, RenderedMedia{Modality: m, Hash: MediaHash(m, b), Offset: len(want), Length: MediaTokenCount(m, b), Bytes: b})
		want = append(want, slices.Repeat([]int{MediaTokenID(m)}, MediaTokenCount(m, b))...)
	}
	if !slices.Equal(got.TokenIDs, want) {
		t.Fatalf("TokenIDs = %v, want %v", got.TokenIDs, want)
	}
	if len(got.Media) != len(media) || len(got.Images) != 1 || got.Images[0].Hash != media[0].Hash {
		t.Fatalf("Media %+v, Images %+v", got.Media, got.Images)
	}
	for i, w := range media {
		g := got.Media[i]
		if g.Modality != w.Modality || g.Hash != w.Hash || g.Offset != w.Offset || g.Length != w.Length || string(g.Bytes) != string(w.Bytes) {
			t.Errorf("Media[%d] = %+v, want %+v", i, g, w)
		}
	}
}

// The render service answers the features of every modality, each modality's items in document
// order (audio_url and input_audio alike), with their kwargs_data and mm_metadata.
func TestChatRenderEveryModality(t *testing.T) {
	w := startWorker(t, Config{})
	msgs, bytes := mixed()
	res := rendered(t, w, msgs)
	f := res.Features
	offset := 3
	byMod := map[string]int{}
	for i, b := range bytes {
		m := mixedModalities[i]
		k := byMod[m]
		byMod[m]++
		if len(f.MMHashes[m]) <= k || f.MMHashes[m][k] != MediaHash(m, b) {
			t.Fatalf("mm_hashes.%s = %v, want %s at %d", m, f.MMHashes[m], MediaHash(m, b), k)
		}
		if ph := f.MMPlaceholders[m][k]; ph.Offset != offset || ph.Length != MediaTokenCount(m, b) {
			t.Fatalf("mm_placeholders.%s[%d] = %+v, want {%d %d}", m, k, ph, offset, MediaTokenCount(m, b))
		}
		if kw := f.KwargsData[m][k]; kw != base64.StdEncoding.EncodeToString(MediaKwargsBlob(m, b)) {
			t.Fatalf("kwargs_data.%s[%d] is not the item's blob", m, k)
		}
		if md := f.MMMetadata[m][k]; md == nil || *md != MediaMetadata(m, b) {
			t.Fatalf("mm_metadata.%s[%d] = %v, want %s", m, k, md, MediaMetadata(m, b))
		}
		offset += MediaTokenCount(m, b)
	}
	for m, n := range map[string]int{ModalityImage: 1, ModalityAudio: 2, ModalityVideo: 1} {
		if len(f.MMHashes[m]) != n || len(f.MMPlaceholders[m]) != n || len(f.KwargsData[m]) != n || len(f.MMMetadata[m]) != n {
			t.Errorf("%s: %d hashes, want %d", m, len(f.MMHashes[m]), n)
		}
	}
	raw, _ := base64.StdEncoding.DecodeString(MediaMetadata(ModalityAudio, bytes[1]))
	if want := `{"audio_feature_lengths":[` + itoa(4*MediaTokenCount(ModalityAudio, bytes[1])) + `],"size":14,"mm_hash":"` + MediaHash(ModalityAudio, bytes[1]) + `"}`; string(raw) != want {
		t.Fatalf("audio metadata %s, want %s", raw, want)
	}
	// An audio-only prompt still lists image, empty, as vLLM's features do for text.
	only := rendered(t, w, []obj{{"role": "user", "content": []obj{inputAudioPart(bytes[2])}}})
	if h, ok := only.Features.MMHashes[ModalityImage]; !ok || len(h) != 0 || len(only.Features.MMHashes[ModalityAudio]) != 1 || only.Features.MMHashes[ModalityVideo] != nil {
		t.Fatalf("audio-only features %+v", only.Features.MMHashes)
	}
}

// The streamed render answer of every modality is what encoding/json makes of the RenderResult.
func TestWriteRenderMediaMatchesEncodingJSON(t *testing.T) {
	_, bytes := mixed()
	var items []chatImage
	res := RenderResult{RequestID: "render-m", Model: "m", TokenIDs: []int{1, 4}, SamplingParams: map[string]any{}, Features: &RenderFeatures{
		MMHashes: map[string][]string{}, MMPlaceholders: map[string][]RenderPlaceholder{}, KwargsData: map[string][]string{}, MMMetadata: map[string][]*string{},
	}}
	f := res.Features
	f.MMHashes[ModalityImage], f.MMPlaceholders[ModalityImage], f.KwargsData[ModalityImage], f.MMMetadata[ModalityImage] = []string{}, []RenderPlaceholder{}, []string{}, []*string{}
	for i, b := range bytes {
		m := mixedModalities[i]
		items = append(items, chatImage{mod: m, offset: 10 * i, size: len(b), sum: mediaSum(m, b)})
		meta := MediaMetadata(m, b)
		f.MMHashes[m] = append(f.MMHashes[m], MediaHash(m, b))
		f.MMPlaceholders[m] = append(f.MMPlaceholders[m], RenderPlaceholder{10 * i, MediaTokenCount(m, b)})
		f.KwargsData[m] = append(f.KwargsData[m], base64.StdEncoding.EncodeToString(MediaKwargsBlob(m, b)))
		f.MMMetadata[m] = append(f.MMMetadata[m], &meta)
	}
	rec := httptest.NewRecorder()
	writeRender(rec, false, renderAnswer{requestID: res.RequestID, model: res.Model, tokenIDs: res.TokenIDs, images: items, features: true, metadata: true, sampling: res.SamplingParams})
	if got, want := rec.Body.String(), string(mustJSON(t, res)); got != want {
		t.Errorf("got  %.600s\nwant %.600s", got, want)
	}
}

// An encode worker answers one EC descriptor for a leg of any modality, and the prefill worker
// checks the descriptors of every modality; with shared storage the encoder outputs are files.
func TestEncodeEveryModality(t *testing.T) {
	msgs, bytes := mixed()
	parts := msgs[0]["content"].([]obj)[1:]
	t.Run("ec-nixl", func(t *testing.T) {
		e := startWorker(t, Config{Role: RoleEncode, Name: "e0"})
		p := startWorker(t, Config{Role: RolePrefill})
		ec := map[string]ECDescriptor{}
		for i, part := range parts {
			r := post(t, e, PathChatCompletions, encodeLeg(t, e, part, nil))
			mustStatus(t, r, 200)
			h := MediaHash(mixedModalities[i], bytes[i])
			got := ecOf(t, r)
			if d, ok := got[h]; !ok || len(got) != 1 || d.SizeBytes != ImageKwargsSize(len(bytes[i])) || d.PeerPort != portOf(t, e) {
				t.Fatalf("%s leg: ec_transfer_params %+v, want one for %s", part["type"], got, h)
			}
			ec[h] = got[h]
		}
		res := rendered(t, p, msgs)
		mustStatus(t, post(t, p, PathChatCompletions, mmPrefill(res, msgs, ec)), 200)
		// The descriptor of the video is missing: the prefill worker refuses.
		partial := map[string]ECDescriptor{}
		for h, d := range ec {
			if h != MediaHash(ModalityVideo, bytes[3]) {
				partial[h] = d
			}
		}
		r := post(t, p, PathChatCompletions, mmPrefill(res, msgs, partial))
		mustStatus(t, r, 400)
		if msg := errorMessage(t, r); !strings.Contains(msg, "EC transfer failed") || !strings.Contains(msg, MediaHash(ModalityVideo, bytes[3])) {
			t.Fatalf("message %q", msg)
		}
	})
	t.Run("ec-shared-storage", func(t *testing.T) {
		dir := t.TempDir()
		e := startWorker(t, Config{Role: RoleEncode, ECConnector: ECSharedStorage, ECDir: dir})
		p := startWorker(t, Config{Role: RolePrefill, ECConnector: ECSharedStorage, ECDir: dir})
		for i, part := range parts {
			mustStatus(t, post(t, e, PathChatCompletions, encodeLeg(t, e, part, nil)), 200)
			m := mixedModalities[i]
			if b, err := os.ReadFile(filepath.Join(dir, MediaHash(m, bytes[i]))); err != nil || string(b) != string(MediaKwargsBlob(m, bytes[i])) {
				t.Fatalf("%s EC file: %v (%d bytes)", part["type"], err, len(b))
			}
		}
		mustStatus(t, post(t, p, PathChatCompletions, mmPrefill(rendered(t, p, msgs), msgs, nil)), 200)
	})
	t.Run("validation", func(t *testing.T) {
		e := startWorker(t, Config{Role: RoleEncode})
		audio := encodeLeg(t, e, parts[1], nil)
		// The audio part's leg carrying the image's hash: the coordinator lined items up wrongly.
		swapped := encodeLeg(t, e, parts[1], nil)
		swapped["tokens"].(obj)["features"].(obj)["mm_hashes"] = obj{"audio": []string{MediaHash(ModalityImage, bytes[0])}}
		asImage := encodeLeg(t, e, parts[1], nil)
		asImage["tokens"].(obj)["features"].(obj)["mm_hashes"] = obj{"image": []string{MediaHash(ModalityAudio, bytes[1])}}
		tests := map[string]struct {
			body obj
			msg  string
		}{
			"another item's hash": {swapped, "is not the audio part's"},
			"the wrong modality":  {asImage, "requires tokens.features.mm_hashes.audio with exactly one mm_hash"},
		}
		mustStatus(t, post(t, e, PathChatCompletions, audio), 200)
		for name, tc := range tests {
			t.Run(name, func(t *testing.T) {
				r := post(t, e, PathChatCompletions, tc.body)
				mustStatus(t, r, 400)
				if msg := errorMessage(t, r); !strings.Contains(msg, tc.msg) {
					t.Fatalf("message %q, want %q", msg, tc.msg)
				}
			})
		}
	})
}

// encodeLeg builds the chat encode leg of one media part, as a coordinator would.
func encodeLeg(t *testing.T, w *Worker, part obj, extra obj) obj {
	t.Helper()
	msgs := []obj{{"role": "user", "content": []obj{part}}}
	res := rendered(t, w, msgs)
	b := obj{"model": DefaultModelName, "messages": msgs, "max_tokens": 1, "tokens": obj{
		"token_ids": res.TokenIDs,
		"features":  obj{"mm_hashes": res.Features.MMHashes, "mm_placeholders": res.Features.MMPlaceholders},
	}}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

// A prefill or decode worker lines a chat leg's tokens.features up with its messages, modality
// by modality, as vLLM would: counts, lengths and the placeholder tokens they cover.
func TestChatFeaturesMatchTheMessages(t *testing.T) {
	msgs, _ := mixed()
	w := startWorker(t, Config{Role: RoleBoth})
	res := rendered(t, w, msgs)
	leg := func(edit func(f obj)) obj {
		f := obj{"mm_hashes": res.Features.MMHashes, "mm_placeholders": res.Features.MMPlaceholders}
		if edit != nil {
			edit(f)
		}
		return obj{"model": DefaultModelName, "messages": msgs, "max_tokens": 2, "tokens": obj{"token_ids": res.TokenIDs, "features": f}}
	}
	mustStatus(t, post(t, w, PathChatCompletions, leg(nil)), 200)
	audio := res.Features.MMPlaceholders[ModalityAudio]
	image := res.Features.MMPlaceholders[ModalityImage]
	tests := map[string]struct {
		edit func(f obj)
		msg  string
	}{
		"an audio item missing": {
			edit: func(f obj) {
				f["mm_hashes"] = obj{"image": res.Features.MMHashes["image"], "audio": res.Features.MMHashes["audio"][:1], "video": res.Features.MMHashes["video"]}
			},
			msg: "tokens.features.mm_hashes.audio has 1 items and mm_placeholders.audio 2, the messages have 2 audio parts",
		},
		"the two audio items swapped": {
			edit: func(f obj) {
				f["mm_placeholders"] = obj{"image": image, "audio": []RenderPlaceholder{audio[1], audio[0]}, "video": res.Features.MMPlaceholders["video"]}
			},
			msg: "tokens.features.mm_placeholders.audio[0] has length",
		},
		"audio over the image's tokens": {
			edit: func(f obj) {
				f["mm_placeholders"] = obj{"image": image, "audio": []RenderPlaceholder{{image[0].Offset, audio[0].Length}, audio[1]}, "video": res.Features.MMPlaceholders["video"]}
			},
			msg: "not the audio placeholder",
		},
		"no video features": {
			edit: func(f obj) {
				f["mm_hashes"] = obj{"image": res.Features.MMHashes["image"], "audio": res.Features.MMHashes["audio"]}
				f["mm_placeholders"] = obj{"image": image, "audio": audio}
			},
			msg: "the messages have 1 video parts",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := post(t, w, PathChatCompletions, leg(tc.edit))
			mustStatus(t, r, 400)
			if msg := errorMessage(t, r); !strings.Contains(msg, tc.msg) {
				t.Fatalf("message %q, want %q", msg, tc.msg)
			}
		})
	}
}

// Metadata-only audio and video items of a generate prefill leg need the encoders' descriptors,
// and their metadata is checked against their hash and placeholder like an image's.
func TestMetadataOfEveryModality(t *testing.T) {
	msgs, bytes := mixed()
	e := startWorker(t, Config{Role: RoleEncode})
	p := startWorker(t, Config{Role: RolePrefill})
	ec := map[string]ECDescriptor{}
	for _, part := range msgs[0]["content"].([]obj)[1:] {
		r := post(t, e, PathChatCompletions, encodeLeg(t, e, part, nil))
		mustStatus(t, r, 200)
		for h, d := range ecOf(t, r) {
			ec[h] = d
		}
	}
	res := rendered(t, p, msgs)
	f := res.Features
	body := func(meta map[string][]*string, ec any) obj {
		extra := obj{"kv_transfer_params": obj{"do_remote_decode": true}}
		if ec != nil {
			extra["ec_transfer_params"] = ec
		}
		return generate(res.TokenIDs, obj{"max_tokens": 1, "extra_args": extra},
			obj{"features": obj{"mm_hashes": f.MMHashes, "mm_placeholders": f.MMPlaceholders, "mm_metadata": meta}})
	}
	mustStatus(t, post(t, p, PathGenerate, body(f.MMMetadata, ec)), 200)
	r := post(t, p, PathGenerate, body(f.MMMetadata, nil))
	mustStatus(t, r, 400)
	if msg := errorMessage(t, r); msg != "metadata-only multimodal items require ec_transfer_params" {
		t.Fatalf("message %q", msg)
	}
	wrong := MediaMetadata(ModalityVideo, bytes[1]) // the audio's bytes, as a video
	forged := map[string][]*string{"image": f.MMMetadata["image"], "audio": {&wrong, f.MMMetadata["audio"][1]}, "video": f.MMMetadata["video"]}
	r = post(t, p, PathGenerate, body(forged, ec))
	mustStatus(t, r, 400)
	if msg := errorMessage(t, r); !strings.Contains(msg, "features.mm_metadata.audio[0] is not an item the render service produced ({audio_feature_lengths, size, mm_hash})") {
		t.Fatalf("message %q", msg)
	}
}

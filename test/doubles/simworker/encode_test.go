package simworker

import (
	"encoding/base64"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// imagePart returns an image_url content part for img.
func imagePart(img []byte) obj {
	return obj{"type": "image_url", "image_url": obj{"url": dataURL(img)}}
}

// rendered renders messages on w and returns the result.
func rendered(t *testing.T, w *Worker, messages []obj) RenderResult {
	t.Helper()
	r := post(t, w, PathChatRender, obj{"messages": messages})
	mustStatus(t, r, 200)
	return decode[RenderResult](t, r.body)
}

// encodeChat builds the chat encode leg of one image, as a coordinator would.
func encodeChat(t *testing.T, w *Worker, img []byte, extra obj) obj {
	t.Helper()
	msgs := []obj{{"role": "user", "content": []obj{imagePart(img)}}}
	res := rendered(t, w, msgs)
	b := obj{"model": DefaultModelName, "messages": msgs, "max_tokens": 1, "tokens": obj{
		"token_ids": res.TokenIDs,
		"features":  obj{"mm_hashes": res.Features.MMHashes, "mm_placeholders": res.Features.MMPlaceholders},
	}}
	maps.Copy(b, extra)
	return b
}

// ecOf extracts the top-level ec_transfer_params of a response.
func ecOf(t *testing.T, r reply) map[string]ECDescriptor {
	t.Helper()
	return decode[struct {
		EC map[string]ECDescriptor `json:"ec_transfer_params"`
	}](t, r.body).EC
}

// mmPrefill builds a prefill leg for a text-and-image prompt, carrying the
// rendered tokens and features plus ec params (nil: none).
func mmPrefill(res RenderResult, msgs []obj, ec any) obj {
	b := obj{"messages": msgs, "max_tokens": 1, "kv_transfer_params": obj{"do_remote_decode": true},
		"tokens": obj{"token_ids": res.TokenIDs, "features": obj{"mm_hashes": res.Features.MMHashes, "mm_placeholders": res.Features.MMPlaceholders}}}
	if ec != nil {
		b["ec_transfer_params"] = ec
	}
	return b
}

func TestEncodeNixlToPrefill(t *testing.T) {
	e := startWorker(t, Config{Role: RoleEncode, Name: "e0"})
	p := startWorker(t, Config{Role: RolePrefill})
	img := []byte("a small picture of a cat")
	h := ImageHash(img)

	r := post(t, e, PathChatCompletions, encodeChat(t, e, img, nil))
	mustStatus(t, r, 200)
	ec := ecOf(t, r)
	d, ok := ec[h]
	if !ok || len(ec) != 1 || d.PeerHost != "127.0.0.1" || d.PeerPort != portOf(t, e) ||
		d.SizeBytes != ImageKwargsSize(len(img)) || d.NixlAgentMetadataB64 == "" {
		t.Fatalf("ec_transfer_params = %+v", ec)
	}
	if c := decode[ChatCompletion](t, r.body); c.Usage.CompletionTokens != 1 || strings.Contains(string(r.body), "kv_transfer_params") {
		t.Errorf("encode answer %s", r.body)
	}
	if got := decode[ECDescriptor](t, do(t, "GET", e.URL()+"/ec/"+h, nil, nil).body); got != d {
		t.Errorf("GET /ec = %+v, want %+v", got, d)
	}

	msgs := []obj{{"role": "user", "content": []obj{{"type": "text", "text": "what is this"}, imagePart(img)}}}
	res := rendered(t, p, msgs)
	tamper := func(f func(*ECDescriptor)) map[string]ECDescriptor {
		c := maps.Clone(ec)
		x := c[h]
		f(&x)
		c[h] = x
		return c
	}
	tests := []struct {
		name    string
		ec      any
		wantMsg string
	}{
		{"verified", ec, ""},
		{"missing params", nil, "has no descriptor for mm_hash " + h},
		{"other hash only", map[string]ECDescriptor{"abc": d}, "has no descriptor"},
		{"size", tamper(func(x *ECDescriptor) { x.SizeBytes++ }), "descriptor mismatch"},
		{"metadata", tamper(func(x *ECDescriptor) { x.NixlAgentMetadataB64 = "eA==" }), "descriptor mismatch"},
		{"wrong peer", tamper(func(x *ECDescriptor) { x.PeerPort = portOf(t, p) }), "unknown to"},
		{"no port", tamper(func(x *ECDescriptor) { x.PeerPort = 0 }), "valid peer_port"},
		{"malformed", obj{h: "x"}, "malformed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := post(t, p, PathChatCompletions, mmPrefill(res, msgs, tt.ec))
			if tt.wantMsg == "" {
				mustStatus(t, r, 200)
				return
			}
			mustStatus(t, r, 400)
			if msg := errorMessage(t, r); !strings.HasPrefix(msg, "EC transfer failed: ") || !strings.Contains(msg, tt.wantMsg) {
				t.Errorf("message %q, want EC transfer failed: ...%s", msg, tt.wantMsg)
			}
		})
	}

	t.Run("generate prefill leg", func(t *testing.T) {
		body := generate(res.TokenIDs, obj{"max_tokens": 1, "extra_args": obj{"kv_transfer_params": obj{"do_remote_decode": true}, "ec_transfer_params": ec}},
			obj{"features": obj{"mm_hashes": res.Features.MMHashes, "mm_placeholders": res.Features.MMPlaceholders}})
		mustStatus(t, post(t, p, PathGenerate, body), 200)
		delete(body["sampling_params"].(obj)["extra_args"].(obj), "ec_transfer_params")
		r := post(t, p, PathGenerate, body)
		mustStatus(t, r, 400)
		if msg := errorMessage(t, r); !strings.Contains(msg, "ec_transfer_params has no descriptor") {
			t.Errorf("message %q", msg)
		}
	})

	t.Run("local compute is lenient without params", func(t *testing.T) {
		both := startWorker(t, Config{Role: RoleBoth})
		local := mmPrefill(res, msgs, nil)
		delete(local, "kv_transfer_params")
		local["max_tokens"] = 3
		mustStatus(t, post(t, both, PathChatCompletions, local), 200)
		local["ec_transfer_params"] = tamper(func(x *ECDescriptor) { x.SizeBytes = 1 })
		mustStatus(t, post(t, both, PathChatCompletions, local), 400)
	})
}

func TestEncodeGenerateFormat(t *testing.T) {
	e := startWorker(t, Config{Role: RoleEncode})
	msgs := []obj{{"role": "user", "content": []obj{imagePart([]byte("one")), imagePart([]byte("two two"))}}}
	res := rendered(t, e, msgs)
	body := generate(res.TokenIDs, obj{"max_tokens": 1}, obj{"features": res.Features})
	r := post(t, e, PathGenerate, body)
	mustStatus(t, r, 200)
	ec := ecOf(t, r)
	for _, img := range []string{"one", "two two"} {
		if got := ec[ImageHash([]byte(img))].SizeBytes; got != ImageKwargsSize(len(img)) {
			t.Errorf("size_bytes of %q = %d, want %d", img, got, ImageKwargsSize(len(img)))
		}
	}
	if g := decode[GenerateResponse](t, r.body); len(g.Choices[0].TokenIDs) != 1 {
		t.Errorf("generate answer %s", r.body)
	}
}

func TestEncodeValidation(t *testing.T) {
	e := startWorker(t, Config{Role: RoleEncode})
	img := []byte("img")
	twoImages := encodeChat(t, e, img, obj{"messages": []obj{{"role": "user", "content": []obj{imagePart(img), imagePart(img)}}}})
	noTokens := encodeChat(t, e, img, nil)
	delete(noTokens, "tokens")
	badHash := encodeChat(t, e, img, obj{"tokens": obj{"token_ids": []int{1}, "features": obj{"mm_hashes": obj{"image": []string{"../x"}}}}})
	genNoKwargs := generate([]int{1, ImageTokenID}, obj{"max_tokens": 1}, obj{"features": obj{"mm_hashes": obj{"image": []string{"h1"}}}})
	tests := []struct {
		name    string
		path    string
		body    obj
		wantMsg string
	}{
		{"two images", PathChatCompletions, twoImages, "exactly one media part (image_url, audio_url, input_audio or video_url), got 2"},
		{"no tokens", PathChatCompletions, noTokens, "requires tokens.features.mm_hashes.image"},
		{"bad hash", PathChatCompletions, badHash, "invalid mm_hash"},
		{"max tokens", PathChatCompletions, encodeChat(t, e, img, obj{"max_tokens": 2}), "max_tokens must be 1 for encode requests"},
		{"stream", PathChatCompletions, encodeChat(t, e, img, obj{"stream": true}), "stream must be false"},
		{"completions", PathCompletions, completion("a", obj{"max_tokens": 1}), "encode worker serves only"},
		{"generate without features", PathGenerate, generate([]int{1}, obj{"max_tokens": 1}, nil), "requires features.mm_hashes"},
		{"generate without kwargs", PathGenerate, genNoKwargs, "kwargs_data.image for every mm_hash"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := post(t, e, tt.path, tt.body)
			mustStatus(t, r, 400)
			if msg := errorMessage(t, r); !strings.Contains(msg, tt.wantMsg) {
				t.Errorf("message %q, want %q", msg, tt.wantMsg)
			}
		})
	}
}

func TestEncodeSharedStorage(t *testing.T) {
	dir := t.TempDir()
	e := startWorker(t, Config{Role: RoleEncode, ECConnector: ECSharedStorage, ECDir: dir})
	p := startWorker(t, Config{Role: RolePrefill, ECConnector: ECSharedStorage, ECDir: dir})
	img := []byte("shared picture")
	r := post(t, e, PathChatCompletions, encodeChat(t, e, img, nil))
	mustStatus(t, r, 200)
	if strings.Contains(string(r.body), "ec_transfer_params") {
		t.Errorf("shared-storage encode answered ec_transfer_params: %s", r.body)
	}
	b, err := os.ReadFile(filepath.Join(dir, ImageHash(img)))
	if err != nil || string(b) != string(ImageKwargsBlob(img)) {
		t.Fatalf("EC file: %v (%d bytes)", err, len(b))
	}

	msgs := []obj{{"role": "user", "content": []obj{imagePart(img)}}}
	mustStatus(t, post(t, p, PathChatCompletions, mmPrefill(rendered(t, p, msgs), msgs, nil)), 200)

	other := []obj{{"role": "user", "content": []obj{imagePart([]byte("never encoded"))}}}
	miss := post(t, p, PathChatCompletions, mmPrefill(rendered(t, p, other), other, nil))
	mustStatus(t, miss, 400)
	if msg := errorMessage(t, miss); !strings.Contains(msg, "EC transfer failed: no encoder cache file") {
		t.Errorf("message %q", msg)
	}

	gen := generate([]int{1, ImageTokenID}, obj{"max_tokens": 1}, obj{"features": obj{
		"mm_hashes":   obj{"image": []string{"gen-hash"}},
		"kwargs_data": obj{"image": []string{base64.StdEncoding.EncodeToString([]byte("12345"))}},
	}})
	mustStatus(t, post(t, e, PathGenerate, gen), 200)
	if b, err := os.ReadFile(filepath.Join(dir, "gen-hash")); err != nil || string(b) != "12345" {
		t.Errorf("generate EC file: %v %q", err, b)
	}
}

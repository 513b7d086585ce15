package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/epd-dev/coordinator/test/doubles/gateway"
	"github.com/epd-dev/coordinator/test/doubles/mediaserver"
	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/harness/stack"
)

var fullPipeline = steps("replace-media-urls", "render", "conditional-decode", "encode", "prefill", "decode")

func startMedia(t *testing.T) *mediaserver.Server {
	t.Helper()
	m, err := mediaserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func dataURL(b []byte) string { return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b) }

// imageChat is a chat request with a text part and one image part per URL.
func imageChat(text string, maxTokens int64, urls ...string) openai.ChatCompletionNewParams {
	parts := []openai.ChatCompletionContentPartUnionParam{openai.TextContentPart(text)}
	for _, u := range urls {
		parts = append(parts, openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: u}))
	}
	return openai.ChatCompletionNewParams{
		Model:     "sim-model",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(parts)},
		MaxTokens: openai.Int(maxTokens),
	}
}

// legProfiles lists a request's legs as profile:status.
func (s *system) legProfiles(resp *http.Response) string {
	return profiles(s.legsFor(resp.Header.Get("X-Request-Id")))
}

func hashes(t *testing.T, v any, path ...string) []string {
	t.Helper()
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("no %s in %v", p, v)
		}
		v = m[p]
	}
	var out []string
	for _, h := range v.([]any) {
		out = append(out, h.(string))
	}
	return out
}

func TestMultimodalCases(t *testing.T) {
	media := startMedia(t)
	pngA, pngB := mediaserver.PNG("a"), mediaserver.PNG("b")
	remoteA, remoteB := media.URL()+"/img/a.png", media.URL()+"/img/b.png"
	tests := map[string]struct {
		urls       []string
		images     [][]byte
		wantLegs   string
		downloaded int
	}{
		"text only":         {wantLegs: "decode:412,prefill:200,decode:200"},
		"one remote image":  {urls: []string{remoteA}, images: [][]byte{pngA}, downloaded: 1, wantLegs: "decode:412,encode:200,prefill:200,decode:200"},
		"two remote images": {urls: []string{remoteA, remoteB}, images: [][]byte{pngA, pngB}, downloaded: 2, wantLegs: "decode:412,encode:200,encode:200,prefill:200,decode:200"},
		"inline data URL":   {urls: []string{dataURL(pngB)}, images: [][]byte{pngB}, wantLegs: "decode:412,encode:200,prefill:200,decode:200"},
		"mixed remote+data": {urls: []string{dataURL(pngA), remoteB}, images: [][]byte{pngA, pngB}, downloaded: 1, wantLegs: "decode:412,encode:200,encode:200,prefill:200,decode:200"},
		"same image twice":  {urls: []string{remoteA, dataURL(pngA)}, images: [][]byte{pngA, pngA}, downloaded: 1, wantLegs: "decode:412,encode:200,encode:200,prefill:200,decode:200"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			media.Reset()
			s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, fullPipeline)
			var httpResp *http.Response
			resp, err := s.client.Chat.Completions.New(context.Background(), imageChat("describe these", 4, tc.urls...),
				option.WithResponseInto(&httpResp), option.WithHeader("Authorization", "Bearer user-secret"), option.WithHeader("Cookie", "session=1"))
			if err != nil {
				t.Fatal(err)
			}
			if resp.Choices[0].Message.Content != "describe these describe these" {
				t.Fatalf("answer %q", resp.Choices[0].Message.Content)
			}
			legs := s.legsFor(httpResp.Header.Get("X-Request-Id"))
			if got := profiles(legs); got != tc.wantLegs {
				t.Fatalf("legs %s, want %s", got, tc.wantLegs)
			}
			if got := len(media.Requests()); got != tc.downloaded {
				t.Fatalf("%d downloads, want %d", got, tc.downloaded)
			}
			for _, r := range media.Requests() {
				if r.Header.Get("Authorization") != "" || r.Header.Get("Cookie") != "" {
					t.Fatalf("client credentials reached the media host: %v", r.Header)
				}
			}
			wantHashes := make([]string, len(tc.images))
			for i, img := range tc.images {
				wantHashes[i] = simworker.ImageHash(img)
			}
			// Render saw the inlined body, once.
			render := received(t, s.stack.Render)
			if len(render) != 1 || strings.Contains(mustJSON(t, render[0]), "http://") {
				t.Fatalf("render calls %d: %.200s", len(render), mustJSON(t, render))
			}
			// Encode: one leg per image, each carrying exactly its image and hash.
			enc := received(t, s.stack.Encode[0])
			if len(enc) != len(tc.images) {
				t.Fatalf("%d encode legs, want %d", len(enc), len(tc.images))
			}
			for _, e := range enc {
				h := hashes(t, e, "tokens", "features", "mm_hashes", "image")
				if len(h) != 1 || e["max_tokens"] != 1.0 || e["stream"] != false {
					t.Fatalf("encode leg %.300s", mustJSON(t, e))
				}
			}
			pre := received(t, s.stack.Prefill[0])[0]
			dec := received(t, s.stack.Decode[0])
			final := dec[len(dec)-1]
			if tok, ok := pre["tokens"].(map[string]any); !ok || tok["token_ids"] == nil {
				t.Fatalf("prefill without tokens: %.300s", mustJSON(t, pre))
			}
			if len(tc.images) == 0 {
				if pre["ec_transfer_params"] != nil || pre["tokens"].(map[string]any)["features"] != nil {
					t.Fatalf("text-only prefill carries media fields: %.300s", mustJSON(t, pre))
				}
				return
			}
			if got := hashes(t, pre, "tokens", "features", "mm_hashes", "image"); strings.Join(got, ",") != strings.Join(wantHashes, ",") {
				t.Fatalf("prefill hashes %v, want %v", got, wantHashes)
			}
			ecp := pre["ec_transfer_params"].(map[string]any)
			for _, h := range wantHashes {
				if ecp[h] == nil {
					t.Fatalf("prefill ec params miss %s: %v", h, ecp)
				}
			}
			if strings.Contains(mustJSON(t, final), "ec_transfer_params") || strings.Contains(mustJSON(t, final), "kwargs_data") {
				t.Fatal("decode leg carries EC params or kwargs")
			}
			// Decode: each image part carries its hash as uuid; tokens carry the features.
			var msgs []struct {
				Content []map[string]any `json:"content"`
			}
			if err := json.Unmarshal([]byte(mustJSON(t, final["messages"])), &msgs); err != nil || len(msgs) == 0 {
				t.Fatalf("decode messages %v: %.300s", err, mustJSON(t, final["messages"]))
			}
			var uuids []string
			for _, p := range msgs[0].Content {
				if p["type"] == "image_url" {
					uuids = append(uuids, fmt.Sprint(p["uuid"]))
					if !strings.HasPrefix(p["image_url"].(map[string]any)["url"].(string), "data:image/png;base64,") {
						t.Fatal("decode image not inlined")
					}
				}
			}
			if strings.Join(uuids, ",") != strings.Join(wantHashes, ",") {
				t.Fatalf("decode uuids %v, want %v", uuids, wantHashes)
			}
		})
	}
}

func TestEncodeFanOutIsParallel(t *testing.T) {
	media := startMedia(t)
	s := start(t, stack.Options{EncodeDelay: 300 * time.Millisecond}, "kv-nixl", "ec-nixl", true, fullPipeline)
	urls := []string{media.URL() + "/img/p1.png", media.URL() + "/img/p2.png", media.URL() + "/img/p3.png"}
	start := time.Now()
	var httpResp *http.Response
	if _, err := s.client.Chat.Completions.New(context.Background(), imageChat("three", 2, urls...), option.WithResponseInto(&httpResp)); err != nil {
		t.Fatal(err)
	}
	var enc []gateway.Leg
	for _, l := range s.legsFor(httpResp.Header.Get("X-Request-Id")) {
		if l.Profile == "encode" {
			enc = append(enc, l)
		}
	}
	if len(enc) != 3 {
		t.Fatalf("%d encode legs", len(enc))
	}
	// Every encode leg started before any of them finished: they ran at the same time.
	for _, a := range enc {
		for _, b := range enc {
			if a.Start.After(b.Start.Add(b.Duration)) {
				t.Fatalf("encode legs ran one after another: %+v", enc)
			}
		}
	}
	t.Logf("3 images with 300ms encoders took %s end to end", time.Since(start))
}

func TestTokensInFormat(t *testing.T) {
	media := startMedia(t)
	s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", false, steps("replace-media-urls", "render", "encode", "prefill", "decode"))
	var httpResp *http.Response
	resp, err := s.client.Chat.Completions.New(context.Background(), imageChat("tokens in", 3, media.URL()+"/img/t.png"), option.WithResponseInto(&httpResp))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Message.Content == "" {
		t.Fatal("empty answer")
	}
	encReq, preReq := s.stack.Encode[0].Requests()[0], s.stack.Prefill[0].Requests()[0]
	decReq := s.stack.Decode[0].Requests()[0]
	if encReq.Path != "/inference/v1/generate" || preReq.Path != "/inference/v1/generate" || decReq.Path != "/v1/chat/completions" {
		t.Fatalf("paths: encode %s prefill %s decode %s", encReq.Path, preReq.Path, decReq.Path)
	}
	var enc, pre, dec map[string]any
	for _, leg := range []struct {
		body []byte
		into *map[string]any
	}{{encReq.Body, &enc}, {preReq.Body, &pre}, {decReq.Body, &dec}} {
		if err := json.Unmarshal(leg.body, leg.into); err != nil {
			t.Fatalf("leg body is not JSON (%v): %.300s", err, leg.body)
		}
	}
	hash := simworker.ImageHash(mediaserver.PNG("t"))
	// The encode leg carries the item's kwargs_data, the prefill leg (with ec_transfer_params) its
	// mm_metadata only (TestPrefillMetadataInsteadOfKwargs).
	kw := enc["features"].(map[string]any)["kwargs_data"].(map[string]any)["image"].([]any)
	meta := pre["features"].(map[string]any)["mm_metadata"].(map[string]any)["image"].([]any)
	if hashes(t, enc, "features", "mm_hashes", "image")[0] != hash || kw[0] == nil || meta[0] != simworker.ImageMetadata(mediaserver.PNG("t")) ||
		pre["token_ids"] == nil || pre["messages"] != nil {
		t.Fatalf("tokens-in legs: encode %.200s prefill %.300s", encReq.Body, preReq.Body)
	}
	extra := pre["sampling_params"].(map[string]any)["extra_args"].(map[string]any)
	if extra["kv_transfer_params"] == nil || extra["ec_transfer_params"].(map[string]any)[hash] == nil {
		t.Fatalf("prefill extra_args %v", extra)
	}
	if dec["kv_transfer_params"] == nil || dec["sampling_params"] != nil || dec["messages"] == nil {
		t.Fatalf("decode leg keeps the chat shape: %.300s", decReq.Body)
	}
}

func TestGenerateClientSkipsEncode(t *testing.T) {
	s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, fullPipeline)
	img := mediaserver.PNG("g")
	n := simworker.ImageTokenCount(img)
	ids := []int{1, 4}
	for i := 0; i < n; i++ {
		ids = append(ids, simworker.ImageTokenID)
	}
	ids = append(ids, 555)
	body := fmt.Sprintf(`{"model":"sim-model","token_ids":%s,"features":{"mm_hashes":{"image":[%q]},"mm_placeholders":{"image":[{"offset":2,"length":%d}]},"kwargs_data":{"image":[%q]}},"sampling_params":{"max_tokens":2}}`,
		mustJSON(t, ids), simworker.ImageHash(img), n, base64.StdEncoding.EncodeToString(simworker.ImageKwargsBlob(img)))
	resp, b := s.post("/inference/v1/generate", body, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if got := s.legProfiles(resp); got != "decode:412,prefill:200,decode:200" {
		t.Fatalf("legs %s (encode must be skipped)", got)
	}
	if len(s.stack.Render.Requests()) != 0 {
		t.Fatal("render service called for a tokens-in request")
	}
	pre := received(t, s.stack.Prefill[0])[0]
	if pre["features"] == nil || pre["sampling_params"].(map[string]any)["max_tokens"] != 1.0 {
		t.Fatalf("prefill %.300s", mustJSON(t, pre))
	}
	// A bad tokens-in request is refused before any leg.
	s.stack.Reset()
	resp, b = s.post("/inference/v1/generate", `{"token_ids":[1,2],"features":{"mm_hashes":{"image":["h"]},"mm_placeholders":{"image":[{"offset":1,"length":5}]}}}`, nil)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "outside") || len(s.stack.Gateway.Legs()) != 0 {
		t.Fatalf("%d %s, %d legs", resp.StatusCode, b, len(s.stack.Gateway.Legs()))
	}
}

// connectorPairs runs a media pipeline (download, render, encode, then prefill and decode, or
// prefill-decode for kv-sglang) for every KV×EC connector pair, asks it p twice (unstreamed and
// streamed, each answered "combo test combo"), checks that both prefill legs are one-token legs
// that hand the KV off and carry ec_transfer_params with ec-nixl only, and calls check with each
// of them for the caller's media checks.
func connectorPairs(t *testing.T, p openai.ChatCompletionNewParams, check func(t *testing.T, s *system, pre map[string]any)) {
	t.Helper()
	for _, kv := range []string{"kv-nixl", "kv-sglang", "kv-shared-storage"} {
		for _, ec := range []string{"ec-nixl", "ec-shared-storage"} {
			t.Run(kv+"+"+ec, func(t *testing.T) {
				tail := []string{"prefill", "decode"}
				if kv == "kv-sglang" {
					tail = []string{"prefill-decode"} // SGLang's transfer needs both legs in flight together
				}
				s := start(t, stack.Options{KVConnector: kv, ECConnector: ec}, kv, ec, true, steps(append([]string{"replace-media-urls", "render", "encode"}, tail...)...))
				for _, stream := range []bool{false, true} {
					var text string
					if stream {
						text, _ = streamChat(t, s.client, p)
					} else {
						resp, err := s.client.Chat.Completions.New(context.Background(), p)
						if err != nil {
							t.Fatal(err)
						}
						text = resp.Choices[0].Message.Content
					}
					if text != "combo test combo" {
						t.Fatalf("answer %q", text)
					}
				}
				pres := received(t, s.stack.Prefill[0])
				if len(pres) != 2 {
					t.Fatalf("%d prefill legs, want 2", len(pres))
				}
				for _, pre := range pres {
					kvp, _ := pre["kv_transfer_params"].(map[string]any)
					handoff := kvp["do_remote_decode"] == true
					if kv == "kv-sglang" {
						handoff = kvp == nil && pre["bootstrap_room"] != nil && pre["bootstrap_host"] != nil
					}
					if pre["max_tokens"] != 1.0 || pre["stream"] != false || !handoff {
						t.Fatalf("prefill leg %.400s", mustJSON(t, pre))
					}
					_, hasEC := pre["ec_transfer_params"]
					if hasEC != (ec == "ec-nixl") {
						t.Fatalf("prefill ec_transfer_params present=%v with %s", hasEC, ec)
					}
					check(t, s, pre)
				}
			})
		}
	}
}

// TestEveryConnectorCombination: both prefill legs (one per answer) carry the image's hash and,
// with ec-nixl only, the encoder's descriptor for it.
func TestEveryConnectorCombination(t *testing.T) {
	img := mediaserver.PNG("combo")
	hash := simworker.ImageHash(img)
	connectorPairs(t, imageChat("combo test", 3, dataURL(img)), func(t *testing.T, _ *system, pre map[string]any) {
		if got := hashes(t, pre, "tokens", "features", "mm_hashes", "image"); len(got) != 1 || got[0] != hash {
			t.Fatalf("prefill leg %.400s", mustJSON(t, pre))
		}
		if ecp, hasEC := pre["ec_transfer_params"]; hasEC {
			if m, _ := ecp.(map[string]any); len(m) != 1 || m[hash] == nil {
				t.Fatalf("prefill ec_transfer_params %v, want one for %s", ecp, hash)
			}
		}
	})
}

func TestMediaErrors(t *testing.T) {
	media := startMedia(t)
	s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, fullPipeline)
	tests := map[string]struct {
		url    string
		status int
	}{
		"redirect to metadata": {url: media.URL() + "/redirect?to=http://169.254.169.254/latest", status: 400},
		"media host 500":       {url: media.URL() + "/status/500", status: 502},
		"bad data URL":         {url: "data:image/png;base64", status: 400},
		"not an image":         {url: "data:text/plain;base64,aGk=", status: 400},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s.stack.Reset()
			_, err := s.client.Chat.Completions.New(context.Background(), imageChat("x", 2, tc.url))
			var apiErr *openai.Error
			if !asAPIError(err, &apiErr) || apiErr.StatusCode != tc.status || !strings.Contains(apiErr.Message, "messages[0].content[1]") {
				t.Fatalf("err = %v", err)
			}
			if len(s.stack.Gateway.Legs()) != 0 {
				t.Fatal("a rejected request reached the workers")
			}
		})
	}
}

// hdImage is a deterministic 1920x1080 PNG: a gradient with noise in the low bits, about as
// compressible as a photo.
func hdImage(t *testing.T) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, 1920, 1080))
	x := uint32(2463534242)
	for i := 0; i < len(img.Pix); i += 4 {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		p := i / 4
		img.Pix[i] = byte(p%1920/8) ^ byte(x&7)
		img.Pix[i+1] = byte(p/1920/5) ^ byte(x>>3&7)
		img.Pix[i+2] = byte(p%255) ^ byte(x>>6&7)
		img.Pix[i+3] = 255
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// With a render that answers mm_metadata (vllm-project/vllm#54659) and ec-nixl, the tokens-in
// (generate-format) prefill leg of an image request carries the item's mm_metadata instead of its
// kwargs_data: the prefill worker takes the encoder output from the EC descriptors (the double
// refuses metadata-only items without them, and checks the metadata against the hash and the
// descriptor) and the answer is the same. An older render (no mm_metadata) keeps kwargs_data.
// The legs are generate format because the client speaks chat with use_openai_format false: a
// completions client has no media and a generate client skips encode (no EC descriptors).
func TestPrefillMetadataInsteadOfKwargs(t *testing.T) {
	img := hdImage(t)
	hash := simworker.ImageHash(img)
	sizes := map[bool]int{}
	for _, current := range []bool{false, true} {
		name := map[bool]string{false: "render before vLLM #54659", true: "current render"}[current]
		t.Run(name, func(t *testing.T) {
			pipeline := steps("replace-media-urls", "render", "encode", "prefill", "decode")
			if !current {
				old, err := simworker.Start(simworker.Config{Name: "render-old", RenderWithoutMetadata: true})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = old.Close() })
				pipeline = strings.ReplaceAll(pipeline, "{{render}}", old.URL())
			}
			s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", false, pipeline)
			resp, err := s.client.Chat.Completions.New(context.Background(), imageChat("describe this", 4, dataURL(img)))
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.Choices[0].Message.Content; got != "describe this describe this" {
				t.Fatalf("answer %q", got)
			}
			var pres []simworker.Request
			for _, r := range s.stack.Prefill[0].Requests() {
				if r.Method == http.MethodPost {
					pres = append(pres, r)
				}
			}
			if len(pres) != 1 || pres[0].Path != "/inference/v1/generate" || pres[0].Status != http.StatusOK {
				for _, r := range s.stack.Prefill[0].Requests() {
					t.Logf("prefill worker got %s %s: %d", r.Method, r.Path, r.Status)
				}
				t.Fatalf("%d prefill legs", len(pres))
			}
			var pre struct {
				Features struct {
					MMHashes   map[string][]string `json:"mm_hashes"`
					KwargsData map[string][]string `json:"kwargs_data"`
					MMMetadata map[string][]string `json:"mm_metadata"`
				} `json:"features"`
				SamplingParams struct {
					ExtraArgs struct {
						EC map[string]any `json:"ec_transfer_params"`
					} `json:"extra_args"`
				} `json:"sampling_params"`
			}
			if err := json.Unmarshal(pres[0].Body, &pre); err != nil {
				t.Fatal(err)
			}
			f := pre.Features
			if len(f.MMHashes["image"]) != 1 || f.MMHashes["image"][0] != hash || pre.SamplingParams.ExtraArgs.EC[hash] == nil {
				t.Fatalf("prefill leg %.400s", pres[0].Body)
			}
			if current {
				if f.KwargsData != nil || len(f.MMMetadata["image"]) != 1 || f.MMMetadata["image"][0] != simworker.ImageMetadata(img) {
					t.Fatalf("prefill features carry kwargs_data %v, mm_metadata %v: want the metadata only", f.KwargsData != nil, f.MMMetadata)
				}
			} else if f.MMMetadata != nil || len(f.KwargsData["image"]) != 1 || len(f.KwargsData["image"][0]) < len(img) {
				t.Fatalf("prefill features without render metadata: kwargs_data %d items, mm_metadata %v", len(f.KwargsData["image"]), f.MMMetadata)
			}
			// Encode still gets the whole kwargs_data.
			encs := received(t, s.stack.Encode[0])
			if len(encs) != 1 || !strings.Contains(mustJSON(t, encs[0]), `"kwargs_data"`) {
				t.Fatalf("%d encode legs, without kwargs_data", len(encs))
			}
			sizes[current] = len(pres[0].Body)
		})
	}
	t.Logf("prefill leg body for one %dx%d image of %d bytes: %d bytes with kwargs_data, %d bytes with mm_metadata",
		1920, 1080, len(img), sizes[false], sizes[true])
	if sizes[true] == 0 || sizes[true]*100 > sizes[false] {
		t.Fatalf("prefill leg %d bytes with mm_metadata, %d with kwargs_data: want it at least 100 times smaller", sizes[true], sizes[false])
	}
}

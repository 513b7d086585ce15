package integration

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/test/doubles/gateway"
	"github.com/epd-dev/coordinator/test/doubles/mediaserver"
	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/harness/stack"
)

// avItem is one media part of the audio/video request.
type avItem struct {
	kind, modality string
	bytes          []byte
}

// av is the request of these tests: a text part, then an image, an audio_url (a WAV), an
// input_audio (an MP3) and a video_url (an MP4), downloaded from media (nil: all inline).
type av struct {
	media *mediaserver.Server
	items []avItem
}

func newAV(media *mediaserver.Server, name string) av {
	return av{media: media, items: []avItem{
		{"image_url", simworker.ModalityImage, mediaserver.PNG(name)},
		{"audio_url", simworker.ModalityAudio, mediaserver.WAV(name)},
		{"input_audio", simworker.ModalityAudio, mediaserver.MP3(name)},
		{"video_url", simworker.ModalityVideo, mediaserver.MP4(name)},
	}}
}

// rawPart is a content part sent as raw JSON (the SDK has no audio_url and video_url parts).
func rawPart(raw string) openai.ChatCompletionContentPartUnionParam {
	p := param.Override[openai.ChatCompletionContentPartTextParam](json.RawMessage(raw))
	return openai.ChatCompletionContentPartUnionParam{OfText: &p}
}

// params is the chat request: text, then the parts, with max_tokens.
func (a av) params(text string, maxTokens int64, name string) openai.ChatCompletionNewParams {
	b64 := func(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
	url := func(path, ctype string, b []byte) string {
		if a.media != nil {
			return a.media.URL() + path
		}
		return "data:" + ctype + ";base64," + b64(b)
	}
	it := a.items
	parts := []openai.ChatCompletionContentPartUnionParam{
		openai.TextContentPart(text),
		openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: url("/img/"+name+".png", "image/png", it[0].bytes)}),
		rawPart(fmt.Sprintf(`{"type":"audio_url","audio_url":{"url":%q}}`, url("/audio/"+name+".wav", "audio/wav", it[1].bytes))),
		openai.InputAudioContentPart(openai.ChatCompletionContentPartInputAudioInputAudioParam{Data: b64(it[2].bytes), Format: "mp3"}),
		rawPart(fmt.Sprintf(`{"type":"video_url","video_url":{"url":%q}}`, url("/video/"+name+".mp4", "video/mp4", it[3].bytes))),
	}
	return openai.ChatCompletionNewParams{
		Model:     "sim-model",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(parts)},
		MaxTokens: openai.Int(maxTokens),
	}
}

// hash is item i's mm_hash as the render double computes it.
func (a av) hash(i int) string { return simworker.MediaHash(a.items[i].modality, a.items[i].bytes) }

// hashesOf returns the mm_hashes of modality m, in document order.
func (a av) hashesOf(m string) []string {
	var out []string
	for i, it := range a.items {
		if it.modality == m {
			out = append(out, a.hash(i))
		}
	}
	return out
}

// checkTokens asserts the tokens{token_ids, features} of a chat leg (checkFeatures).
func (a av) checkTokens(t *testing.T, what string, leg map[string]any) {
	t.Helper()
	tok, _ := leg["tokens"].(map[string]any)
	feats, _ := tok["features"].(map[string]any)
	ids, _ := tok["token_ids"].([]any)
	if feats == nil || ids == nil {
		t.Fatalf("%s leg without tokens{token_ids, features}: %.300s", what, mustJSON(t, leg))
	}
	a.checkFeatures(t, what, feats, ids)
}

// checkFeatures asserts the features of a leg: per modality, the items' hashes in document order
// and placeholders of their token counts over the modality's placeholder tokens of ids.
func (a av) checkFeatures(t *testing.T, what string, feats map[string]any, ids []any) {
	t.Helper()
	for _, m := range []string{simworker.ModalityImage, simworker.ModalityAudio, simworker.ModalityVideo} {
		if got, want := hashes(t, feats, "mm_hashes", m), a.hashesOf(m); !slices.Equal(got, want) {
			t.Fatalf("%s mm_hashes.%s = %v, want %v", what, m, got, want)
		}
		k := 0
		places := feats["mm_placeholders"].(map[string]any)[m].([]any)
		for _, it := range a.items {
			if it.modality != m {
				continue
			}
			ph := places[k].(map[string]any)
			off, n := int(ph["offset"].(float64)), int(ph["length"].(float64))
			if n != simworker.MediaTokenCount(m, it.bytes) {
				t.Fatalf("%s mm_placeholders.%s[%d] length %d, want %d", what, m, k, n, simworker.MediaTokenCount(m, it.bytes))
			}
			for _, id := range ids[off : off+n] {
				if int(id.(float64)) != simworker.MediaTokenID(m) {
					t.Fatalf("%s mm_placeholders.%s[%d] covers token %v", what, m, k, id)
				}
			}
			k++
		}
	}
}

// TestAudioVideoFullPipeline sends text, an image, an audio_url, an input_audio and a video_url
// through every step: the media are downloaded and inlined, rendered with their modality, encoded
// one leg per item (4), their EC descriptors merged per item for prefill, and each decode part
// carries its hash.
func TestAudioVideoFullPipeline(t *testing.T) {
	media := startMedia(t)
	a := newAV(media, "full")
	s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, fullPipeline)
	var httpResp *http.Response
	resp, err := s.client.Chat.Completions.New(context.Background(), a.params("listen and watch", 4, "full"), option.WithResponseInto(&httpResp),
		option.WithHeader("Authorization", "Bearer user-secret"))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Choices[0].Message.Content; got != "listen and watch listen" {
		t.Fatalf("answer %q", got)
	}
	if got := s.legProfiles(httpResp); got != "decode:412,encode:200,encode:200,encode:200,encode:200,prefill:200,decode:200" {
		t.Fatalf("legs %s", got)
	}
	downloads := map[string]bool{}
	for _, r := range media.Requests() {
		downloads[r.Path] = true
		if r.Header.Get("Authorization") != "" {
			t.Fatal("client credentials reached the media host")
		}
	}
	if len(media.Requests()) != 3 || !downloads["/img/full.png"] || !downloads["/audio/full.wav"] || !downloads["/video/full.mp4"] {
		t.Fatalf("downloads %v", downloads)
	}
	render := received(t, s.stack.Render)
	if len(render) != 1 || strings.Contains(mustJSON(t, render[0]), "http://") {
		t.Fatalf("render calls %d: %.200s", len(render), mustJSON(t, render))
	}

	// Encode: one leg per item, each with its own part and its modality's single hash.
	enc := received(t, s.stack.Encode[0])
	if len(enc) != 4 {
		t.Fatalf("%d encode legs, want 4", len(enc))
	}
	legOf := map[string]map[string]any{}
	for _, e := range enc {
		feats := e["tokens"].(map[string]any)["features"].(map[string]any)["mm_hashes"].(map[string]any)
		if len(feats) != 1 || e["max_tokens"] != 1.0 || e["stream"] != false {
			t.Fatalf("encode leg %.300s", mustJSON(t, e))
		}
		for _, hs := range feats {
			legOf[hs.([]any)[0].(string)] = e
		}
	}
	for i, it := range a.items {
		e := legOf[a.hash(i)]
		if e == nil {
			t.Fatalf("no encode leg for the %s", it.kind)
		}
		p := e["messages"].([]any)[0].(map[string]any)["content"].([]any)[0].(map[string]any)
		if p["type"] != it.kind {
			t.Fatalf("the %s's encode leg carries a %v part", it.kind, p["type"])
		}
		if it.kind == "input_audio" {
			in := p["input_audio"].(map[string]any)
			if in["format"] != "mp3" || in["data"] != base64.StdEncoding.EncodeToString(it.bytes) {
				t.Fatalf("input_audio encode leg %.200v", in)
			}
		} else if u := p[it.kind].(map[string]any)["url"].(string); !strings.HasPrefix(u, "data:") {
			t.Fatalf("%s encode leg URL %.60s", it.kind, u)
		}
	}

	// Prefill: the features of every modality and one EC descriptor per item.
	pre := received(t, s.stack.Prefill[0])[0]
	a.checkTokens(t, "prefill", pre)
	ecp := pre["ec_transfer_params"].(map[string]any)
	if len(ecp) != 4 {
		t.Fatalf("prefill ec_transfer_params %v, want 4 descriptors", ecp)
	}
	for i, it := range a.items {
		d, _ := ecp[a.hash(i)].(map[string]any)
		if d == nil || d["size_bytes"] != float64(simworker.ImageKwargsSize(len(it.bytes))) || d["peer_host"] == nil {
			t.Fatalf("prefill descriptor of the %s: %v", it.kind, d)
		}
	}

	// Decode: every media part carries its hash as uuid, inlined; no EC params or kwargs.
	dec := received(t, s.stack.Decode[0])
	final := dec[len(dec)-1]
	if strings.Contains(mustJSON(t, final), "ec_transfer_params") || strings.Contains(mustJSON(t, final), "kwargs_data") {
		t.Fatal("decode leg carries EC params or kwargs")
	}
	content := final["messages"].([]any)[0].(map[string]any)["content"].([]any)
	for i, it := range a.items {
		p := content[i+1].(map[string]any)
		if p["type"] != it.kind || p["uuid"] != a.hash(i) {
			t.Fatalf("decode part %d = %.200v, want a %s with uuid %s", i+1, p, it.kind, a.hash(i))
		}
		if it.kind != "input_audio" && !strings.HasPrefix(p[it.kind].(map[string]any)["url"].(string), "data:") {
			t.Fatalf("decode %s not inlined", it.kind)
		}
	}
	a.checkTokens(t, "decode", final)
}

// TestAudioVideoEveryConnectorCombination runs audio and video with every KV×EC connector pair
// the images run with (TestEveryConnectorCombination), streamed and not: the prefill worker
// verifies every item's encoder output (the descriptor against the encoder with ec-nixl, the
// file with ec-shared-storage), and the decode worker the KV hand-off.
func TestAudioVideoEveryConnectorCombination(t *testing.T) {
	a := newAV(nil, "combo")
	connectorPairs(t, a.params("combo test", 3, "combo"), func(t *testing.T, s *system, pre map[string]any) {
		if n := len(received(t, s.stack.Encode[0])); n != 8 {
			t.Fatalf("%d encode legs, want 4 per answer", n)
		}
		a.checkTokens(t, "prefill", pre)
		if ecp, hasEC := pre["ec_transfer_params"]; hasEC {
			m, _ := ecp.(map[string]any)
			for i, it := range a.items {
				if m[a.hash(i)] == nil || len(m) != len(a.items) {
					t.Fatalf("prefill ec_transfer_params %v, want one for the %s", m, it.kind)
				}
			}
		}
	})
}

// A decode-only pipeline sends the rendered features of every modality on its one leg, and a
// conditional-decode hit serves a repeated audio/video request from decode alone.
func TestAudioVideoDecodeOnlyAndConditionalHit(t *testing.T) {
	a := newAV(nil, "dec")
	t.Run("decode only", func(t *testing.T) {
		s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, steps("replace-media-urls", "render", "decode"))
		var httpResp *http.Response
		resp, err := s.client.Chat.Completions.New(context.Background(), a.params("only decode", 3, "dec"), option.WithResponseInto(&httpResp))
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.Choices[0].Message.Content; got != "only decode only" {
			t.Fatalf("answer %q", got)
		}
		if got := s.legProfiles(httpResp); got != "decode:200" {
			t.Fatalf("legs %s", got)
		}
		dec := received(t, s.stack.Decode[0])[0]
		a.checkTokens(t, "decode", dec)
	})
	t.Run("conditional decode miss then hit", func(t *testing.T) {
		s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, fullPipeline)
		var first, second *http.Response
		x, err := s.client.Chat.Completions.New(context.Background(), a.params("hear this", 3, "dec"), option.WithResponseInto(&first))
		if err != nil {
			t.Fatal(err)
		}
		if got := s.legProfiles(first); got != "decode:412,encode:200,encode:200,encode:200,encode:200,prefill:200,decode:200" {
			t.Fatalf("miss legs %s", got)
		}
		y, err := s.client.Chat.Completions.New(context.Background(), a.params("hear this", 3, "dec"), option.WithResponseInto(&second))
		if err != nil {
			t.Fatal(err)
		}
		if got := s.legProfiles(second); got != "decode:200" {
			t.Fatalf("hit legs %s", got)
		}
		if x.Choices[0].Message.Content != "hear this hear" || y.Choices[0].Message.Content != x.Choices[0].Message.Content {
			t.Fatalf("answers %q, %q", x.Choices[0].Message.Content, y.Choices[0].Message.Content)
		}
		dec := received(t, s.stack.Decode[0])
		probe := dec[len(dec)-1]
		a.checkTokens(t, "hit", probe)
		if len(received(t, s.stack.Encode[0])) != 4 {
			t.Fatal("the hit ran encode")
		}
	})
}

// TestAudioVideoEncodeFaults: an encode worker failing the input_audio item's leg. What served
// nothing (a 503, a death mid-answer, a reset, a hang) is retried and the client gets the whole
// answer; a pool that keeps refusing is handled by pipeline.on_pool_failure (aggregate: decode
// serves alone; fail: a 503 pool_unavailable); a worker's rejection (4xx) reaches the client.
func TestAudioVideoEncodeFaults(t *testing.T) {
	a := newAV(nil, "fault")
	audioLeg := `"type":"input_audio"`
	tests := map[string]struct {
		fault  simworker.Fault
		policy string
		// legs are the request's gateway legs; status and msg what the client gets (0: the answer).
		legs string
		// cut: when the item's encode gives up, the other items' encode legs still running are
		// cancelled (the fallback or the failure needs them no more): each ends 200 or 499 by
		// which came first, and counts as its 200 here.
		cut    bool
		status int
		code   string
		msg    string
	}{
		"refuses once (503)": {
			fault: simworker.Fault{Kind: simworker.FaultStatus, Status: http.StatusServiceUnavailable},
			legs:  "encode:200,encode:200,encode:200,encode:200,encode:503,prefill:200,decode:200",
		},
		"dies mid-answer": {
			fault: simworker.Fault{Kind: simworker.FaultDieMidStream},
			legs:  "encode:200,encode:200,encode:200,encode:200,encode:200,prefill:200,decode:200",
		},
		"resets before its headers": {
			fault: simworker.Fault{Kind: simworker.FaultResetBeforeHeaders},
			legs:  "encode:200,encode:200,encode:200,encode:200,encode:503,prefill:200,decode:200",
		},
		"hangs after its headers": {
			fault: simworker.Fault{Kind: simworker.FaultHangAfterHeaders},
			legs:  "encode:200,encode:200,encode:200,encode:200,encode:200,prefill:200,decode:200",
		},
		"hangs before its headers": {
			fault: simworker.Fault{Kind: simworker.FaultHangBeforeHeaders},
			legs:  "encode:200,encode:200,encode:200,encode:200,encode:499,prefill:200,decode:200", // 499: the coordinator gave up on it
		},
		"keeps refusing, aggregate": {
			fault: simworker.Fault{Kind: simworker.FaultStatus, Status: http.StatusServiceUnavailable, Count: 100}, policy: config.OnPoolFailureAggregate,
			legs: "encode:200,encode:200,encode:200,encode:503,encode:503,encode:503,decode:200", cut: true,
		},
		"keeps refusing, fail": {
			fault: simworker.Fault{Kind: simworker.FaultStatus, Status: http.StatusServiceUnavailable, Count: 100}, policy: config.OnPoolFailureFail,
			legs: "encode:200,encode:200,encode:200,encode:503,encode:503,encode:503", cut: true,
			status: http.StatusServiceUnavailable, code: "pool_unavailable", msg: "the encode pool cannot serve the request now; try again later",
		},
		"rejects the audio (400)": {
			fault: simworker.Fault{Kind: simworker.FaultStatus, Status: http.StatusBadRequest,
				Body: `{"error":{"message":"audio decoding failed: unsupported sample rate","type":"BadRequestError","param":null,"code":400}}`},
			status: http.StatusBadRequest, code: "upstream_rejected", msg: "audio decoding failed: unsupported sample rate",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o := stack.Options{Gateway: gateway.Config{EjectFor: -1}} // one encoder: the retry goes to it again
			s := startWith(t, o, "kv-nixl", "ec-nixl", true, steps("replace-media-urls", "render", "encode", "prefill", "decode"), func(c *config.Config) {
				c.Gateway.Timeout = config.Duration(500 * time.Millisecond)
				c.Gateway.IdleTimeout = config.Duration(300 * time.Millisecond)
				c.Gateway.Retry.InitialBackoff = config.Duration(time.Millisecond)
				c.Gateway.Retry.MaxBackoff = config.Duration(5 * time.Millisecond)
				if tc.policy != "" {
					c.Pipeline.OnPoolFailure = tc.policy
				}
			})
			f := tc.fault
			f.Match = audioLeg
			if err := s.stack.Encode[0].InjectFault(f); err != nil {
				t.Fatal(err)
			}
			var httpResp *http.Response
			resp, err := s.client.Chat.Completions.New(context.Background(), a.params("fault test", 3, "fault"), option.WithResponseInto(&httpResp))
			if tc.status == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if got := resp.Choices[0].Message.Content; got != "fault test fault" {
					t.Fatalf("answer %q", got)
				}
			} else {
				var apiErr *openai.Error
				if !asAPIError(err, &apiErr) || apiErr.StatusCode != tc.status || !strings.Contains(apiErr.Message, tc.msg) || (tc.code != "" && apiErr.Code != tc.code) {
					t.Fatalf("err = %v, want HTTP %d %s %q", err, tc.status, tc.code, tc.msg)
				}
				if tc.status == http.StatusServiceUnavailable && apiErr.Response.Header.Get("Retry-After") == "" {
					t.Fatal("a 503 pool_unavailable without Retry-After")
				}
				httpResp = apiErr.Response
			}
			legs := s.legsFor(httpResp.Header.Get("X-Request-Id"))
			if tc.cut {
				legs = slices.Clone(legs)
				for i, l := range legs {
					if l.Profile == "encode" && l.Status == 499 {
						legs[i].Status = http.StatusOK
					}
				}
			}
			if got := sortedLegs(legs); tc.legs != "" && got != tc.legs {
				t.Fatalf("legs %s, want %s", got, tc.legs)
			}
			if tc.legs == "" {
				// A rejection cancels the other encode legs (their statuses vary) and runs nothing after.
				if got := sortedLegs(legs); !strings.Contains(got, "encode:400") || strings.Contains(got, "prefill") || strings.Contains(got, "decode") {
					t.Fatalf("legs %s, want the encode rejection and nothing after it", got)
				}
			}
			// The audio item's leg drew the fault; the others were served on their first attempt.
			var faulted int
			for _, r := range s.stack.Encode[0].Requests() {
				if r.Fault != "" {
					faulted++
					if !strings.Contains(string(r.Body), audioLeg) {
						t.Fatalf("the fault struck another item's leg: %.200s", r.Body)
					}
				}
			}
			if faulted == 0 {
				t.Fatal("no encode leg drew the fault")
			}
			if tc.status == 0 && len(received(t, s.stack.Prefill[0])) == 1 {
				if ecp := received(t, s.stack.Prefill[0])[0]["ec_transfer_params"].(map[string]any); len(ecp) != 4 || ecp[a.hash(2)] == nil {
					t.Fatalf("prefill ec_transfer_params %v, want the input_audio's among 4", ecp)
				}
			}
			if tc.policy == config.OnPoolFailureAggregate {
				dec := received(t, s.stack.Decode[0])[0]
				if _, has := dec["kv_transfer_params"]; has || len(received(t, s.stack.Prefill[0])) != 0 {
					t.Fatal("an aggregated request ran prefill or sent decode KV params")
				}
			}
		})
	}
}

// sortedLegs lists legs as profile:status, the encode legs (run in parallel) sorted by status,
// the others in order.
func sortedLegs(legs []gateway.Leg) string {
	var enc, rest []string
	for _, l := range legs {
		p := fmt.Sprintf("%s:%d", l.Profile, l.Status)
		if l.Profile == "encode" {
			enc = append(enc, p)
		} else {
			rest = append(rest, p)
		}
	}
	slices.Sort(enc)
	return strings.Join(append(enc, rest...), ",")
}

// The media of an audio/video request are counted by modality and source
// (coordinator_media_items_total), and llm-d's media_items puts audio and video under other.
func TestAudioVideoMetrics(t *testing.T) {
	media := startMedia(t) // closed after the coordinator, which holds connections to it
	s, reg, _ := startObserved(t, false)
	a := newAV(media, "metrics")
	if _, err := s.client.Chat.Completions.New(context.Background(), a.params("count me", 2, "metrics")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"coordinator_media_items_total", []string{"modality", "image", "source", "download"}, 1},
		{"coordinator_media_items_total", []string{"modality", "audio", "source", "download"}, 1},
		{"coordinator_media_items_total", []string{"modality", "audio", "source", "inline"}, 1},
		{"coordinator_media_items_total", []string{"modality", "video", "source", "download"}, 1},
		{"coordinator_media_items_total", []string{"modality", "image", "source", "inline"}, 0},
		{"coordinator_encode_fanout", nil, 1},
		{"coordinator_upstream_requests_total", []string{"phase", "encode", "status", "200"}, 4},
		{"llm_d_coordinator_upstream_request_total", []string{"upstream", "media-fetch"}, 3},
		{"llm_d_coordinator_media_items", []string{"media_type", "image"}, 1},
		{"llm_d_coordinator_media_items", []string{"media_type", "other"}, 1},
		{"llm_d_coordinator_execution_path_total", []string{"path", "encode-prefill-decode"}, 1},
	} {
		if got := metricCount(t, reg, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if _, sum := histogram(t, reg, "llm_d_coordinator_media_items", map[string]string{"media_type": "other"}); sum != 3 {
		t.Errorf("llm_d_coordinator_media_items{media_type=other} sum %v, want 3 (two audio items and a video)", sum)
	}
}

// TestAudioVideoMediaErrors: hostile audio and video parts are refused before any leg, with a 400
// naming the part: bytes of another modality whatever their label (WAV bytes in a video_url, a
// PNG in a data: URL claiming audio/wav or in an input_audio), an unknown input_audio format,
// items over their modality's size or count.
func TestAudioVideoMediaErrors(t *testing.T) {
	media := startMedia(t)
	s := startWith(t, stack.Options{}, "kv-nixl", "ec-nixl", true, fullPipeline, func(c *config.Config) {
		c.Pipeline.Steps[0].Params = map[string]any{"modalities": map[string]any{
			"audio": map[string]any{"max_size": 1, "max_items": 2},
			"video": map[string]any{"max_items": 1},
		}}
	})
	b64 := base64.StdEncoding.EncodeToString
	png, wav := mediaserver.PNG("bad"), mediaserver.WAV("bad")
	video := func(u string) openai.ChatCompletionContentPartUnionParam {
		return rawPart(fmt.Sprintf(`{"type":"video_url","video_url":{"url":%q}}`, u))
	}
	audio := func(u string) openai.ChatCompletionContentPartUnionParam {
		return rawPart(fmt.Sprintf(`{"type":"audio_url","audio_url":{"url":%q}}`, u))
	}
	input := func(b []byte, format string) openai.ChatCompletionContentPartUnionParam {
		return openai.InputAudioContentPart(openai.ChatCompletionContentPartInputAudioInputAudioParam{Data: b64(b), Format: format})
	}
	tests := map[string]struct {
		parts []openai.ChatCompletionContentPartUnionParam
		msg   string
	}{
		"WAV bytes downloaded as video/mp4": {[]openai.ChatCompletionContentPartUnionParam{video(media.URL() + "/audio/bad.wav?type=video/mp4")},
			"messages[0].content[1] (video_url): the content is audio/wave, not video media"},
		"an untyped WAV in a video_url": {[]openai.ChatCompletionContentPartUnionParam{video(media.URL() + "/audio/bad.wav?type=none")},
			`messages[0].content[1] (video_url): the downloaded content is "audio/wave"`},
		"a data: URL claiming audio/wav holding a PNG": {[]openai.ChatCompletionContentPartUnionParam{audio("data:audio/wav;base64," + b64(png))},
			"messages[0].content[1] (audio_url): the content is image/png, not audio media"},
		"a PNG as input_audio": {[]openai.ChatCompletionContentPartUnionParam{input(png, "wav")}, "messages[0].content[1] (input_audio): the content is image/png"},
		"an audio item over its size": {[]openai.ChatCompletionContentPartUnionParam{input(append(wav, make([]byte, 1<<20)...), "wav")},
			"more than modalities.audio.max_size (1048576 bytes)"},
		"three audio items": {[]openai.ChatCompletionContentPartUnionParam{audio(media.URL() + "/audio/a.wav"), input(wav, "wav"), audio(media.URL() + "/audio/b.mp3")},
			"too many audio items: got 3, max 2 (modalities.audio.max_items)"},
		"two videos": {[]openai.ChatCompletionContentPartUnionParam{video(media.URL() + "/video/a.mp4"), video(media.URL() + "/video/b.webm")},
			"too many video items: got 2, max 1 (modalities.video.max_items)"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s.stack.Reset()
			media.Reset()
			p := openai.ChatCompletionNewParams{Model: "sim-model", MaxTokens: openai.Int(2), Messages: []openai.ChatCompletionMessageParamUnion{
				openai.UserMessage(append([]openai.ChatCompletionContentPartUnionParam{openai.TextContentPart("x")}, tc.parts...))}}
			_, err := s.client.Chat.Completions.New(context.Background(), p)
			var apiErr *openai.Error
			if !asAPIError(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != "messages" || !strings.Contains(apiErr.Message, tc.msg) {
				msg := ""
				if apiErr != nil {
					msg = apiErr.Message
				}
				t.Fatalf("err = %v (%q), want a 400 saying %q", err, msg, tc.msg)
			}
			if n := len(s.stack.Gateway.Legs()); n != 0 {
				t.Fatalf("a refused request made %d legs", n)
			}
			if strings.HasPrefix(tc.msg, "too many") && len(media.Requests()) != 0 {
				t.Fatalf("%d downloads before the count was checked", len(media.Requests()))
			}
		})
	}
}

// In the tokens-in format (use_openai_format: false) the encode legs carry each item's
// kwargs_data under its modality, and the prefill leg every modality's mm_metadata (the render
// double answers it for audio and video too) with the encoders' descriptors: the prefill worker
// checks each item's metadata against its hash, placeholder and encoder output.
func TestAudioVideoTokensIn(t *testing.T) {
	a := newAV(nil, "gen")
	s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", false, steps("replace-media-urls", "render", "encode", "prefill", "decode"))
	resp, err := s.client.Chat.Completions.New(context.Background(), a.params("tokens in", 3, "gen"))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Choices[0].Message.Content; got != "tokens in tokens" {
		t.Fatalf("answer %q", got)
	}
	var encs []simworker.Request // the legs, not the prefill worker's descriptor lookups
	for _, r := range s.stack.Encode[0].Requests() {
		if r.Method == http.MethodPost {
			encs = append(encs, r)
		}
	}
	if len(encs) != 4 {
		t.Fatalf("%d encode legs, want 4", len(encs))
	}
	seen := map[string]bool{}
	for _, r := range encs {
		var leg struct {
			Features struct {
				MMHashes   map[string][]string `json:"mm_hashes"`
				KwargsData map[string][]string `json:"kwargs_data"`
			} `json:"features"`
		}
		if err := json.Unmarshal(r.Body, &leg); err != nil || r.Path != "/inference/v1/generate" || len(leg.Features.MMHashes) != 1 {
			t.Fatalf("encode leg %s: %.300s", r.Path, r.Body)
		}
		for m, hs := range leg.Features.MMHashes {
			i := slices.IndexFunc(a.items, func(it avItem) bool { return simworker.MediaHash(it.modality, it.bytes) == hs[0] })
			if i < 0 || a.items[i].modality != m || len(leg.Features.KwargsData[m]) != 1 ||
				leg.Features.KwargsData[m][0] != base64.StdEncoding.EncodeToString(simworker.MediaKwargsBlob(m, a.items[i].bytes)) {
				t.Fatalf("encode leg of %s %v: kwargs_data %d items", m, hs, len(leg.Features.KwargsData[m]))
			}
			seen[a.items[i].kind] = true
		}
	}
	if len(seen) != 4 {
		t.Fatalf("encode legs for %v, want one per item", seen)
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
	preReq := s.stack.Prefill[0].Requests()[0]
	if err := json.Unmarshal(preReq.Body, &pre); err != nil || preReq.Path != "/inference/v1/generate" {
		t.Fatalf("prefill leg %s: %v", preReq.Path, err)
	}
	if pre.Features.KwargsData != nil || len(pre.SamplingParams.ExtraArgs.EC) != 4 {
		t.Fatalf("prefill leg: kwargs_data %v, %d descriptors: want metadata only and 4", pre.Features.KwargsData != nil, len(pre.SamplingParams.ExtraArgs.EC))
	}
	for _, m := range []string{simworker.ModalityImage, simworker.ModalityAudio, simworker.ModalityVideo} {
		var want []string
		for _, it := range a.items {
			if it.modality == m {
				want = append(want, simworker.MediaMetadata(m, it.bytes))
			}
		}
		if !slices.Equal(pre.Features.MMHashes[m], a.hashesOf(m)) || !slices.Equal(pre.Features.MMMetadata[m], want) {
			t.Fatalf("prefill features.%s: hashes %v, metadata %v", m, pre.Features.MMHashes[m], pre.Features.MMMetadata[m])
		}
	}
}

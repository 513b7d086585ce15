package media

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/test/doubles/mediaserver"
)

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// urlPart is a part of kind (image_url, audio_url, video_url) with URL u.
func urlPart(kind, u string) string {
	return fmt.Sprintf(`{"type":%q,%q:{"url":%q}}`, kind, kind, u)
}

// audioPart is an input_audio part of data b in format.
func audioPart(b []byte, format string) string {
	return fmt.Sprintf(`{"type":"input_audio","input_audio":{"data":%q,"format":%q}}`, b64(b), format)
}

// TestReplaceMediaURLsModalities sends audio and video (and images) through replace-media-urls:
// each becomes a media entry in document order, with its modality's size limit, count limit and
// media types; bytes that sniff as another modality, or as no media, are refused whatever their
// label says.
func TestReplaceMediaURLsModalities(t *testing.T) {
	media := startMedia(t)
	port := mustPort(t, media.URL())
	net := map[string]any{"allowed_networks": []any{"127.0.0.1/32"}, "allowed_ports": []any{port}}
	with := func(extra map[string]any) map[string]any {
		out := map[string]any{}
		for k, v := range net {
			out[k] = v
		}
		for k, v := range extra {
			out[k] = v
		}
		return out
	}
	png, wav, mp3, mp4, webm := mediaserver.PNG("p"), mediaserver.WAV("w"), mediaserver.MP3("m"), mediaserver.MP4("v"), mediaserver.WebM("v")
	u := media.URL()
	tests := map[string]struct {
		params map[string]any
		parts  []string
		// kinds and types are the entries' kinds and content types, in order; msg (with want
		// status 400 unless status says otherwise) a refusal.
		kinds, types []string
		msg          string
		status       int
	}{
		"every modality, downloaded and inline": {
			parts: []string{urlPart("image_url", u+"/img/a.png"), urlPart("audio_url", u+"/audio/a.wav"), audioPart(mp3, "mp3"),
				urlPart("video_url", u+"/video/a.mp4"), urlPart("video_url", "data:video/webm;base64,"+b64(webm)), urlPart("audio_url", "data:audio/mpeg;base64,"+b64(mp3))},
			kinds: []string{"image_url", "audio_url", "input_audio", "video_url", "video_url", "audio_url"},
			types: []string{"image/png", "audio/wav", "audio/mp3", "video/mp4", "video/webm", "audio/mpeg"},
		},
		"untyped downloads are named by their bytes": {
			parts: []string{urlPart("audio_url", u+"/audio/a.wav?type=none"), urlPart("audio_url", u+"/audio/a.mp3?type=none"),
				urlPart("video_url", u+"/video/a.webm?type=none"), urlPart("video_url", u+"/video/a.mp4?type=application/octet-stream")},
			kinds: []string{"audio_url", "audio_url", "video_url", "video_url"},
			types: []string{"audio/wav", "audio/mpeg", "video/webm", "video/mp4"},
		},
		"a WebM audio file sniffs as video": {
			parts: []string{urlPart("audio_url", u+"/video/a.webm?type=audio/webm")}, kinds: []string{"audio_url"}, types: []string{"audio/webm"},
		},
		"input_audio without a format": {parts: []string{`{"type":"input_audio","input_audio":{"data":"` + b64(wav) + `"}}`}, kinds: []string{"input_audio"}, types: []string{""}},
		// Within the allowed types the label is not held to the bytes (vLLM reads them by content).
		"an MP3 sent as wav":        {parts: []string{audioPart(mp3, "WAV")}, kinds: []string{"input_audio"}, types: []string{"audio/wav"}},
		"a PNG sent as JPEG":        {parts: []string{urlPart("image_url", "data:image/jpeg;base64,"+b64(png))}, kinds: []string{"image_url"}, types: []string{"image/jpeg"}},
		"bytes sniffing can't tell": {parts: []string{audioPart(make([]byte, 600), "wav")}, kinds: []string{"input_audio"}, types: []string{"audio/wav"}},

		// The wrong content for the modality, whatever the label says.
		"audio bytes in a video_url": {parts: []string{urlPart("video_url", u+"/audio/a.wav?type=video/mp4")},
			msg: "messages[1].content[1] (video_url): the content is audio/wave, not video media of an accepted type"},
		"untyped audio bytes in a video_url": {parts: []string{urlPart("video_url", u+"/audio/a.wav?type=none")},
			msg: `messages[1].content[1] (video_url): the downloaded content is "audio/wave", not one of video/mp4`},
		"a data: URL claiming audio/wav holding a PNG": {parts: []string{urlPart("audio_url", "data:audio/wav;base64,"+b64(png))},
			msg: "messages[1].content[1] (audio_url): the content is image/png, not audio media"},
		"input_audio holding a PNG": {parts: []string{audioPart(png, "wav")}, msg: "messages[1].content[1] (input_audio): the content is image/png, not audio media"},
		"a video in an image_url":   {parts: []string{urlPart("image_url", "data:image/png;base64,"+b64(mp4))}, msg: "the content is video/mp4, not image media"},
		"a WAV downloaded as an image": {parts: []string{urlPart("image_url", u+"/audio/a.wav?type=image/png")},
			msg: "(image_url): the content is audio/wave, not image media"},
		"a PNG downloaded as audio": {parts: []string{urlPart("audio_url", u+"/img/a.png?type=audio/wav")}, msg: "the content is image/png, not audio media"},
		"an HTML page as a video":   {parts: []string{urlPart("video_url", "data:video/mp4;base64,"+b64([]byte("<html><body>hi</body></html>")))}, msg: "the content is text/html, not video media"},
		"an audio media type in a video_url": {parts: []string{urlPart("video_url", "data:audio/wav;base64,"+b64(wav))},
			msg: `data: URL media type "audio/wav" is not one of video/mp4, video/webm, video/quicktime`},
		"an unknown input_audio format":   {parts: []string{audioPart(wav, "aiff")}, msg: `input_audio format "aiff" is not one of wav, wave, x-wav, mpeg, mp3`},
		"a non-string input_audio format": {parts: []string{`{"type":"input_audio","input_audio":{"data":"` + b64(wav) + `","format":7}}`}, msg: `input_audio "format" must be a string`},

		// Per-modality allowlists restrict what the bytes are, not only their labels.
		"WAV only: an MP3 labelled audio/wav": {params: map[string]any{"modalities": map[string]any{"audio": map[string]any{"allowed_types": []any{"audio/wav"}}}},
			parts: []string{urlPart("audio_url", u+"/audio/a.mp3?type=audio/wav")}, msg: "the content is audio/mpeg, not audio media of an accepted type (audio/wav)"},
		"WAV only: an mp3 input_audio": {params: map[string]any{"modalities": map[string]any{"audio": map[string]any{"allowed_types": []any{"audio/wav"}}}},
			parts: []string{audioPart(mp3, "mp3")}, msg: `input_audio format "mp3" is not one of wav`},
		"WAV only: a WAV": {params: map[string]any{"modalities": map[string]any{"audio": map[string]any{"allowed_types": []any{"audio/wav"}}}},
			parts: []string{urlPart("audio_url", u+"/audio/a.wav"), audioPart(wav, "wav")}, kinds: []string{"audio_url", "input_audio"}, types: []string{"audio/wav", "audio/wav"}},
		"WebM video only": {params: map[string]any{"modalities": map[string]any{"video": map[string]any{"allowed_types": []any{"video/webm"}}}},
			parts: []string{urlPart("video_url", u+"/video/a.mp4")}, msg: `the downloaded content is "video/mp4", not one of video/webm`},

		// Per-modality sizes.
		"an input_audio over the audio size": {params: map[string]any{"modalities": map[string]any{"audio": map[string]any{"max_size": 1}}},
			parts: []string{audioPart(append(wav, make([]byte, 1<<20)...), "wav")}, msg: "more than modalities.audio.max_size (1048576 bytes)"},
		"an audio download over the audio size": {params: map[string]any{"modalities": map[string]any{"audio": map[string]any{"max_size": 1}}},
			parts: []string{urlPart("audio_url", u+fmt.Sprintf("/big?bytes=%d&type=audio/wav", 1<<20+1))}, msg: "more than modalities.audio.max_size"},
		"a video over the default size": {params: map[string]any{"max_download_size": 1, "modalities": map[string]any{"audio": map[string]any{"max_size": 2}}},
			parts: []string{urlPart("video_url", u+fmt.Sprintf("/big?bytes=%d&chunked=1&type=video/mp4", 1<<20+1))}, msg: "more than max_download_size (1048576 bytes)"},
		"an image within its own size": {params: map[string]any{"max_download_size": 1, "modalities": map[string]any{"image": map[string]any{"max_size": 2}}},
			parts: []string{urlPart("image_url", dataURLOf("image/png", 1<<20+5))}, kinds: []string{"image_url"}, types: []string{"image/png"}},

		// Counts across modalities.
		"more items than max_multimodal_entries": {params: map[string]any{"max_multimodal_entries": 3},
			parts: []string{urlPart("image_url", u+"/img/a.png"), urlPart("audio_url", u+"/audio/a.wav"), audioPart(wav, "wav"), urlPart("video_url", u+"/video/a.mp4")},
			msg:   "too many multimodal items: got 4, max 3 (max_multimodal_entries)"},
		"audio_url and input_audio count as audio": {params: map[string]any{"modalities": map[string]any{"audio": map[string]any{"max_items": 1}}},
			parts: []string{urlPart("image_url", u+"/img/a.png"), urlPart("audio_url", u+"/audio/a.wav"), audioPart(wav, "wav")},
			msg:   "too many audio items: got 2, max 1 (modalities.audio.max_items)"},
		"one video allowed": {params: map[string]any{"modalities": map[string]any{"video": map[string]any{"max_items": 1}}},
			parts: []string{urlPart("video_url", u+"/video/a.mp4"), urlPart("video_url", u+"/video/b.webm"), urlPart("image_url", u+"/img/a.png")},
			msg:   "too many video items: got 2, max 1 (modalities.video.max_items)"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			media.Reset()
			s := newMediaStep(t, with(tc.params), false)
			rc, err := run(t, s, chatWithParts(tc.parts...))
			if tc.msg != "" {
				status := tc.status
				if status == 0 {
					status = 400
				}
				e := apiErr(t, err, status, tc.msg)
				if e.Param != "messages" {
					t.Fatalf("param %q", e.Param)
				}
				if strings.HasPrefix(tc.msg, "too many") && len(media.Requests()) != 0 {
					t.Fatalf("%d downloads before the count was checked", len(media.Requests()))
				}
				if s.inFlight.Held() != 0 {
					t.Fatalf("a refused request holds %d bytes of the budget", s.inFlight.Held())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			noRemoteURL(t, rc)
			if len(rc.Media) != len(tc.kinds) {
				t.Fatalf("media %+v, want kinds %v", rc.Media, tc.kinds)
			}
			for i, m := range rc.Media {
				if m.Kind != tc.kinds[i] || m.ContentType != tc.types[i] || m.Message != 1 || m.Part != i+1 {
					t.Errorf("entry %d = %s %q at %d.%d, want %s %q at 1.%d", i, m.Kind, m.ContentType, m.Message, m.Part, tc.kinds[i], tc.types[i], i+1)
				}
				p := part(t, rc, i+1)
				if m.Kind == "input_audio" {
					if p["input_audio"].(map[string]any)["data"] != m.URL {
						t.Errorf("entry %d: the input_audio data is not the entry's", i)
					}
					continue
				}
				if got := p[m.Kind].(map[string]any)["url"]; got != m.URL || !strings.HasPrefix(m.URL, "data:"+m.ContentType+";base64,") {
					t.Errorf("entry %d: the part's URL %.60v, the entry's %.60s", i, got, m.URL)
				}
			}
		})
	}
}

// TestReplaceMediaURLsModalityParams: every modalities param is validated, with the key and the
// reason, and the effective limits are reported.
func TestReplaceMediaURLsModalityParams(t *testing.T) {
	mods := func(v any) map[string]any { return map[string]any{"modalities": v} }
	audio := func(v map[string]any) map[string]any { return mods(map[string]any{"audio": v}) }
	for name, tc := range map[string]struct {
		own  map[string]any
		key  string
		want string
	}{
		"not a mapping":          {mods([]any{"audio"}), "params.modalities", "must be a mapping of modality (audio, image, video) to its limits"},
		"an unknown modality":    {mods(map[string]any{"sound": map[string]any{}}), "params.modalities.sound", "unknown parameter (this step accepts: audio, image, video)"},
		"a modality not a map":   {mods(map[string]any{"video": 5}), "params.modalities.video", "must be a mapping of max_size, max_items and allowed_types"},
		"an unknown limit":       {audio(map[string]any{"max_bytes": 1}), "params.modalities.audio.max_bytes", "unknown parameter (this step accepts: allowed_types, max_items, max_size)"},
		"size zero":              {audio(map[string]any{"max_size": 0}), "params.modalities.audio.max_size", "at least 1"},
		"size not a number":      {audio(map[string]any{"max_size": "10MiB"}), "params.modalities.audio.max_size", "must be an integer"},
		"size over the request":  {audio(map[string]any{"max_size": 33}), "params.modalities.audio.max_size", "at most max_request_media_size (32 MiB)"},
		"size huge":              {map[string]any{"max_request_media_size": maxMiB / 2, "max_inflight_media_size": maxMiB, "modalities": map[string]any{"video": map[string]any{"max_size": maxMiB + 1}}}, "params.modalities.video.max_size", "at most 1048576 (MiB)"},
		"items zero":             {audio(map[string]any{"max_items": 0}), "params.modalities.audio.max_items", "at least 1"},
		"items over the entries": {map[string]any{"max_multimodal_entries": 4, "modalities": map[string]any{"image": map[string]any{"max_items": 5}}}, "params.modalities.image.max_items", "at most max_multimodal_entries (4)"},
		"types empty":            {audio(map[string]any{"allowed_types": []any{}}), "params.modalities.audio.allowed_types", "at least one media type (leave it out for the defaults: audio/wav"},
		"types not a list":       {audio(map[string]any{"allowed_types": "audio/wav"}), "params.modalities.audio.allowed_types", "list of strings"},
		"a type not a string":    {audio(map[string]any{"allowed_types": []any{1}}), "params.modalities.audio.allowed_types", "item 0 must be a string"},
		"another modality's type": {mods(map[string]any{"video": map[string]any{"allowed_types": []any{"video/mp4", "audio/mp4"}}}), "params.modalities.video.allowed_types",
			`item 1 ("audio/mp4") is not a video/* media type`},
		"not a media type":       {audio(map[string]any{"allowed_types": []any{"wav"}}), "params.modalities.audio.allowed_types", `item 0 ("wav") is not a media type such as audio/wav`},
		"with parameters":        {audio(map[string]any{"allowed_types": []any{"audio/wav; codecs=1"}}), "params.modalities.audio.allowed_types", "has parameters"},
		"an earlier error first": {map[string]any{"max_download_size": 0, "modalities": map[string]any{"audio": map[string]any{"max_size": 0}}}, "params.max_download_size", "at least 1"},
	} {
		t.Run(name, func(t *testing.T) {
			p := params.New("params", tc.own, nil)
			New(p, Options{})
			if key := config.KeyOf(p.Err()); key != tc.key || !strings.Contains(p.Err().Error(), tc.want) {
				t.Fatalf("err = %v, want one naming %s saying %q", p.Err(), tc.key, tc.want)
			}
		})
	}

	// Accepted: the overrides apply, the other modalities keep the step-wide limits, and the
	// effective values are reported.
	p := params.New("params", map[string]any{"max_download_size": 8, "modalities": map[string]any{
		"audio": map[string]any{"max_size": 25, "max_items": 4, "allowed_types": []any{"audio/wav", "Audio/MPEG", "audio/wav"}},
		"video": map[string]any{"max_items": 2},
	}}, nil)
	s := New(p, Options{})
	if p.Err() != nil {
		t.Fatal(p.Err())
	}
	l := s.limits
	if a := l[modAudio]; a.maxSize != 25<<20 || a.sizeParam != "modalities.audio.max_size" || a.maxItems != 4 || fmt.Sprint(a.types) != "[audio/wav audio/mpeg]" {
		t.Errorf("audio %+v", a)
	}
	if v := l[modVideo]; v.maxSize != 8<<20 || v.sizeParam != "max_download_size" || v.maxItems != 2 || v.itemsParam != "modalities.video.max_items" || len(v.types) != 3 {
		t.Errorf("video %+v", v)
	}
	if i := l[modImage]; i.maxSize != 8<<20 || i.maxItems != 32 || i.itemsParam != "max_multimodal_entries" || fmt.Sprint(i.types) != fmt.Sprint(defaultTypes[modImage]) {
		t.Errorf("image %+v", i)
	}
	eff := fmt.Sprint(p.Effective()["modalities"])
	for _, want := range []string{"audio:map[allowed_types:[audio/wav audio/mpeg] max_items:4 max_size:25]", "video:map[allowed_types:[video/mp4 video/webm video/quicktime] max_items:2 max_size:8]", "image:map["} {
		if !strings.Contains(eff, want) {
			t.Errorf("effective modalities %s, want %s", eff, want)
		}
	}
}

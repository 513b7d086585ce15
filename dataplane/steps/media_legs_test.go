package steps

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// The media parts of mixedChat, at messages[1].content[1..5]: two images around an audio_url, an
// input_audio and a video_url.
var mixedParts = []string{
	`{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}`,
	`{"type":"audio_url","audio_url":{"url":"data:audio/wav;base64,BBBB"}}`,
	`{"type":"input_audio","input_audio":{"data":"CCCC","format":"mp3"}}`,
	`{"type":"video_url","video_url":{"url":"data:video/mp4;base64,DAAA"}}`,
	`{"type":"image_url","image_url":{"url":"data:image/png;base64,EEEE"}}`,
}

// renderedMixed is the render service's answer for mixedChat: the features keyed by modality (in
// an order of their own), each modality's items in document order.
const renderedMixed = `{"token_ids":[1,3,100,4,200,32000,32000,32001,32001,32001,32001,32001,32002,32002,32002,32002,32000,7],
 "features":{
  "mm_hashes":{"video":["hv"],"audio":["ha1","ha2"],"image":["hi1","hi2"]},
  "mm_placeholders":{"video":[{"offset":12,"length":4}],"audio":[{"offset":7,"length":3},{"offset":10,"length":2}],"image":[{"offset":5,"length":2},{"offset":16,"length":1}]},
  "kwargs_data":{"audio":["a1","a2"],"image":["i1",null],"video":["v1"]},
  "mm_metadata":{"audio":["bTE=","bTI="],"image":["bTA=","bTM="],"video":["bTQ="]}}}`

// mixedEntry is what each media entry of mixedChat is after render.
var mixedEntries = []struct {
	kind, hash  string
	offset, len int
	kwargs      string
}{
	{"image_url", "hi1", 5, 2, `"i1"`},
	{"audio_url", "ha1", 7, 3, `"a1"`},
	{"input_audio", "ha2", 10, 2, `"a2"`},
	{"video_url", "hv", 12, 4, `"v1"`},
	{"image_url", "hi2", 16, 1, ""},
}

// renderMixed renders mixedChat through the render step against a render service answering
// answer, with or without a replace-media-urls step before it.
func renderMixed(t *testing.T, answer string, replaced bool) (*request.Context, error) {
	t.Helper()
	rc, _ := newRC(t, "/v1/chat/completions", chatWithParts(mixedParts...), nil)
	if replaced {
		if err := newMediaStep(t, nil, false).Execute(t.Context(), rc); err != nil {
			t.Fatal(err)
		}
	}
	svc := newFakeGateway(t, okJSON(answer))
	return rc, newRenderStep(t, svc.srv.URL, nil).Execute(context.Background(), rc)
}

// Render lines its features up with the request's items modality by modality, in document
// order: audio_url and input_audio are both audio, whatever order the modalities come in.
func TestRenderAlignsEveryModality(t *testing.T) {
	for _, replaced := range []bool{true, false} {
		t.Run(fmt.Sprintf("replace-media-urls ran: %v", replaced), func(t *testing.T) {
			rc, err := renderMixed(t, renderedMixed, replaced)
			if err != nil {
				t.Fatal(err)
			}
			if len(rc.Media) != len(mixedEntries) {
				t.Fatalf("entries %+v", rc.Media)
			}
			for i, w := range mixedEntries {
				m := rc.Media[i]
				if m.Kind != w.kind || m.Hash != w.hash || m.Placeholder.Offset != w.offset || m.Placeholder.Length != w.len ||
					string(m.Kwargs) != w.kwargs || m.Message != 1 || m.Part != i+1 || len(m.Metadata) == 0 {
					t.Errorf("entry %d = %+v, want %+v", i, m, w)
				}
			}
		})
	}
	const ids = `[1,3,100,4,200,32000,32000,32001,32001,32001,32001,32001,32002,32002,32002,32002,32000,7]`
	answer := func(hashes, places string) string {
		return `{"token_ids":` + ids + `,"features":{"mm_hashes":{` + hashes + `},"mm_placeholders":{` + places + `}}}`
	}
	const (
		images = `"image":[{"offset":5,"length":2},{"offset":16,"length":1}]`
		audio  = `"audio":[{"offset":7,"length":3},{"offset":10,"length":2}]`
		video  = `"video":[{"offset":12,"length":4}]`
	)
	for name, tc := range map[string]struct{ answer, msg string }{
		"an audio item missing": {
			answer: answer(`"image":["hi1","hi2"],"audio":["ha1"],"video":["hv"]`, images+`,"audio":[{"offset":7,"length":3}],`+video),
			msg:    "render returned 1 audio items, the request has more",
		},
		"no video": {
			answer: answer(`"image":["hi1","hi2"],"audio":["ha1","ha2"]`, images+","+audio),
			msg:    "render returned 0 video items, the request has more",
		},
		"a video too many": {
			answer: answer(`"image":["hi1","hi2"],"audio":["ha1","ha2"],"video":["hv","hw"]`, images+","+audio+`,"video":[{"offset":12,"length":2},{"offset":14,"length":2}]`),
			msg:    "render returned 2 video items, the request has 1",
		},
		"the audio as images": {
			answer: answer(`"image":["hi1","ha1","ha2","hi2"],"video":["hv"]`, `"image":[{"offset":5,"length":2},{"offset":7,"length":3},{"offset":10,"length":2},{"offset":16,"length":1}],`+video),
			msg:    "render returned 0 audio items, the request has more",
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := renderMixed(t, tc.answer, true)
			if e := apierror.From(err); err == nil || e.Status != http.StatusBadGateway || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v (%d), want a 502 saying %q", err, e.Status, tc.msg)
			}
		})
	}
}

// Encode sends one leg per item of any modality, with the item's own part (input_audio's data and
// format, a video_url's URL) and its modality's placeholder tokens and features, and merges the
// descriptors of every modality.
func TestEncodeEveryModality(t *testing.T) {
	descriptor := func(w http.ResponseWriter, c captured) {
		var hash string
		if tok, ok := c.Body["tokens"].(map[string]any); ok {
			for _, hs := range tok["features"].(map[string]any)["mm_hashes"].(map[string]any) {
				hash = hs.([]any)[0].(string)
			}
		} else {
			for _, hs := range c.Body["features"].(map[string]any)["mm_hashes"].(map[string]any) {
				hash = hs.([]any)[0].(string)
			}
		}
		okJSON(`{"ec_transfer_params":{"`+hash+`":{"peer_host":"10.0.0.9","peer_port":5501,"size_bytes":`+fmt.Sprint(len(hash))+`}}}`)(w, c)
	}
	t.Run("chat format", func(t *testing.T) {
		rc, err := renderMixed(t, renderedMixed, true)
		if err != nil {
			t.Fatal(err)
		}
		gw := newFakeGateway(t, descriptor)
		if err := newEncodeStep(t, gw, nil).Execute(context.Background(), rc); err != nil {
			t.Fatal(err)
		}
		legs := gw.requests()
		if len(legs) != 5 {
			t.Fatalf("%d encode legs, want one per item (5)", len(legs))
		}
		byHash := map[string]captured{}
		for _, l := range legs {
			for _, hs := range l.Body["tokens"].(map[string]any)["features"].(map[string]any)["mm_hashes"].(map[string]any) {
				byHash[hs.([]any)[0].(string)] = l
			}
		}
		want := map[string]string{
			"ha1": `{"model":"m","messages":[{"role":"user","content":[{"type":"audio_url","audio_url":{"url":"data:audio/wav;base64,BBBB"}}]}],
			  "tokens":{"token_ids":[1,32001,32001,32001],"features":{"mm_hashes":{"audio":["ha1"]},"mm_placeholders":{"audio":[{"offset":1,"length":3}]}}},"max_tokens":1,"stream":false}`,
			"ha2": `{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"CCCC","format":"mp3"}}]}],
			  "tokens":{"token_ids":[1,32001,32001],"features":{"mm_hashes":{"audio":["ha2"]},"mm_placeholders":{"audio":[{"offset":1,"length":2}]}}},"max_tokens":1,"stream":false}`,
			"hv": `{"model":"m","messages":[{"role":"user","content":[{"type":"video_url","video_url":{"url":"data:video/mp4;base64,DAAA"}}]}],
			  "tokens":{"token_ids":[1,32002,32002,32002,32002],"features":{"mm_hashes":{"video":["hv"]},"mm_placeholders":{"video":[{"offset":1,"length":4}]}}},"max_tokens":1,"stream":false}`,
			"hi2": `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,EEEE"}}]}],
			  "tokens":{"token_ids":[1,32000],"features":{"mm_hashes":{"image":["hi2"]},"mm_placeholders":{"image":[{"offset":1,"length":1}]}}},"max_tokens":1,"stream":false}`,
		}
		for h, body := range want {
			jsonEq(t, "encode leg of "+h, byHash[h].Body, body)
		}
		jsonEq(t, "merged EC params", rc.ECParams, `{"hi1":{"peer_host":"10.0.0.9","peer_port":5501,"size_bytes":3},"hi2":{"peer_host":"10.0.0.9","peer_port":5501,"size_bytes":3},
		  "ha1":{"peer_host":"10.0.0.9","peer_port":5501,"size_bytes":3},"ha2":{"peer_host":"10.0.0.9","peer_port":5501,"size_bytes":3},"hv":{"peer_host":"10.0.0.9","peer_port":5501,"size_bytes":2}}`)
	})
	t.Run("generate format", func(t *testing.T) {
		rc, err := renderMixed(t, renderedMixed, true)
		if err != nil {
			t.Fatal(err)
		}
		gw := newFakeGateway(t, descriptor)
		if err := newEncodeStep(t, gw, map[string]any{"use_openai_format": false}).Execute(context.Background(), rc); err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, l := range gw.requests() {
			for mod := range l.Body["features"].(map[string]any)["mm_hashes"].(map[string]any) {
				seen[mod] = true
			}
			if l.Path != "/inference/v1/generate" {
				t.Fatalf("leg on %s", l.Path)
			}
		}
		byHash := map[string]captured{}
		for _, l := range gw.requests() {
			for _, hs := range l.Body["features"].(map[string]any)["mm_hashes"].(map[string]any) {
				byHash[hs.([]any)[0].(string)] = l
			}
		}
		jsonEq(t, "generate encode leg of ha2", byHash["ha2"].Body, `{"model":"m","token_ids":[1,32001,32001],
		  "features":{"mm_hashes":{"audio":["ha2"]},"mm_placeholders":{"audio":[{"offset":1,"length":2}]},"kwargs_data":{"audio":["a2"]}},
		  "sampling_params":{"max_tokens":1},"stream":false}`)
		jsonEq(t, "generate encode leg of hv", byHash["hv"].Body["features"], `{"mm_hashes":{"video":["hv"]},"mm_placeholders":{"video":[{"offset":1,"length":4}]},"kwargs_data":{"video":["v1"]}}`)
		if len(seen) != 3 || len(rc.ECParams) != 5 {
			t.Fatalf("modalities %v, %d descriptors", seen, len(rc.ECParams))
		}
	})
}

// The prefill and decode legs carry every modality: features keyed by modality (tokens.features
// in the chat format, features with kwargs_data or mm_metadata in the generate format), the EC
// descriptors of every item on prefill only, and each part's mm_hash as its uuid on decode.
func TestPrefillAndDecodeEveryModality(t *testing.T) {
	const (
		hashes = `"mm_hashes":{"image":["hi1","hi2"],"audio":["ha1","ha2"],"video":["hv"]}`
		places = `"mm_placeholders":{"image":[{"offset":5,"length":2},{"offset":16,"length":1}],"audio":[{"offset":7,"length":3},{"offset":10,"length":2}],"video":[{"offset":12,"length":4}]}`
		ids    = `[1,3,100,4,200,32000,32000,32001,32001,32001,32001,32001,32002,32002,32002,32002,32000,7]`
		ec     = `{"hi1":{"peer_port":1},"ha1":{"peer_port":2},"ha2":{"peer_port":3},"hv":{"peer_port":4},"hi2":{"peer_port":5}}`
	)
	descriptors := map[string]any{"hi1": map[string]any{"peer_port": 1}, "ha1": map[string]any{"peer_port": 2}, "ha2": map[string]any{"peer_port": 3},
		"hv": map[string]any{"peer_port": 4}, "hi2": map[string]any{"peer_port": 5}}
	tests := map[string]struct {
		params map[string]any
		ec     bool
		check  func(t *testing.T, body map[string]any)
	}{
		"chat format": {
			params: map[string]any{"ec_connector": "ec-nixl"}, ec: true,
			check: func(t *testing.T, b map[string]any) {
				jsonEq(t, "prefill tokens", b["tokens"], `{"token_ids":`+ids+`,"features":{`+hashes+`,`+places+`}}`)
				jsonEq(t, "prefill ec_transfer_params", b["ec_transfer_params"], ec)
			},
		},
		"generate format with descriptors: metadata": {
			params: map[string]any{"ec_connector": "ec-nixl", "use_openai_format": false}, ec: true,
			check: func(t *testing.T, b map[string]any) {
				jsonEq(t, "prefill features", b["features"], `{`+hashes+`,`+places+`,"mm_metadata":{"image":["bTA=","bTM="],"audio":["bTE=","bTI="],"video":["bTQ="]}}`)
				jsonEq(t, "prefill ec_transfer_params", b["sampling_params"].(map[string]any)["extra_args"].(map[string]any)["ec_transfer_params"], ec)
			},
		},
		"generate format without descriptors: kwargs": {
			params: map[string]any{"use_openai_format": false},
			check: func(t *testing.T, b map[string]any) {
				jsonEq(t, "prefill features", b["features"], `{`+hashes+`,`+places+`,"kwargs_data":{"image":["i1",null],"audio":["a1","a2"],"video":["v1"]}}`)
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rc, err := renderMixed(t, renderedMixed, true)
			if err != nil {
				t.Fatal(err)
			}
			if tc.ec {
				rc.ECParams = descriptors
			}
			gw := newFakeGateway(t, okJSON(`{"id":"p","kv_transfer_params":{"remote_engine_id":"e"}}`))
			if err := newStep(t, PrefillStep, gw, tc.params).Execute(context.Background(), rc); err != nil {
				t.Fatal(err)
			}
			tc.check(t, gw.only().Body)
		})
	}
	t.Run("decode", func(t *testing.T) {
		rc, err := renderMixed(t, renderedMixed, true)
		if err != nil {
			t.Fatal(err)
		}
		rc.ECParams = descriptors
		gw := newFakeGateway(t, okJSON(`{"id":"d","choices":[]}`))
		if err := newStep(t, DecodeStep, gw, nil).Execute(context.Background(), rc); err != nil {
			t.Fatal(err)
		}
		b := gw.only().Body
		jsonEq(t, "decode tokens", b["tokens"], `{"token_ids":`+ids+`,"features":{`+hashes+`,`+places+`}}`)
		content := b["messages"].([]any)[1].(map[string]any)["content"].([]any)
		for i, w := range mixedEntries {
			p := content[i+1].(map[string]any)
			if p["uuid"] != w.hash || p["type"] != w.kind {
				t.Errorf("decode part %d: %v, want a %s with uuid %s", i+1, p, w.kind, w.hash)
			}
		}
		if _, has := b["ec_transfer_params"]; has {
			t.Fatal("the decode leg carries ec_transfer_params")
		}
	})
}

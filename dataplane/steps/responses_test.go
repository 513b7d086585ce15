package steps

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// responsesWithParts is a Responses body whose second input item holds a text part and parts.
func responsesWithParts(parts ...string) string {
	return `{"model":"m","input":[{"role":"system","content":"be brief"},{"type":"message","role":"user","content":[{"type":"input_text","text":"look"}` +
		strings.Repeat(",", min(len(parts), 1)) + strings.Join(parts, ",") + `]}],"store":false}`
}

// TestReplaceMediaURLsResponses: a Responses request's media go through the same guard as chat's
// and stay in the Responses API's own shape (input_image with its URL as a string), since the
// workers serve the Responses API themselves; the chat-only part types are refused.
func TestReplaceMediaURLsResponses(t *testing.T) {
	media := startMedia(t)
	img := media.URL() + "/img/shape.png"
	meta := "http://169.254.169.254/latest/meta-data/"
	tests := map[string]struct {
		part    string
		refused string
	}{
		"input_image string":        {part: `{"type":"input_image","image_url":%q,"detail":"high"}`},
		"input_image object":        {part: `{"type":"input_image","image_url":{"url":%q,"detail":"low"}}`},
		"a remote URL to metadata":  {part: `{"type":"input_image","image_url":"` + meta + `"}%.0s`, refused: "non-public address"},
		"a chat image_url part":     {part: `{"type":"image_url","image_url":{"url":%q}}`, refused: "input_image or input_audio"},
		"a video_url part":          {part: `{"type":"video_url","video_url":%q}`, refused: "input_image or input_audio"},
		"a URL beside the image":    {part: `{"type":"input_image","image_url":%q,"source_url":"http://x/"}`, refused: "only accepted as the media URL"},
		"an input_file with a URL":  {part: `{"type":"input_file","file_url":%q}`, refused: "cannot carry a file_url member"},
		"an input_image not a URL":  {part: `{"type":"input_image","image_url":7}%.0s`, refused: "must be a URL string"},
		"input_audio with a URL":    {part: `{"type":"input_audio","input_audio":{"url":%q}}`, refused: "not a URL"},
		"input_image with no value": {part: `{"type":"input_image","image_url":""}%.0s`, refused: "empty URL"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := newMediaStep(t, map[string]any{"allowed_networks": []any{"127.0.0.1/32"}, "allowed_ports": []any{mustPort(t, media.URL())}}, false)
			rc, _ := newRC(t, request.PathResponses, responsesWithParts(fmt.Sprintf(tc.part, img)), nil)
			err := s.Execute(t.Context(), rc)
			if tc.refused != "" {
				e := apiErr(t, err, 400, "input[1].content[1] (", tc.refused)
				if e.Param != "input" || strings.Contains(e.Message, "169.254") {
					t.Fatalf("param %q, message %q", e.Param, e.Message)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			noRemoteURL(t, rc)
			var b struct {
				Input []struct {
					Content json.RawMessage `json:"content"`
				} `json:"input"`
				Store *bool `json:"store"`
			}
			if err := json.Unmarshal(rc.Body.Bytes(), &b); err != nil {
				t.Fatal(err)
			}
			var parts []map[string]any
			if err := json.Unmarshal(b.Input[1].Content, &parts); err != nil {
				t.Fatal(err)
			}
			got := parts[1]
			u, _ := got["image_url"].(string)
			if got["type"] != "input_image" || !strings.HasPrefix(u, "data:image/png;base64,") || got["detail"] == nil || b.Store == nil {
				t.Fatalf("part %.200v, want input_image with a data: URL string and its detail", got)
			}
			if len(rc.Media) != 1 || rc.Media[0].URL != u || rc.Media[0].Message != 1 || rc.Media[0].Part != 1 {
				t.Fatalf("media %+v", rc.Media)
			}
		})
	}
}

// TestResponsesLegs: a Responses prefill leg is capped with max_output_tokens alone (the API has
// no max_tokens) and stays on /v1/responses; the decode leg gets the rendered tokens, the media
// uuids and the KV parameters; force_stream leaves a Responses request alone.
func TestResponsesLegs(t *testing.T) {
	png := "data:image/png;base64," + strings.Repeat("A", 600)
	rc, _ := newRC(t, request.PathResponses, responsesWithParts(`{"type":"input_image","image_url":"`+png+`"}`), nil)
	rc.Body.Set("max_output_tokens", json.RawMessage("9"))
	rc.Body.Set("stream", json.RawMessage("true"))
	rc.Media = []request.MediaEntry{{Message: 1, Part: 1, Kind: "image_url", URL: png, Hash: "h1", Placeholder: request.Placeholder{Offset: 3, Length: 2}}}
	rc.SetTokenIDs([]int{1, 2, 3, 9, 9})
	rc.Rendered = true
	pre := &prefill{useOpenAI: true}
	obj, err := pre.body(rc, rc.API.Format(true))
	if err != nil {
		t.Fatal(err)
	}
	var leg map[string]any
	if err := json.Unmarshal(obj.Bytes(), &leg); err != nil {
		t.Fatal(err)
	}
	if leg["max_output_tokens"] != 1.0 || leg["max_tokens"] != nil || leg["stream"] != false || leg["store"] != false {
		t.Fatalf("prefill leg %v", leg)
	}
	jsonEq(t, "prefill tokens", leg["tokens"], `{"token_ids":[1,2,3,9,9],"features":{"mm_hashes":{"image":["h1"]},"mm_placeholders":{"image":[{"offset":3,"length":2}]}}}`)
	if rc.API.Format(true).Path() != request.PathResponses || rc.API.Format(false) != request.APIGenerate {
		t.Fatal("a Responses prefill leg goes on /v1/responses, or tokens-in generate")
	}
	dec, err := decodeBody(rc, json.RawMessage(`{"do_remote_prefill":true}`))
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(dec.Bytes(), &d); err != nil {
		t.Fatal(err)
	}
	img := d["input"].([]any)[1].(map[string]any)["content"].([]any)[1].(map[string]any)
	if img["uuid"] != "h1" || img["image_url"] != png || d["kv_transfer_params"] == nil || d["max_output_tokens"] != 9.0 || d["tokens"] == nil {
		t.Fatalf("decode leg %.300v", d)
	}
	if _, ok := (&forceStream{budget: 1 << 30, maxRequest: 1 << 20}).admit(rc); ok {
		t.Fatal("force_stream admitted a Responses request")
	}
}

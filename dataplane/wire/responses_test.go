package wire

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// newRC is the context of a request of format f with body raw.
func newRC(t *testing.T, f Format, raw string) *request.Context {
	t.Helper()
	obj, err := body.Parse([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	return &request.Context{ID: "req-1", API: f.API(), Path: f.Path(), Body: obj, Log: logr.Discard()}
}

// jsonEq compares a decoded leg value with the JSON text want.
func jsonEq(t *testing.T, what string, got any, want string) {
	t.Helper()
	var w any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad want %s: %v", want, err)
	}
	if !reflect.DeepEqual(got, w) {
		g, _ := json.Marshal(got)
		t.Fatalf("%s =\n  %s\nwant\n  %s", what, g, want)
	}
}

// TestResponsesLegs: a Responses prefill leg is capped with max_output_tokens alone (the API has
// no max_tokens) and stays on /v1/responses; the decode leg gets the rendered tokens, the media
// uuids and the KV parameters; force_stream leaves a Responses request alone.
func TestResponsesLegs(t *testing.T) {
	png := "data:image/png;base64," + strings.Repeat("A", 600)
	rc := newRC(t, Responses, `{"model":"m","input":[{"role":"system","content":"be brief"},{"type":"message","role":"user","content":[{"type":"input_text","text":"look"},{"type":"input_image","image_url":"`+png+`"}]}],"store":false}`)
	rc.Body.Set("max_output_tokens", json.RawMessage("9"))
	rc.Body.Set("stream", json.RawMessage("true"))
	rc.Media = []request.MediaEntry{{Message: 1, Part: 1, Kind: "image_url", URL: png, Hash: "h1", Placeholder: request.Placeholder{Offset: 3, Length: 2}}}
	rc.SetTokenIDs([]int{1, 2, 3, 9, 9})
	rc.Rendered = true
	obj, err := Responses.Legs(true).Prefill(rc, Transfer{})
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
	if Responses.Legs(true).Path() != "/v1/responses" || Responses.Legs(false) != Generate {
		t.Fatal("a Responses prefill leg goes on /v1/responses, or tokens-in generate")
	}
	dec, err := Responses.Decode(rc, rc.Body, json.RawMessage(`{"do_remote_prefill":true}`))
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
	if _, _, why := FoldBound(rc); why != "unsupported" {
		t.Fatalf("force_stream would fold a Responses request (%q)", why)
	}
}

package steps

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// responsesWithParts is a Responses body whose second input item holds a text part and parts.
func responsesWithParts(parts ...string) string {
	return `{"model":"m","input":[{"role":"system","content":"be brief"},{"type":"message","role":"user","content":[{"type":"input_text","text":"look"}` +
		strings.Repeat(",", min(len(parts), 1)) + strings.Join(parts, ",") + `]}],"store":false}`
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

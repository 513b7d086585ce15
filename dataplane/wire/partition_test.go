package wire

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// Every leg of every phase, in the client's format and in tokens-in generate, carries the
// client's model, cache_salt and prompt_cache_key unchanged: workers and the picker never mix
// the caches of tenants that asked to be apart.
func TestLegsCarryPartitionKeys(t *testing.T) {
	const img = "data:image/png;base64,iVBORw0KGgo="
	partition := `"model":"lora-a","cache_salt":"s\u00e9l-1","prompt_cache_key":"user-42\u2028"`
	clients := map[string]struct {
		api  request.API
		body string
	}{
		"chat":        {request.APIChat, `{` + partition + `,"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"` + img + `"}}]}],"max_tokens":5}`},
		"completions": {request.APICompletions, `{` + partition + `,"prompt":"hi","max_tokens":5}`},
		"responses":   {request.APIResponses, `{` + partition + `,"input":[{"role":"user","content":[{"type":"input_text","text":"hi"},{"type":"input_image","image_url":"` + img + `"}]}]}`},
		"generate":    {request.APIGenerate, `{` + partition + `,"token_ids":[1,2,3],"sampling_params":{"max_tokens":5}}`},
	}
	want, err := body.Parse([]byte(`{` + partition + `}`))
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range clients {
		for _, openAI := range []bool{true, false} {
			obj, err := body.Parse([]byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			f := Of(c.api)
			rc := &request.Context{ID: "r1", API: c.api, Body: obj, Rendered: true, TokenIDs: []int{1, 9, 9, 2}}
			if f.Media() != nil {
				rc.Media = []request.MediaEntry{{Message: 0, Part: 1, Kind: "image_url", URL: img, Hash: "h1",
					Placeholder: request.Placeholder{Offset: 1, Length: 2}, Kwargs: json.RawMessage(`"a3c="`)}}
			}
			legs := f.Legs(openAI)
			check := func(phase string, leg *body.Object, err error) {
				t.Helper()
				if err != nil {
					t.Fatalf("%s openai=%v %s: %v", name, openAI, phase, err)
				}
				for _, k := range []string{"model", "cache_salt", "prompt_cache_key"} {
					w, _ := want.Get(k)
					got, ok := leg.Get(k)
					if !ok || string(got) != string(w) {
						t.Errorf("%s openai=%v %s leg: %s = %s, want %s (%s)", name, openAI, phase, k, got, w, leg.Bytes())
					}
				}
			}
			check("conditional-decode", f.Conditional(rc), nil)
			dec, err := f.Decode(rc, rc.Body, json.RawMessage(`{"do_remote_prefill":true}`))
			check("decode", dec, err)
			pre, err := legs.Prefill(rc, Transfer{KV: json.RawMessage(`{}`), EC: json.RawMessage(`{}`)})
			check("prefill", pre, err)
			if len(rc.Media) == 0 {
				continue // no encode legs
			}
			_, item, err := legs.Encoder(rc)
			if err != nil {
				t.Fatal(err)
			}
			if item != nil {
				enc, err := item(0)
				check("encode", enc, err)
			}
		}
	}
}

// cache_salt and prompt_cache_key are strings of at most MaxPartitionKeyLen bytes.
func TestPartitionKeysBounded(t *testing.T) {
	long := strings.Repeat("k", MaxPartitionKeyLen)
	tests := map[string]struct {
		member   string
		wantErr  bool
		wantText string
	}{
		"salt at the limit":        {`"cache_salt":"` + long + `"`, false, ""},
		"salt over the limit":      {`"cache_salt":"` + long + `k"`, true, "at most 1024 bytes"},
		"cache key over the limit": {`"prompt_cache_key":"` + long + `k"`, true, "at most 1024 bytes"},
		"salt not a string":        {`"cache_salt":{"a":1}`, true, "cache_salt"},
		"cache key not a string":   {`"prompt_cache_key":7`, true, "prompt_cache_key"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := ClientFor("/v1/chat/completions").Parse([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],`+tc.member+`}`), Limits{})
			if (err != nil) != tc.wantErr || (err != nil && !strings.Contains(err.Error(), tc.wantText)) {
				t.Fatalf("err = %v, want error %v containing %q", err, tc.wantErr, tc.wantText)
			}
		})
	}
}

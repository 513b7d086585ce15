package wire

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// legClients are a client body of each API, with the partition members partition and an image
// where the API carries media.
func legClients(partition string) map[string]struct {
	api  request.API
	body string
} {
	const img = "data:image/png;base64,iVBORw0KGgo="
	return map[string]struct {
		api  request.API
		body string
	}{
		"chat":        {request.APIChat, `{` + partition + `,"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"` + img + `"}}]}],"max_tokens":5}`},
		"completions": {request.APICompletions, `{` + partition + `,"prompt":"hi","max_tokens":5}`},
		"responses":   {request.APIResponses, `{` + partition + `,"input":[{"role":"user","content":[{"type":"input_text","text":"hi"},{"type":"input_image","image_url":"` + img + `"}]}]}`},
		"generate":    {request.APIGenerate, `{` + partition + `,"token_ids":[1,2,3],"sampling_params":{"max_tokens":5}}`},
	}
}

// eachLeg builds every leg of every phase of a rendered request of api with body raw (ids set by
// setIDs; an image where the API carries media), in the client's format (openAI) or tokens-in
// generate, and calls check with each.
func eachLeg(t *testing.T, api request.API, raw string, openAI bool, setIDs func(*request.Context), check func(phase string, leg *body.Object, err error)) {
	t.Helper()
	obj, err := body.Parse([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	f := Of(api)
	rc := &request.Context{ID: "r1", API: api, Body: obj, Rendered: true}
	setIDs(rc)
	if f.Media() != nil {
		rc.Media = []request.MediaEntry{{Message: 0, Part: 1, Kind: "image_url", URL: "data:image/png;base64,iVBORw0KGgo=", Hash: "h1",
			Placeholder: request.Placeholder{Offset: 1, Length: 2}, Kwargs: json.RawMessage(`"a3c="`)}}
	}
	legs := f.Legs(openAI)
	check("conditional-decode", f.Conditional(rc), nil)
	dec, err := f.Decode(rc, rc.Body, json.RawMessage(`{"do_remote_prefill":true}`))
	check("decode", dec, err)
	pre, err := legs.Prefill(rc, Transfer{KV: json.RawMessage(`{}`), EC: json.RawMessage(`{}`)})
	check("prefill", pre, err)
	if len(rc.Media) == 0 {
		return // no encode legs
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

// Every leg of every phase, in the client's format and in tokens-in generate, carries the
// client's model, cache_salt and prompt_cache_key unchanged: workers and the picker never mix
// the caches of tenants that asked to be apart.
func TestLegsCarryPartitionKeys(t *testing.T) {
	partition := `"model":"lora-a","cache_salt":"s\u00e9l-1","prompt_cache_key":"user-42\u2028"`
	want, err := body.Parse([]byte(`{` + partition + `}`))
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range legClients(partition) {
		for _, openAI := range []bool{true, false} {
			eachLeg(t, c.api, c.body, openAI, func(rc *request.Context) { rc.SetTokenIDs([]int{1, 9, 9, 2}) }, func(phase string, leg *body.Object, err error) {
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
			})
		}
	}
}

// A prompt's ids held as shared chunks (a later turn's history, as the rendered-history cache
// keeps it) make every leg byte for byte what the same ids in one slice make, and a leg's
// buffers send the chunks' JSON where the cache holds it: not copied.
func TestLegsShareChunkedIDs(t *testing.T) {
	history := []byte("1,9") // the cache's JSON list of the chunk {1, 9}
	chunked := func(rc *request.Context) {
		rc.SetTokenChunks([][]int32{{1, 9}}, []int{9, 2}, [][]byte{[]byte("["), history, []byte(",9,2]")})
	}
	flat := func(rc *request.Context) { rc.SetTokenIDs([]int{1, 9, 9, 2}) }
	for name, c := range legClients(`"model":"m"`) {
		for _, openAI := range []bool{true, false} {
			var want []string
			eachLeg(t, c.api, c.body, openAI, flat, func(_ string, leg *body.Object, _ error) { want = append(want, string(leg.Bytes())) })
			i := 0
			eachLeg(t, c.api, c.body, openAI, chunked, func(phase string, leg *body.Object, err error) {
				t.Helper()
				bufs, n := leg.Buffers()
				got := string(bytes.Join(bufs, nil))
				if err != nil || got != want[i] || int(n) != len(got) || string(leg.Bytes()) != got {
					t.Fatalf("%s openai=%v %s leg (err %v):\n%s\nwant\n%s", name, openAI, phase, err, got, want[i])
				}
				shared := slices.ContainsFunc(bufs, func(b []byte) bool { return len(b) > 0 && &b[0] == &history[0] })
				if ids := strings.Contains(got, "1,9,9,2"); ids != shared {
					t.Errorf("%s openai=%v %s leg: sends the ids %v, the cache's list where it is %v", name, openAI, phase, ids, shared)
				}
				i++
			})
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

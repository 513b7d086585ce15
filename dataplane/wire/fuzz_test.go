package wire

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"unsafe"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// FuzzParseBody: for every format, Native.Parse never panics, rejects with a client-facing 400 only,
// and what it accepts is a JSON object with the fields each format relies on, well typed; the
// model it returns does not share the body's memory (it outlives the request).
func FuzzParseBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":8}`,
		`{"model":"m","prompt":"once","max_tokens":8.0,"min_tokens":1,"stream_options":{"include_usage":true}}`,
		`{"model":"m","prompt":[1,2,3]}`,
		`{"model":"m","token_ids":[1,2,3],"sampling_params":{"temperature":0.5}}`,
		`{"model":"m\u00e9\"","messages":[],"stream":null,"max_completion_tokens":null}`,
		`{"model":1,"messages":[]}`, `{"stream":"yes","messages":[]}`, `{"max_tokens":1.5,"messages":[]}`,
		`{"stream_options":[],"messages":[]}`, `{"prompt":{}}`, `{"token_ids":[1],"sampling_params":[]}`,
		`{"messages":`, `null`, `[{"prompt":"x"}]`, ``, "{\"model\":\"\xff\",\"messages\":[]}",
	} {
		for api := range 3 {
			f.Add([]byte(s), uint8(api))
		}
	}
	f.Fuzz(func(t *testing.T, raw []byte, apiSel uint8) {
		api := []request.API{request.APIChat, request.APICompletions, request.APIGenerate}[int(apiSel)%3]
		req, err := Native{F: Of(api)}.Parse(raw, Limits{})
		var obj *body.Object
		var model string
		var stream bool
		if err == nil {
			obj, model, stream = req.Body, req.Model, req.Stream
		}
		if err != nil {
			var ae *apierror.Error
			if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Message == "" {
				t.Fatalf("Parse(%q, %v): %#v, want a 400 *apierror.Error", raw, api, err)
			}
			return
		}
		if obj == nil || !json.Valid(raw) {
			t.Fatalf("Parse(%q, %v) accepted it", raw, api)
		}
		if m, _, err := obj.String("model"); err != nil || m != model {
			t.Fatalf("model %q, the body has %q (%v)", model, m, err)
		}
		if s, _, err := obj.Bool("stream"); err != nil || s != stream {
			t.Fatalf("stream %v, the body has %v (%v)", stream, s, err)
		}
		if len(model) > 0 && len(raw) > 0 {
			p, start := uintptr(unsafe.Pointer(unsafe.StringData(model))), uintptr(unsafe.Pointer(&raw[0]))
			if p >= start && p < start+uintptr(len(raw)) {
				t.Fatalf("the model %q shares the body's memory", model)
			}
		}
		for _, k := range []string{"max_tokens", "max_completion_tokens", "min_tokens"} {
			if _, _, err := obj.Int(k); err != nil {
				t.Fatalf("%s accepted: %v", k, err)
			}
		}
		if k := obj.Kind("stream_options"); k != body.KindNone && k != body.KindNull && k != body.KindObject {
			t.Fatalf("stream_options of kind %v accepted", k)
		}
		switch api {
		case request.APIChat:
			if obj.Kind("messages") != body.KindArray {
				t.Fatal("chat without a messages array accepted")
			}
		case request.APICompletions:
			if k := obj.Kind("prompt"); k != body.KindString && k != body.KindArray {
				t.Fatal("completions without a string or array prompt accepted")
			}
		case request.APIGenerate:
			if k := obj.Kind("sampling_params"); obj.Kind("token_ids") != body.KindArray || k != body.KindNone && k != body.KindNull && k != body.KindObject {
				t.Fatal("generate without token_ids or with odd sampling_params accepted")
			}
		}
	})
}

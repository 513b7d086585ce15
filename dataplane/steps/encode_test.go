package steps

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

func newEncodeStep(t *testing.T, gw *fakeGateway, own map[string]any) pipeline.Step {
	t.Helper()
	p := params.New("pipeline.steps[1].params", own, map[string]any{"ec_connector": "ec-nixl", "use_openai_format": true})
	s, err := newEncode(builder.Deps{Gateway: gw.client(), Log: logr.Discard(), Key: "pipeline.steps[1]"}, p)
	if err == nil {
		err = p.Err()
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func twoImageRC(t *testing.T, path string) *request.Context {
	rc, _ := newRC(t, path, chatWithImages("data:image/png;base64,AAAA", "data:image/png;base64,BBBB"), nil)
	rc.Rendered = true
	rc.SetTokenIDs([]int{1, 4, 9, 32000, 32000, 32000, 32000, 32000, 7})
	rc.Media = []request.MediaEntry{
		{Message: 1, Part: 1, Kind: "image_url", Hash: "ha", Placeholder: request.Placeholder{Offset: 3, Length: 2}, Kwargs: []byte(`"a3dh"`)},
		{Message: 1, Part: 2, Kind: "image_url", Hash: "hb", Placeholder: request.Placeholder{Offset: 5, Length: 3}},
	}
	return rc
}

func TestEncodeFanOut(t *testing.T) {
	var inFlight, peak atomic.Int32
	gw := newFakeGateway(t, func(w http.ResponseWriter, c captured) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(50 * time.Millisecond)
		var hash string
		if tok, ok := c.Body["tokens"].(map[string]any); ok {
			hash = tok["features"].(map[string]any)["mm_hashes"].(map[string]any)["image"].([]any)[0].(string)
		}
		okJSON(`{"id":"e","ec_transfer_params":{"`+hash+`":{"peer_host":"10.0.0.9","peer_port":5501}}}`)(w, c)
	})
	s := newEncodeStep(t, gw, nil)
	rc := twoImageRC(t, "/v1/chat/completions")
	if err := s.Execute(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	if peak.Load() != 2 {
		t.Fatalf("encode legs did not overlap (peak %d)", peak.Load())
	}
	legs := gw.requests()
	byHash := map[string]captured{}
	ids := map[string]bool{} // the picker keys per-request state on x-request-id: one per leg
	for _, l := range legs {
		ids[l.Header.Get("X-Request-Id")] = true
		if l.Header.Get("EPP-Profile") != "encode" || l.Path != "/v1/chat/completions" || !strings.HasPrefix(l.Header.Get("X-Request-Id"), "req-1-encode-") ||
			l.Header.Get("X-Coordinator-Request-Id") != "req-1" {
			t.Fatalf("leg %s %v", l.Path, l.Header)
		}
		tok := l.Body["tokens"].(map[string]any)
		byHash[tok["features"].(map[string]any)["mm_hashes"].(map[string]any)["image"].([]any)[0].(string)] = l
	}
	if len(ids) != len(legs) {
		t.Fatalf("%d encode legs share %d x-request-ids", len(legs), len(ids))
	}
	jsonEq(t, "encode leg for image 0", byHash["ha"].Body, `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA","detail":"low"}}]}],
		"tokens":{"token_ids":[1,32000,32000],"features":{"mm_hashes":{"image":["ha"]},"mm_placeholders":{"image":[{"offset":1,"length":2}]}}},"max_tokens":1,"stream":false}`)
	jsonEq(t, "encode leg for image 1", byHash["hb"].Body["tokens"], `{"token_ids":[1,32000,32000,32000],"features":{"mm_hashes":{"image":["hb"]},"mm_placeholders":{"image":[{"offset":1,"length":3}]}}}`)
	jsonEq(t, "merged EC params", rc.ECParams, `{"ha":{"peer_host":"10.0.0.9","peer_port":5501},"hb":{"peer_host":"10.0.0.9","peer_port":5501}}`)
}

func TestEncodeGenerateFormat(t *testing.T) {
	gw := newFakeGateway(t, okJSON(`{"request_id":"e"}`))
	s := newEncodeStep(t, gw, map[string]any{"use_openai_format": false, "max_parallel": 1})
	rc := twoImageRC(t, "/v1/chat/completions")
	if err := s.Execute(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	legs := gw.requests()
	if len(legs) != 2 || legs[0].Path != "/inference/v1/generate" {
		t.Fatalf("legs %+v", legs)
	}
	for _, l := range legs {
		if l.Body["token_ids"].([]any)[0] == nil {
			t.Fatal("no tokens")
		}
	}
	var first captured
	for _, l := range legs {
		if len(l.Body["token_ids"].([]any)) == 3 {
			first = l
		}
	}
	jsonEq(t, "generate encode leg", first.Body, `{"model":"m","token_ids":[1,32000,32000],
		"features":{"mm_hashes":{"image":["ha"]},"mm_placeholders":{"image":[{"offset":1,"length":2}]},"kwargs_data":{"image":["a3dh"]}},
		"sampling_params":{"max_tokens":1},"stream":false}`)
	if len(rc.ECParams) != 0 {
		t.Fatalf("no descriptors were returned: %v", rc.ECParams)
	}
}

func TestEncodeSkips(t *testing.T) {
	gw := newFakeGateway(t, func(http.ResponseWriter, captured) { t.Error("encode must not be called") })
	s := newEncodeStep(t, gw, nil)
	text, _ := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, nil)
	if err := s.Execute(context.Background(), text); err != nil {
		t.Fatal(err)
	}
	gen, _ := newRC(t, "/inference/v1/generate", `{"token_ids":[1,9,9]}`, nil)
	gen.Media = []request.MediaEntry{{Kind: "image_url", Hash: "h", Placeholder: request.Placeholder{Offset: 1, Length: 2}}}
	if err := s.Execute(context.Background(), gen); err != nil {
		t.Fatal(err)
	}
}

func TestEncodeFailures(t *testing.T) {
	tests := map[string]struct {
		answer func(http.ResponseWriter, captured)
		status int
		msg    string
	}{
		"conflicting descriptors": {
			answer: func() func(http.ResponseWriter, captured) {
				var n atomic.Int32
				return func(w http.ResponseWriter, c captured) {
					okJSON(fmt.Sprintf(`{"ec_transfer_params":{"same":{"peer_port":%d}}}`, n.Add(1)))(w, c)
				}
			}(),
			status: 502, msg: "encode",
		},
		"one encoder fails with 5xx": {
			answer: func(w http.ResponseWriter, c captured) {
				if strings.Contains(string(c.Raw), `"hb"`) {
					http.Error(w, "oom", http.StatusInternalServerError)
					return
				}
				okJSON(`{}`)(w, c)
			},
			status: 502, msg: "encode[1]",
		},
		"encoder rejects with 4xx": {
			answer: func(w http.ResponseWriter, _ captured) { http.Error(w, "bad image", http.StatusBadRequest) },
			status: 400, msg: "rejected",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			gw := newFakeGateway(t, tc.answer)
			s := newEncodeStep(t, gw, nil)
			rc := twoImageRC(t, "/v1/chat/completions")
			err := s.Execute(context.Background(), rc)
			e := apierror.From(err)
			if err == nil || e.Status != tc.status || !strings.Contains(e.Message, tc.msg) {
				t.Fatalf("err = %v -> %d %q", err, e.Status, e.Message)
			}
		})
	}
}

func TestEncodeNeedsRender(t *testing.T) {
	cfg := config.Default()
	cfg.Gateway.Address = "http://gw:80"
	cfg.Pipeline.Steps = []config.Step{{Type: EncodeStep}, {Type: RenderStep, Params: map[string]any{"address": "http://r"}}, {Type: DecodeStep}}
	_, err := builder.Build(cfg, builder.Options{})
	if err == nil || !strings.Contains(err.Error(), "pipeline.steps[0]: encode needs a render step before it (it sends each item's mm_hash and placeholder)") {
		t.Fatalf("err = %v", err)
	}
}

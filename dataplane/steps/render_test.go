package steps

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/test/harness/refused"
)

func newRenderStep(t *testing.T, addr string, own map[string]any) pipeline.Step {
	t.Helper()
	all := map[string]any{"address": addr}
	for k, v := range own {
		all[k] = v
	}
	p := params.New("params", all, nil)
	s, err := newRender(builder.Deps{Log: logr.Discard()}, p)
	if err == nil {
		err = p.Err()
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const renderedTwoImages = `{"request_id":"r","model":"m","token_ids":[1,4,9,32000,32000,32000,32000,32000,7],
 "features":{"mm_hashes":{"image":["ha","hb"]},"mm_placeholders":{"image":[{"offset":3,"length":2},{"offset":5,"length":3}]},"kwargs_data":{"image":["a3dh",null]}}}`

func TestRenderChat(t *testing.T) {
	svc := newFakeGateway(t, okJSON(renderedTwoImages))
	s := newRenderStep(t, svc.srv.URL, nil)
	rc, _ := newRC(t, "/v1/chat/completions", chatWithImages("data:image/png;base64,AAAA", "data:image/png;base64,BBBB"),
		http.Header{"Authorization": {"Bearer k"}})
	if err := s.Execute(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	leg := svc.only()
	if leg.Path != "/v1/chat/completions/render" || leg.Header.Get("X-Request-Id") != "req-1" || leg.Header.Get("EPP-Profile") != "" ||
		leg.Header.Get("Authorization") != "Bearer k" {
		t.Fatalf("render leg %s %v", leg.Path, leg.Header)
	}
	if !rc.Rendered || rc.TokenCount() != 9 || len(rc.Media) != 2 {
		t.Fatalf("rc = %+v", rc)
	}
	a, b := rc.Media[0], rc.Media[1]
	if a.Hash != "ha" || a.Placeholder.Offset != 3 || a.Placeholder.Length != 2 || string(a.Kwargs) != `"a3dh"` || a.Part != 1 ||
		b.Hash != "hb" || b.Placeholder.Length != 3 || b.Kwargs != nil || b.Part != 2 {
		t.Fatalf("entries %+v", rc.Media)
	}
	if string(rc.Body.Bytes()) != chatWithImages("data:image/png;base64,AAAA", "data:image/png;base64,BBBB") {
		t.Fatal("render changed the chat body")
	}
	if js := string(rc.TokenIDsJSON()); js != "[1,4,9,32000,32000,32000,32000,32000,7]" {
		t.Fatalf("the ids' JSON is %s", js)
	}
}

// TestRenderAnswerIDs: the render service's token_ids are sent on as the service wrote them
// when that is how the legs write them, and written again otherwise.
func TestRenderAnswerIDs(t *testing.T) {
	for _, tc := range []struct{ answer, want string }{
		{`{"token_ids":[151643,0,7]}`, `[151643,0,7]`},
		{`{"token_ids": [ 151643, 0,7 ] , "features": null}`, `[151643,0,7]`},
		{`{"token_ids":[2382766391,0,7]}`, `[2382766391,0,7]`}, // the vLLM simulator's ids are 32-bit hashes
	} {
		svc := newFakeGateway(t, okJSON(tc.answer))
		s := newRenderStep(t, svc.srv.URL, nil)
		rc, _ := newRC(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
		if err := s.Execute(context.Background(), rc); err != nil {
			t.Fatal(err)
		}
		if js := string(rc.TokenIDsJSON()); rc.TokenCount() != 3 || rc.TokenID(1) != 0 || js != tc.want {
			t.Errorf("answer %s: ids %v, JSON %s; want %s", tc.answer, rc.TokenIDs(), js, tc.want)
		}
	}
}

func TestRenderChatFailures(t *testing.T) {
	tests := map[string]struct {
		answer func(http.ResponseWriter, captured)
		params map[string]any
		status int
		msg    string
	}{
		"count mismatch is a 502": {
			answer: okJSON(`{"token_ids":[1,32000],"features":{"mm_hashes":{"image":["ha"]},"mm_placeholders":{"image":[{"offset":1,"length":1}]},"kwargs_data":{"image":[null]}}}`),
			status: 502,
		},
		"placeholder out of bounds is a 502": {
			answer: okJSON(`{"token_ids":[1,2],"features":{"mm_hashes":{"image":["ha","hb"]},"mm_placeholders":{"image":[{"offset":1,"length":1},{"offset":1,"length":9}]}}}`),
			status: 502,
		},
		"render 4xx forwarded": {
			answer: func(w http.ResponseWriter, _ captured) { http.Error(w, "nope", http.StatusBadRequest) },
			status: 400,
		},
		"render 5xx is a 502": {
			answer: func(w http.ResponseWriter, _ captured) { http.Error(w, "nope", http.StatusInternalServerError) },
			status: 502,
		},
		"garbage answer": {answer: okJSON(`<html>`), status: 502},
		"no token_ids":   {answer: okJSON(`{"features":null}`), status: 502},
		"a token id that is not one": {
			answer: okJSON(`{"token_ids":[1,-2]}`), status: 502,
		},
		"a token id past what JSON carries exactly": {
			answer: okJSON(`{"token_ids":[1,9007199254740992]}`), status: 502,
		},
		"features that are not an object": {
			answer: okJSON(`{"token_ids":[1,2],"features":3}`), status: 502,
		},
		"token limit": {
			answer: okJSON(renderedTwoImages), params: map[string]any{"max_total_tokens": 8},
			status: 400, msg: "too many total tokens: got 9, max 8",
		},
		"placeholder limit": {
			answer: okJSON(renderedTwoImages), params: map[string]any{"max_total_placeholder_tokens": 4},
			status: 400, msg: "too many placeholder tokens: got 5, max 4",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			svc := newFakeGateway(t, tc.answer)
			s := newRenderStep(t, svc.srv.URL, tc.params)
			rc, _ := newRC(t, "/v1/chat/completions", chatWithImages("data:image/png;base64,AAAA", "data:image/png;base64,BBBB"), nil)
			err := s.Execute(context.Background(), rc)
			e := apierror.From(err)
			if err == nil || e.Status != tc.status || !strings.Contains(e.Message, tc.msg) {
				t.Fatalf("err = %v -> %d %q", err, e.Status, e.Message)
			}
		})
	}
}

func TestRenderCompletions(t *testing.T) {
	tests := map[string]struct {
		prompt  string
		answer  string
		calls   int
		want    []int
		status  int
		msg     string
		params  map[string]any
		rewrite bool
	}{
		"string prompt":     {prompt: `"a b c"`, answer: `[{"token_ids":[1,5,6,7],"features":null}]`, calls: 1, want: []int{1, 5, 6, 7}, rewrite: true},
		"token prompt":      {prompt: `[1,2,3]`, want: []int{1, 2, 3}},
		"empty prompt":      {prompt: `[]`, want: []int{}},
		"negative token":    {prompt: `[1,-2]`, status: 400, msg: "non-negative"},
		"batched strings":   {prompt: `["a","b"]`, status: 400, msg: "batched"},
		"batched tokens":    {prompt: `[[1],[2]]`, status: 400, msg: "batched"},
		"object prompt":     {prompt: `{}`, status: 400, msg: "must be a string"},
		"two-element reply": {prompt: `"a"`, answer: `[{"token_ids":[1]},{"token_ids":[2]}]`, calls: 1, status: 502},
		"token limit":       {prompt: `[1,2,3]`, params: map[string]any{"max_total_tokens": 2}, status: 400, msg: "got 3, max 2"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			svc := newFakeGateway(t, okJSON(tc.answer))
			s := newRenderStep(t, svc.srv.URL, tc.params)
			rc, _ := newRC(t, "/v1/completions", `{"model":"m","prompt":`+tc.prompt+`}`, nil)
			err := s.Execute(context.Background(), rc)
			if n := len(svc.requests()); n != tc.calls {
				t.Fatalf("%d render calls, want %d", n, tc.calls)
			}
			if tc.status != 0 {
				if e := apierror.From(err); err == nil || e.Status != tc.status || !strings.Contains(e.Message, tc.msg) {
					t.Fatalf("err = %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if rc.TokenCount() != len(tc.want) {
				t.Fatalf("tokens %v, want %v", rc.TokenIDs(), tc.want)
			}
			for i := range tc.want {
				if rc.TokenID(i) != tc.want[i] {
					t.Fatalf("tokens %v, want %v", rc.TokenIDs(), tc.want)
				}
			}
			if tc.rewrite {
				if p, _ := rc.Body.Get("prompt"); string(p) != "[1,5,6,7]" {
					t.Fatalf("prompt not rewritten: %s", p)
				}
				if svc.only().Path != "/v1/completions/render" {
					t.Fatal(svc.only().Path)
				}
			}
		})
	}
}

func TestRenderGenerateValidation(t *testing.T) {
	good := `"features":{"mm_hashes":{"image":["ha"]},"mm_placeholders":{"image":[{"offset":1,"length":2}]},"kwargs_data":{"image":["a3dh"]}}`
	tests := map[string]struct {
		body   string
		params map[string]any
		msg    string
		media  int
	}{
		"valid with image":     {body: `{"token_ids":[1,9,9,4],` + good + `,"sampling_params":{"max_tokens":3,"extra_args":{}}}`, media: 1},
		"valid text only":      {body: `{"token_ids":[1,2]}`},
		"null features":        {body: `{"token_ids":[1,2],"features":null}`},
		"kwargs null (cached)": {body: `{"token_ids":[1,9,9],"features":{"mm_hashes":{"image":["ha"]},"mm_placeholders":{"image":[{"offset":1,"length":2}]},"kwargs_data":{"image":[null]}}}`, media: 1},
		"no kwargs":            {body: `{"token_ids":[1,9,9],"features":{"mm_hashes":{"image":["ha"]},"mm_placeholders":{"image":[{"offset":1,"length":2}]}}}`, media: 1},
		"empty hashes":         {body: `{"token_ids":[1],"features":{"mm_hashes":{"image":[]}}}`},
		"empty tokens":         {body: `{"token_ids":[]}`, msg: "must not be empty"},
		"string tokens":        {body: `{"token_ids":["a"]}`, msg: "non-negative integers"},
		"negative tokens":      {body: `{"token_ids":[1,-1]}`, msg: "non-negative integers"},
		"token limit":          {body: `{"token_ids":[1,2,3]}`, params: map[string]any{"max_total_tokens": 2}, msg: "got 3, max 2"},
		"sampling not object":  {body: `{"token_ids":[1],"sampling_params":[]}`, msg: "must be an object"},
		"extra_args not obj":   {body: `{"token_ids":[1],"sampling_params":{"extra_args":1}}`, msg: "extra_args"},
		"features not object":  {body: `{"token_ids":[1],"features":[1]}`, msg: "features"},
		"hashes not array":     {body: `{"token_ids":[1],"features":{"mm_hashes":{"image":"h"}}}`, msg: "mm_hashes.image must be an array"},
		"missing placeholders": {body: `{"token_ids":[1,2],"features":{"mm_hashes":{"image":["h"]}}}`, msg: "mm_placeholders.image"},
		"placeholder count":    {body: `{"token_ids":[1,2],"features":{"mm_hashes":{"image":["h","i"]},"mm_placeholders":{"image":[{"offset":0,"length":1}]}}}`, msg: "one placeholder per hash"},
		"kwargs count":         {body: `{"token_ids":[1,2],"features":{"mm_hashes":{"image":["h"]},"mm_placeholders":{"image":[{"offset":0,"length":1}]},"kwargs_data":{"image":[]}}}`, msg: "kwargs_data.image"},
		"kwargs item type":     {body: `{"token_ids":[1,2],"features":{"mm_hashes":{"image":["h"]},"mm_placeholders":{"image":[{"offset":0,"length":1}]},"kwargs_data":{"image":[5]}}}`, msg: "string or null"},
		"hash not a string":    {body: `{"token_ids":[1,2],"features":{"mm_hashes":{"image":[1]},"mm_placeholders":{"image":[{"offset":0,"length":1}]}}}`, msg: "non-empty string"},
		"negative offset":      {body: `{"token_ids":[1,2],"features":{"mm_hashes":{"image":["h"]},"mm_placeholders":{"image":[{"offset":-1,"length":1}]}}}`, msg: "non-negative integers"},
		"fractional length":    {body: `{"token_ids":[1,2],"features":{"mm_hashes":{"image":["h"]},"mm_placeholders":{"image":[{"offset":0,"length":1.5}]}}}`, msg: "non-negative integers"},
		"out of bounds":        {body: `{"token_ids":[1,2],"features":{"mm_hashes":{"image":["h"]},"mm_placeholders":{"image":[{"offset":1,"length":2}]}}}`, msg: "outside the 2 prompt tokens"},
		"offset at end":        {body: `{"token_ids":[1,2],"features":{"mm_hashes":{"image":["h"]},"mm_placeholders":{"image":[{"offset":2,"length":0}]}}}`, msg: "outside"},
		"placeholder limit":    {body: `{"token_ids":[1,9,9,4],` + good + `}`, params: map[string]any{"max_total_placeholder_tokens": 1}, msg: "too many placeholder tokens"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			svc := newFakeGateway(t, func(w http.ResponseWriter, _ captured) { t.Error("generate must not call render") })
			s := newRenderStep(t, svc.srv.URL, tc.params)
			rc, _ := newRC(t, "/inference/v1/generate", tc.body, nil)
			err := s.Execute(context.Background(), rc)
			if tc.msg != "" {
				wantBadRequest(t, err, tc.msg)
				return
			}
			if err != nil || len(rc.Media) != tc.media || !rc.Rendered {
				t.Fatalf("err = %v media = %v", err, rc.Media)
			}
			if string(rc.Body.Bytes()) != tc.body {
				t.Fatal("generate body changed")
			}
		})
	}
}

func TestRenderParams(t *testing.T) {
	for name, tc := range map[string]struct {
		own map[string]any
		key string
	}{
		"no address":       {map[string]any{}, "params.address"},
		"bad address":      {map[string]any{"address": "render:8000"}, "params.address"},
		"negative tokens":  {map[string]any{"address": "http://r", "max_total_tokens": -1}, "params.max_total_tokens"},
		"timeout no unit":  {map[string]any{"address": "http://r", "timeout": "30"}, "params.timeout"},
		"negative idle":    {map[string]any{"address": "http://r", "max_idle_conns_per_host": -1}, "params.max_idle_conns_per_host"},
		"unknown param":    {map[string]any{"address": "http://r", "adress": "http://r"}, "params.adress"}, //nolint:misspell // on purpose
		"placeholder type": {map[string]any{"address": "http://r", "max_total_placeholder_tokens": "10"}, "params.max_total_placeholder_tokens"},
	} {
		t.Run(name, func(t *testing.T) {
			p := params.New("params", tc.own, nil)
			_, _ = newRender(builder.Deps{}, p)
			if key := config.KeyOf(p.Err()); key != tc.key {
				t.Fatalf("err = %v, want one naming %s", p.Err(), tc.key)
			}
		})
	}
}

// A render answer's mm_metadata (vllm-project/vllm#54659) is kept per item, raw, beside its
// kwargs_data; null items and an absent or null field leave Metadata nil.
func TestRenderChatMetadata(t *testing.T) {
	const head = `{"token_ids":[1,4,9,32000,32000,32000,32000,32000,7],"features":{"mm_hashes":{"image":["ha","hb"]},` +
		`"mm_placeholders":{"image":[{"offset":3,"length":2},{"offset":5,"length":3}]},"kwargs_data":{"image":["a3dh","a3di"]}`
	tests := map[string]struct {
		meta   string
		wantA  string
		wantB  string
		status int
		msg    string
	}{
		"both items":     {meta: `,"mm_metadata":{"image":["bWV0YQ==","bWV0Yg=="]}`, wantA: `"bWV0YQ=="`, wantB: `"bWV0Yg=="`},
		"one null item":  {meta: `,"mm_metadata":{"image":[null,"bWV0Yg=="]}`, wantB: `"bWV0Yg=="`},
		"absent":         {},
		"null":           {meta: `,"mm_metadata":null`},
		"null modality":  {meta: `,"mm_metadata":{"image":null}`},
		"wrong length":   {meta: `,"mm_metadata":{"image":["bWV0YQ=="]}`, status: 502, msg: "mm_metadata.image must be an array with one item per hash (2)"},
		"unknown modal.": {meta: `,"mm_metadata":{"image":["x","y"],"video":["z"]}`, status: 502, msg: "mm_metadata.video names a modality without mm_hashes"},
		"not an object":  {meta: `,"mm_metadata":["x","y"]`, status: 502, msg: "mm_metadata must be an object"},
		"non-string":     {meta: `,"mm_metadata":{"image":["x",{"image_grid_thw":[1,2,2]}]}`, status: 502, msg: "mm_metadata.image[1] must be a string or null"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			svc := newFakeGateway(t, okJSON(head+tc.meta+`}}`))
			s := newRenderStep(t, svc.srv.URL, nil)
			rc, _ := newRC(t, "/v1/chat/completions", chatWithImages("data:image/png;base64,AAAA", "data:image/png;base64,BBBB"), nil)
			err := s.Execute(context.Background(), rc)
			if tc.status != 0 {
				var up *apierror.UpstreamError
				if e := apierror.From(err); !errors.As(err, &up) || e.Status != tc.status || !strings.Contains(err.Error(), "features."+tc.msg) {
					t.Fatalf("err = %v (%d), want %d naming features.%s", err, e.Status, tc.status, tc.msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			a, b := rc.Media[0], rc.Media[1]
			if string(a.Metadata) != tc.wantA || string(b.Metadata) != tc.wantB || string(a.Kwargs) != `"a3dh"` || string(b.Kwargs) != `"a3di"` {
				t.Fatalf("metadata %q %q, kwargs %q %q", a.Metadata, b.Metadata, a.Kwargs, b.Kwargs)
			}
		})
	}
}

// A tokens-in client's features may carry mm_metadata too: validated like a render answer's, a
// bad shape is a 400 naming the field.
func TestRenderGenerateMetadataValidation(t *testing.T) {
	feats := func(meta string) string {
		return `{"token_ids":[1,9,9,4,9],"features":{"mm_hashes":{"image":["ha","hb"]},"mm_placeholders":{"image":[{"offset":1,"length":2},{"offset":4,"length":1}]}` + meta + `}}`
	}
	tests := map[string]struct {
		meta string
		msg  string // "" for valid
		want []string
	}{
		"valid":                   {meta: `,"mm_metadata":{"image":["bQ==",null]}`, want: []string{`"bQ=="`, ""}},
		"null":                    {meta: `,"mm_metadata":null`, want: []string{"", ""}},
		"empty object":            {meta: `,"mm_metadata":{}`, want: []string{"", ""}},
		"string":                  {meta: `,"mm_metadata":"bQ=="`, msg: "features.mm_metadata must be an object of per-modality lists, or null"},
		"number":                  {meta: `,"mm_metadata":5`, msg: "features.mm_metadata must be an object"},
		"list not an array":       {meta: `,"mm_metadata":{"image":"bQ=="}`, msg: "features.mm_metadata.image must be an array with one item per hash (2)"},
		"too short":               {meta: `,"mm_metadata":{"image":["bQ=="]}`, msg: "features.mm_metadata.image must be an array with one item per hash (2)"},
		"too long":                {meta: `,"mm_metadata":{"image":["bQ==","bQ==","bQ=="]}`, msg: "features.mm_metadata.image must be an array with one item per hash (2)"},
		"modality without hashes": {meta: `,"mm_metadata":{"image":[null,null],"audio":["bQ=="]}`, msg: "features.mm_metadata.audio names a modality without mm_hashes"},
		"number item":             {meta: `,"mm_metadata":{"image":["bQ==",7]}`, msg: "features.mm_metadata.image[1] must be a string or null"},
		"array item":              {meta: `,"mm_metadata":{"image":[["bQ=="],null]}`, msg: "features.mm_metadata.image[0] must be a string or null"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			svc := newFakeGateway(t, func(w http.ResponseWriter, _ captured) { t.Error("generate must not call render") })
			s := newRenderStep(t, svc.srv.URL, nil)
			rc, _ := newRC(t, "/inference/v1/generate", feats(tc.meta), nil)
			err := s.Execute(context.Background(), rc)
			if tc.msg != "" {
				wantBadRequest(t, err, tc.msg)
				return
			}
			if err != nil || len(rc.Media) != 2 {
				t.Fatalf("err = %v media = %v", err, rc.Media)
			}
			for i, m := range rc.Media {
				if string(m.Metadata) != tc.want[i] {
					t.Fatalf("item %d metadata %q, want %q", i, m.Metadata, tc.want[i])
				}
			}
		})
	}
}

// wantBadRequest fails unless err is a 400 whose message says msg.
func wantBadRequest(t *testing.T, err error, msg string) {
	t.Helper()
	var e *apierror.Error
	if !errors.As(err, &e) || e.Status != 400 || !strings.Contains(e.Message, msg) {
		t.Fatalf("err = %v, want 400 with %q", err, msg)
	}
}

// TestRenderServiceFaults: what a client gets when the render service hangs past the step's
// timeout, dies in the middle of its answer, or refuses the connection.
func TestRenderServiceFaults(t *testing.T) {
	tests := map[string]struct {
		url func(t *testing.T) string
	}{
		"hangs": {url: func(t *testing.T) string {
			return newFakeGatewayReq(t, func(_ http.ResponseWriter, _ captured, r *http.Request) { <-r.Context().Done() }).srv.URL
		}},
		"dies mid-answer": {url: func(t *testing.T) string {
			return newFakeGatewayReq(t, func(w http.ResponseWriter, _ captured, _ *http.Request) {
				conn, buf, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n{\"token_ids\":[1,2")
				_ = buf.Flush()
				_ = conn.Close()
			}).srv.URL
		}},
		"refuses": {url: func(t *testing.T) string { return "http://" + refused.Addr(t) }},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := newRenderStep(t, tc.url(t), map[string]any{"timeout": "300ms"})
			rc, _ := newRC(t, "/v1/chat/completions", chatWithImages("data:image/png;base64,AAAA"), nil)
			err := s.Execute(context.Background(), rc)
			e := apierror.From(err)
			// A 502 naming the phase (the hung call ended by the step's timeout), and nothing of
			// the service's address.
			if err == nil || e.Status != http.StatusBadGateway || !strings.HasPrefix(e.Message, "render failed") ||
				strings.Contains(e.Message, "127.0.0.1") {
				t.Fatalf("err = %v -> %d %q; want a 502 \"render failed\" without the address", err, e.Status, e.Message)
			}
		})
	}
}

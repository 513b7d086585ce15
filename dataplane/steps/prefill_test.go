package steps

import (
	"context"
	"encoding/binary"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	"golang.org/x/crypto/blake2s"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/pipeline/registry"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
)

func rendered(rc *request.Context) {
	rc.Rendered = true
	rc.SetTokenIDs([]int{1, 4, 32000, 32000, 32000, 777})
	rc.Media = []request.MediaEntry{{Message: 0, Part: 1, Kind: "image_url", Hash: "h1", Placeholder: request.Placeholder{Offset: 2, Length: 3}, Kwargs: []byte(`"a3dhcmdz"`)}}
}

func TestPrefillLegBodies(t *testing.T) {
	const chat = `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}],"stream":true,"stream_options":{"include_usage":true},"min_tokens":2,"max_tokens":50,"temperature":0.5}`
	tests := map[string]struct {
		path, body string
		params     map[string]any
		prepare    func(rc *request.Context)
		wantPath   string
		want       string
	}{
		"chat without render": {
			path: "/v1/chat/completions", body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":9,"stream":true}`,
			wantPath: "/v1/chat/completions",
			want:     `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":1,"stream":false,"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false}}`,
		},
		"chat rendered with EC descriptors": {
			path: "/v1/chat/completions", body: chat, params: map[string]any{"ec_connector": "ec-nixl", "kv_connector": "kv-nixl"},
			prepare: func(rc *request.Context) {
				rendered(rc)
				rc.ECParams = map[string]any{"h1": map[string]any{"peer_host": "10.0.0.1", "peer_port": 5501}}
			},
			wantPath: "/v1/chat/completions",
			want: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}],"stream":false,"max_tokens":1,"temperature":0.5,
			        "tokens":{"token_ids":[1,4,32000,32000,32000,777],"features":{"mm_hashes":{"image":["h1"]},"mm_placeholders":{"image":[{"offset":2,"length":3}]}}},
			        "kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_block_ids":null,"remote_engine_id":null,"remote_host":null,"remote_port":null},
			        "ec_transfer_params":{"h1":{"peer_host":"10.0.0.1","peer_port":5501}}}`,
		},
		"shared-storage EC sends no descriptors": {
			path: "/v1/chat/completions", body: `{"model":"m","messages":[]}`,
			prepare:  func(rc *request.Context) { rc.ECParams = map[string]any{"h1": map[string]any{}} },
			wantPath: "/v1/chat/completions",
			want:     `{"model":"m","messages":[],"max_tokens":1,"stream":false,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false}}`,
		},
		"completions keeps sampling fields": {
			path: "/v1/completions", body: `{"model":"m","prompt":"a b","max_tokens":20,"min_tokens":5,"temperature":0.1,"stream":true}`,
			prepare:  func(rc *request.Context) { rc.Rendered = true; rc.SetTokenIDs([]int{1, 2, 3}) },
			wantPath: "/v1/completions",
			want:     `{"model":"m","prompt":[1,2,3],"max_tokens":1,"temperature":0.1,"stream":false,"request_id":"req-1","kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false}}`,
		},
		"generate client keeps its sampling params": {
			path: "/inference/v1/generate", body: `{"model":"m","token_ids":[1,2],"sampling_params":{"max_tokens":8,"min_tokens":2,"temperature":0.3,"extra_args":{"mine":1}},"stream":true}`,
			wantPath: "/inference/v1/generate",
			want:     `{"model":"m","token_ids":[1,2],"sampling_params":{"max_tokens":1,"temperature":0.3,"extra_args":{"mine":1,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false}}},"stream":false,"request_id":"req-1"}`,
		},
		"chat client in tokens-in format": {
			path: "/v1/chat/completions", body: chat, params: map[string]any{"use_openai_format": false, "ec_connector": "ec-nixl"},
			prepare: func(rc *request.Context) {
				rendered(rc)
				rc.ECParams = map[string]any{"h1": map[string]any{"peer_port": 1}}
			},
			wantPath: "/inference/v1/generate",
			want: `{"model":"m","token_ids":[1,4,32000,32000,32000,777],
			        "features":{"mm_hashes":{"image":["h1"]},"mm_placeholders":{"image":[{"offset":2,"length":3}]},"kwargs_data":{"image":["a3dhcmdz"]}},
			        "request_id":"req-1","sampling_params":{"max_tokens":1,"extra_args":{"ec_transfer_params":{"h1":{"peer_port":1}},"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false}}},"stream":false}`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			gw := newFakeGateway(t, okJSON(`{"id":"x","choices":[]}`))
			s := newStep(t, PrefillStep, gw, tc.params)
			rc, rec := newRC(t, tc.path, tc.body, http.Header{"Authorization": {"Bearer k"}, "Prefer": {"if-available"}, "X-Custom": {"a", "b"}})
			if tc.prepare != nil {
				tc.prepare(rc)
			}
			if err := s.Execute(context.Background(), rc); err != nil {
				t.Fatal(err)
			}
			got := gw.only()
			if got.Path != tc.wantPath || got.Method != http.MethodPost {
				t.Fatalf("leg %s %s, want POST %s", got.Method, got.Path, tc.wantPath)
			}
			jsonEq(t, "prefill body", got.Body, tc.want)
			h := got.Header
			if h.Get("EPP-Profile") != "prefill" || h.Get("X-Request-Id") != "req-1-prefill" || h.Get("X-Coordinator-Request-Id") != "req-1" || h.Get("Content-Type") != "application/json" ||
				h.Get("Authorization") != "Bearer k" || h.Get("Prefer") != "" || len(h.Values("X-Custom")) != 2 {
				t.Fatalf("leg headers %v", h)
			}
			if rec.Body.Len() != 0 || !rc.Prefilled {
				t.Fatal("prefill must not write to the client and must mark the request prefilled")
			}
		})
	}
}

func TestPrefillAnswer(t *testing.T) {
	tests := map[string]struct {
		kv        string
		answer    func(http.ResponseWriter, captured)
		wantKV    string
		status    int
		transport bool
	}{
		"nixl answer copied for decode": {
			kv:     "kv-nixl",
			answer: okJSON(`{"id":"p","kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[1,2]],"remote_engine_id":"e","remote_host":"10.0.0.4","remote_port":5600,"remote_request_id":"r"}}`),
			wantKV: `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[1,2]],"remote_engine_id":"e","remote_host":"10.0.0.4","remote_port":5600,"remote_request_id":"r"}`,
		},
		"no params in the answer": {
			kv: "kv-shared-storage", answer: okJSON(`{"id":"p"}`),
			wantKV: `{"do_remote_decode":false,"do_remote_prefill":true}`,
		},
		"non-object params ignored": {
			kv: "kv-nixl", answer: okJSON(`{"kv_transfer_params":"weird"}`),
			wantKV: `{"do_remote_decode":false,"do_remote_prefill":true}`,
		},
		"4xx": {
			kv: "kv-nixl",
			answer: func(w http.ResponseWriter, _ captured) {
				http.Error(w, `{"error":"bad"}`, http.StatusUnprocessableEntity)
			},
			status: 422,
		},
		"500": {
			kv:     "kv-nixl",
			answer: func(w http.ResponseWriter, _ captured) { http.Error(w, "oops", http.StatusInternalServerError) },
			status: 500,
		},
		"200 with invalid JSON": {
			kv: "kv-nixl", answer: okJSON(`not json`), status: 200,
		},
		// The answer is validated whole here: the KV connector takes its params without
		// validating them again.
		"200 with truncated params": {
			kv: "kv-nixl", answer: okJSON(`{"id":"p","kv_transfer_params":{"remote_block_ids":[[1,2]`), status: 200,
		},
		"200 with params that do not parse": {
			kv: "kv-nixl", answer: okJSON(`{"id":"p","kv_transfer_params":{"a":}}`), status: 200,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			gw := newFakeGateway(t, func(w http.ResponseWriter, c captured) {
				if c.Header.Get("EPP-Profile") == "decode" {
					okJSON(`{"id":"d"}`)(w, c)
					return
				}
				tc.answer(w, c)
			})
			s := newStep(t, PrefillStep, gw, map[string]any{"kv_connector": tc.kv})
			rc, _ := newRC(t, "/v1/chat/completions", `{"model":"m","messages":[]}`, nil)
			err := s.Execute(context.Background(), rc)
			if tc.status != 0 {
				var up *apierror.UpstreamError
				if !errors.As(err, &up) || up.Status != tc.status || up.Phase != "prefill" {
					t.Fatalf("err = %#v, want upstream %d", err, tc.status)
				}
				if rc.Prefilled {
					t.Fatal("failed prefill marked as done")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// The decode leg that follows (same connector) carries the params derived from the answer.
			d := newStep(t, DecodeStep, gw, map[string]any{"kv_connector": tc.kv})
			if err := d.Execute(context.Background(), rc); err != nil {
				t.Fatal(err)
			}
			legs := gw.requests()
			jsonEq(t, "decode kv params", legs[len(legs)-1].Body["kv_transfer_params"], tc.wantKV)
		})
	}
}

// A prefill pool that cannot serve (unreachable, 503, 429 after the retries) is handled by
// on_pool_failure: aggregate lets decode serve the request alone, fail answers 503.
func TestPrefillPoolFailure(t *testing.T) {
	unavailable := func(w http.ResponseWriter, _ captured) {
		w.Header().Set("Retry-After", "3")
		http.Error(w, "no healthy upstream", http.StatusServiceUnavailable)
	}
	tests := map[string]struct {
		answer     func(http.ResponseWriter, captured)
		closed     bool
		policy     string
		retryAfter string
	}{
		"unreachable, aggregate": {closed: true, policy: "aggregate"},
		"unreachable, fail":      {closed: true, policy: "fail", retryAfter: "1"},
		"503, aggregate":         {answer: unavailable, policy: "aggregate"},
		"503, fail":              {answer: unavailable, policy: "fail", retryAfter: "3"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			gw := newFakeGateway(t, tc.answer)
			s := newStep(t, PrefillStep, gw, map[string]any{"on_pool_failure": tc.policy})
			if tc.closed {
				gw.srv.Close()
			}
			rc, _ := newRC(t, "/v1/chat/completions", `{"messages":[]}`, nil)
			err := s.Execute(context.Background(), rc)
			if tc.policy == "aggregate" {
				if err != nil || rc.Degraded != PrefillStep || rc.Prefilled {
					t.Fatalf("err = %v, degraded %q, prefilled %v; want decode to serve it alone", err, rc.Degraded, rc.Prefilled)
				}
				return
			}
			e := apierror.From(err)
			if e.Status != 503 || e.Code != "pool_unavailable" || rc.Degraded != "" {
				t.Fatalf("err = %v (%d %s), want a 503 naming the pool", err, e.Status, e.Code)
			}
			rec := httptest.NewRecorder()
			apierror.Write(rec, e, "rid")
			if rec.Header().Get("Retry-After") != tc.retryAfter {
				t.Fatalf("Retry-After %q, want %q", rec.Header().Get("Retry-After"), tc.retryAfter)
			}
		})
	}
}

// A prefill answer larger than gateway.max_response_size is refused as it is read (a 300 MiB
// answer once took the process to 815 MB): at most the limit is held, and the request is a 502.
func TestPrefillAnswerTooLarge(t *testing.T) {
	var written atomic.Int64
	gw := newFakeGateway(t, func(w http.ResponseWriter, _ captured) {
		w.Header().Set("Content-Type", "application/json")
		chunk := []byte(strings.Repeat(" ", 64<<10))
		_, _ = w.Write([]byte(`{"kv_transfer_params":{"pad":"`))
		for range (300 << 20) / len(chunk) {
			n, err := w.Write(chunk)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	})
	gw.tune = func(g *config.Gateway) { g.MaxResponseSize = 1 }
	s := newStep(t, PrefillStep, gw, nil)
	rc, _ := newRC(t, "/v1/chat/completions", `{"messages":[]}`, nil)
	err := s.Execute(context.Background(), rc)
	if !errors.Is(err, upstream.ErrResponseTooLarge) || apierror.From(err).Status != http.StatusBadGateway || rc.Prefilled || rc.Degraded != "" {
		t.Fatalf("err = %v, want a 502 for an answer over the limit", err)
	}
	if w := written.Load(); w >= 300<<20 {
		t.Fatalf("the worker wrote all %d bytes: the answer was read to its end", w)
	}
}

// hashRank is the X-Data-Parallel-Rank a request id hashes to, computed here on its own: the
// first 8 bytes of blake2s-256(id), big-endian, mod size.
func hashRank(id string, size int) string {
	sum := blake2s.Sum256([]byte(id))
	return strconv.FormatUint(binary.BigEndian.Uint64(sum[:8])%uint64(size), 10)
}

// With kv-nixl and data_parallel_size > 1 the prefill leg, on every attempt, carries
// X-Data-Parallel-Rank = the request id's hash mod the size, replacing a trusted client's value
// without editing the request's forwarded headers; with size 1 it carries none.
func TestPrefillDataParallelRank(t *testing.T) {
	tests := map[string]struct {
		size int
		id   string
		want string
	}{
		"size 4":       {size: 4, id: "req-1", want: hashRank("req-1", 4)},
		"size 8":       {size: 8, id: "cmpl-abc-123", want: hashRank("cmpl-abc-123", 8)},
		"size 3, uuid": {size: 3, id: "00000000-0000-0000-0000-000000000000", want: hashRank("00000000-0000-0000-0000-000000000000", 3)},
		"size 1":       {size: 1, id: "req-1"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var calls atomic.Int32
			gw := newFakeGateway(t, func(w http.ResponseWriter, c captured) {
				if calls.Add(1) == 1 {
					http.Error(w, "no healthy upstream", http.StatusServiceUnavailable)
					return
				}
				okJSON(`{"kv_transfer_params":{"remote_engine_id":"e"}}`)(w, c)
			})
			s := newStep(t, PrefillStep, gw, map[string]any{"kv_connector": "kv-nixl", "data_parallel_size": tc.size})
			rc, _ := newRC(t, "/v1/chat/completions", `{"model":"m","messages":[]}`, nil)
			rc.ID = tc.id
			if err := s.Execute(context.Background(), rc); err != nil {
				t.Fatal(err)
			}
			legs := gw.requests()
			if len(legs) != 2 {
				t.Fatalf("%d prefill attempts, want 2", len(legs))
			}
			for i, l := range legs {
				if got := l.Header.Values("X-Data-Parallel-Rank"); strings.Join(got, ",") != tc.want {
					t.Fatalf("attempt %d: X-Data-Parallel-Rank %q, want %q", i+1, got, tc.want)
				}
			}
		})
	}

	t.Run("a trusted client's rank is replaced, not edited in place", func(t *testing.T) {
		gw := newFakeGateway(t, okJSON(`{}`))
		s := newStep(t, PrefillStep, gw, map[string]any{"kv_connector": "kv-nixl", "data_parallel_size": 4})
		rc, _ := newRC(t, "/v1/chat/completions", `{"messages":[]}`, nil)
		rc.Forwarded = gateway.ForwardedTrusted(http.Header{"X-Data-Parallel-Rank": {"9"}, "X-Tenant": {"t"}})
		if err := s.Execute(context.Background(), rc); err != nil {
			t.Fatal(err)
		}
		got := gw.only().Header
		if got.Values("X-Data-Parallel-Rank")[0] != hashRank("req-1", 4) || len(got.Values("X-Data-Parallel-Rank")) != 1 || got.Get("X-Tenant") != "t" {
			t.Fatalf("leg headers %v", got)
		}
		if rc.Forwarded.Get("X-Data-Parallel-Rank") != "9" || len(rc.Forwarded) != 2 {
			t.Fatalf("rc.Forwarded was edited: %v", rc.Forwarded)
		}
	})
}

// buildErr builds a prefill or decode step from own (over a pipeline whose kv_connector is
// kv-shared-storage) and returns the build error.
func buildErr(t *testing.T, typ string, own map[string]any) error {
	t.Helper()
	f := map[string]registry.Factory[builder.Deps]{DecodeStep: newDecode, PrefillStep: newPrefill, PrefillDecodeStep: newPrefillDecode}[typ]
	deps := builder.Deps{Log: logr.Discard(), Getenv: func(string) string { return "" }, Gateway: newFakeGateway(t, okJSON(`{}`)).client()}
	p := params.New("params", own, map[string]any{"kv_connector": "kv-shared-storage", "ec_connector": "ec-shared-storage", "use_openai_format": true})
	_, err := f(deps, p)
	if err == nil {
		err = p.Err()
	}
	return err
}

// data_parallel_size is an integer ≥ 1, and more than 1 only with kv-nixl (upstream ignores it
// with the other connectors; a setting that would do nothing is refused here).
func TestDataParallelSizeParam(t *testing.T) {
	tests := map[string]struct {
		own   map[string]any
		want  string   // "" for no error
		steps []string // default: prefill and decode
	}{
		"nixl 8":                   {own: map[string]any{"kv_connector": "kv-nixl", "data_parallel_size": 8}},
		"nixl 8.0":                 {own: map[string]any{"kv_connector": "kv-nixl", "data_parallel_size": 8.0}},
		"nixl 1":                   {own: map[string]any{"kv_connector": "kv-nixl", "data_parallel_size": 1}},
		"sglang 1":                 {own: map[string]any{"kv_connector": "kv-sglang", "data_parallel_size": 1}, steps: []string{DecodeStep}},
		"inherited shared storage": {own: map[string]any{"data_parallel_size": 1}},
		"absent":                   {own: map[string]any{"kv_connector": "kv-nixl"}},
		"sglang 2": {own: map[string]any{"kv_connector": "kv-sglang", "data_parallel_size": 2}, steps: []string{DecodeStep},
			want: `params.data_parallel_size: only kv-nixl supports data parallelism (kv_connector is "kv-sglang")`},
		"shared storage 4": {own: map[string]any{"kv_connector": "kv-shared-storage", "data_parallel_size": 4},
			want: `params.data_parallel_size: only kv-nixl supports data parallelism (kv_connector is "kv-shared-storage")`},
		"inherited shared storage 2": {own: map[string]any{"data_parallel_size": 2},
			want: `params.data_parallel_size: only kv-nixl supports data parallelism`},
		"nixl 0":      {own: map[string]any{"kv_connector": "kv-nixl", "data_parallel_size": 0}, want: "params.data_parallel_size: must be at least 1, got 0"},
		"nixl -2":     {own: map[string]any{"kv_connector": "kv-nixl", "data_parallel_size": -2}, want: "params.data_parallel_size: must be at least 1, got -2"},
		"nixl 2.5":    {own: map[string]any{"kv_connector": "kv-nixl", "data_parallel_size": 2.5}, want: "params.data_parallel_size: must be an integer"},
		"nixl string": {own: map[string]any{"kv_connector": "kv-nixl", "data_parallel_size": "2"}, want: "params.data_parallel_size: must be an integer"},
		"unknown connector": {own: map[string]any{"kv_connector": "kv-mooncake", "data_parallel_size": 2},
			want: `params.kv_connector: unknown KV connector "kv-mooncake"`},
	}
	for name, tc := range tests {
		if tc.steps == nil {
			tc.steps = []string{PrefillStep, DecodeStep}
		}
		for _, typ := range tc.steps {
			t.Run(name+"/"+typ, func(t *testing.T) {
				err := buildErr(t, typ, tc.own)
				switch {
				case tc.want == "" && err != nil:
					t.Fatal(err)
				case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
					t.Fatalf("err = %v, want %q", err, tc.want)
				}
			})
		}
	}
}

// renderedWithMetadata is rendered with each item's mm_metadata too (a vLLM render with
// vllm-project/vllm#54659), and a second image; the first item's kwargs are kwargs.
func renderedWithMetadata(rc *request.Context, kwargs string) {
	rc.Rendered = true
	rc.SetTokenIDs([]int{1, 4, 32000, 32000, 32000, 777, 32000, 32000})
	rc.Media = []request.MediaEntry{
		{Message: 0, Part: 1, Kind: "image_url", Hash: "h1", Placeholder: request.Placeholder{Offset: 2, Length: 3}, Kwargs: []byte(kwargs), Metadata: []byte(`"bWV0YTE="`)},
		{Message: 0, Part: 2, Kind: "image_url", Hash: "h2", Placeholder: request.Placeholder{Offset: 6, Length: 2}, Kwargs: []byte(`"a3cy"`), Metadata: []byte(`"bWV0YTI="`)},
	}
}

// The prefill leg's features carry mm_metadata instead of kwargs_data exactly when it sends
// ec_transfer_params (EC descriptors with a connector that puts them on the wire) and every item
// has metadata (upstream llm-d-router#2723); chat's tokens.features carry neither, as before.
func TestPrefillMetadataInsteadOfKwargs(t *testing.T) {
	const chat = `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"image_url","image_url":{"url":"data:image/png;base64,BBBB"}}]}],"max_tokens":9}`
	descriptors := map[string]any{"h1": map[string]any{"peer_port": 1}, "h2": map[string]any{"peer_port": 2}}
	const (
		withMeta   = `"features":{"mm_hashes":{"image":["h1","h2"]},"mm_placeholders":{"image":[{"offset":2,"length":3},{"offset":6,"length":2}]},"mm_metadata":{"image":["bWV0YTE=","bWV0YTI="]}}`
		withKwargs = `"features":{"mm_hashes":{"image":["h1","h2"]},"mm_placeholders":{"image":[{"offset":2,"length":3},{"offset":6,"length":2}]},"kwargs_data":{"image":["a3cx","a3cy"]}}`
		ids        = `"token_ids":[1,4,32000,32000,32000,777,32000,32000]`
		kvShared   = `"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false}`
		ecJSON     = `"ec_transfer_params":{"h1":{"peer_port":1},"h2":{"peer_port":2}}`
	)
	generate := func(features, extra string) string {
		return `{"model":"m",` + ids + `,` + features + `,"request_id":"req-1","sampling_params":{"max_tokens":1,"extra_args":{` + extra + `}},"stream":false}`
	}
	tests := map[string]struct {
		path    string
		params  map[string]any
		prepare func(rc *request.Context)
		want    string
	}{
		"generate format with EC descriptors: metadata": {
			params:  map[string]any{"use_openai_format": false, "ec_connector": "ec-nixl"},
			prepare: func(rc *request.Context) { rc.ECParams = descriptors },
			want:    generate(withMeta, ecJSON+","+kvShared),
		},
		"generate format without EC descriptors: kwargs": {
			params: map[string]any{"use_openai_format": false, "ec_connector": "ec-nixl"},
			want:   generate(withKwargs, kvShared),
		},
		"generate format, empty EC descriptors: kwargs": {
			params:  map[string]any{"use_openai_format": false, "ec_connector": "ec-nixl"},
			prepare: func(rc *request.Context) { rc.ECParams = map[string]any{} },
			want:    generate(withKwargs, kvShared),
		},
		"generate format, shared-storage EC sends no params: kwargs": {
			params:  map[string]any{"use_openai_format": false},
			prepare: func(rc *request.Context) { rc.ECParams = descriptors },
			want:    generate(withKwargs, kvShared),
		},
		"generate format, an item without metadata: kwargs": {
			params: map[string]any{"use_openai_format": false, "ec_connector": "ec-nixl"},
			prepare: func(rc *request.Context) {
				rc.ECParams = descriptors
				rc.Media[1].Metadata = nil
			},
			want: generate(withKwargs, ecJSON+","+kvShared),
		},
		"completions format with EC descriptors: metadata": {
			path: "/v1/completions", params: map[string]any{"ec_connector": "ec-nixl"},
			prepare: func(rc *request.Context) { rc.ECParams = descriptors },
			want:    `{"model":"m","prompt":[1,4,32000,32000,32000,777,32000,32000],"max_tokens":1,"stream":false,"request_id":"req-1",` + kvShared + `,` + withMeta + `,` + ecJSON + `}`,
		},
		"completions format without EC descriptors: kwargs": {
			path: "/v1/completions", params: map[string]any{"ec_connector": "ec-nixl"},
			want: `{"model":"m","prompt":[1,4,32000,32000,32000,777,32000,32000],"max_tokens":1,"stream":false,"request_id":"req-1",` + kvShared + `,` + withKwargs + `}`,
		},
		"chat format: tokens.features unchanged": {
			params:  map[string]any{"ec_connector": "ec-nixl"},
			prepare: func(rc *request.Context) { rc.ECParams = descriptors },
			want: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"image_url","image_url":{"url":"data:image/png;base64,BBBB"}}]}],"max_tokens":1,"stream":false,
			        "tokens":{` + ids + `,"features":{"mm_hashes":{"image":["h1","h2"]},"mm_placeholders":{"image":[{"offset":2,"length":3},{"offset":6,"length":2}]}}},` + kvShared + `,` + ecJSON + `}`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			gw := newFakeGateway(t, okJSON(`{"id":"x"}`))
			s := newStep(t, PrefillStep, gw, tc.params)
			path, raw := "/v1/chat/completions", chat
			if tc.path != "" {
				path, raw = tc.path, `{"model":"m","prompt":"hi","max_tokens":9}`
			}
			rc, _ := newRC(t, path, raw, nil)
			renderedWithMetadata(rc, `"a3cx"`)
			if tc.prepare != nil {
				tc.prepare(rc)
			}
			if err := s.Execute(context.Background(), rc); err != nil {
				t.Fatal(err)
			}
			jsonEq(t, "prefill body", gw.only().Body, tc.want)
		})
	}
}

// With mm_metadata the prefill leg of an HD image no longer carries its preprocessed pixels:
// against an older render (no metadata), a 4 MiB kwargs_data item (about what an HD image's
// pixel_values are in base64) shrinks the body to a few hundred bytes.
func TestPrefillMetadataBodySize(t *testing.T) {
	kwargs := `"` + strings.Repeat("QUJD", 1<<20) + `"` // 4 MiB of base64
	sizes := map[bool]int{}
	for _, meta := range []bool{false, true} {
		gw := newFakeGateway(t, okJSON(`{"id":"x"}`))
		s := newStep(t, PrefillStep, gw, map[string]any{"use_openai_format": false, "ec_connector": "ec-nixl", "kv_connector": "kv-nixl"})
		rc, _ := newRC(t, "/v1/chat/completions", `{"model":"m","messages":[]}`, nil)
		renderedWithMetadata(rc, kwargs)
		rc.Media = rc.Media[:1]
		if !meta {
			rc.Media[0].Metadata = nil // a render before vllm-project/vllm#54659
		}
		rc.ECParams = map[string]any{"h1": map[string]any{"peer_host": "10.0.0.1", "peer_port": 5501, "size_bytes": 3 << 20, "nixl_agent_metadata_b64": "bml4bC1hZ2VudA=="}}
		if err := s.Execute(context.Background(), rc); err != nil {
			t.Fatal(err)
		}
		raw := gw.only().Raw
		if strings.Contains(string(raw), "kwargs_data") == meta || strings.Contains(string(raw), "mm_metadata") != meta || !strings.Contains(string(raw), "ec_transfer_params") {
			t.Fatalf("with metadata %v: prefill body %.300s", meta, raw)
		}
		sizes[meta] = len(raw)
	}
	t.Logf("prefill body of one image with 4 MiB of kwargs: %d bytes with kwargs_data, %d bytes with mm_metadata", sizes[false], sizes[true])
	if sizes[false] < 4<<20 || sizes[true] > 1024 {
		t.Fatalf("prefill body %d bytes with kwargs_data, %d with mm_metadata: want the metadata body under 1 KiB", sizes[false], sizes[true])
	}
}

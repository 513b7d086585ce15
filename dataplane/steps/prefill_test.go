package steps

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/apierror"
	"github.com/epd-dev/coordinator/dataplane/config"
	"github.com/epd-dev/coordinator/dataplane/request"
	"github.com/epd-dev/coordinator/dataplane/upstream"
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
			if h.Get("EPP-Profile") != "prefill" || h.Get("X-Request-Id") != "req-1" || h.Get("Content-Type") != "application/json" ||
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

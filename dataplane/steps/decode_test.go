package steps

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
)

func TestDecodeLegBodies(t *testing.T) {
	const nixlAnswer = `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"e"}`
	const nixlKV = `{"do_remote_decode":false,"do_remote_prefill":true,"remote_engine_id":"e"}`
	tests := map[string]struct {
		path, body string
		kv         string // the decode step's kv_connector (default kv-shared-storage)
		prepare    func(rc *request.Context)
		want       string
	}{
		"decode-only chat is the client body unchanged": {
			path: "/v1/chat/completions", body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`,
			want: `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`,
		},
		"chat after prefill": {
			path: "/v1/chat/completions", body: `{"model":"m","messages":[],"min_tokens":2}`, kv: "kv-nixl",
			prepare: func(rc *request.Context) {
				rc.Prefilled = true
				rc.PrefillKV = json.RawMessage(nixlAnswer)
			},
			want: `{"model":"m","messages":[],"min_tokens":2,"kv_transfer_params":` + nixlKV + `}`,
		},
		"chat rendered: tokens and uuids": {
			path: "/v1/chat/completions",
			body: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"},"uuid":"client"}]}]}`,
			kv:   "kv-nixl",
			prepare: func(rc *request.Context) {
				rendered(rc)
				rc.Prefilled = true
				rc.PrefillKV = json.RawMessage(nixlAnswer)
			},
			want: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"},"uuid":"h1"}]}],
			        "tokens":{"token_ids":[1,4,32000,32000,32000,777],"features":{"mm_hashes":{"image":["h1"]},"mm_placeholders":{"image":[{"offset":2,"length":3}]}}},
			        "kv_transfer_params":` + nixlKV + `}`,
		},
		"completions rendered": {
			path: "/v1/completions", body: `{"model":"m","prompt":"a b","max_tokens":4}`,
			prepare: func(rc *request.Context) {
				rc.Rendered = true
				rc.SetTokenIDs([]int{1, 5, 6})
				rc.Prefilled = true
				rc.PrefillKV = nil // shared storage: the prefill worker answers no params
			},
			want: `{"model":"m","prompt":[1,5,6],"max_tokens":4,"kv_transfer_params":{"do_remote_decode":false,"do_remote_prefill":true}}`,
		},
		"generate nests kv params": {
			path: "/inference/v1/generate", body: `{"model":"m","token_ids":[1,2],"sampling_params":{"max_tokens":8,"extra_args":{"keep":true}}}`,
			prepare: func(rc *request.Context) {
				rc.Prefilled = true
				rc.PrefillKV = nil // shared storage: the prefill worker answers no params
			},
			want: `{"model":"m","token_ids":[1,2],"sampling_params":{"max_tokens":8,"extra_args":{"keep":true,"kv_transfer_params":{"do_remote_decode":false,"do_remote_prefill":true}}}}`,
		},
		"decode-only generate is unchanged": {
			path: "/inference/v1/generate", body: `{"model":"m","token_ids":[1,2]}`,
			want: `{"model":"m","token_ids":[1,2]}`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			gw := newFakeGateway(t, okJSON(`{"id":"d"}`))
			var own map[string]any
			if tc.kv != "" {
				own = map[string]any{"kv_connector": tc.kv}
			}
			s := newStep(t, DecodeStep, gw, own)
			rc, rec := newRC(t, tc.path, tc.body, nil)
			if tc.prepare != nil {
				tc.prepare(rc)
			}
			if err := s.Execute(context.Background(), rc); err != nil {
				t.Fatal(err)
			}
			got := gw.only()
			if got.Path != tc.path || got.Header.Get("EPP-Profile") != "decode" || got.Header.Get("X-Request-Id") != "req-1" || got.Header.Get("Prefer") != "" {
				t.Fatalf("leg %s %v", got.Path, got.Header)
			}
			jsonEq(t, "decode body", got.Body, tc.want)
			if !strings.Contains(tc.want, "kv_transfer_params") && strings.Contains(string(got.Raw), "kv_transfer_params") {
				t.Fatal("decode invented kv_transfer_params")
			}
			if rec.Code != 200 || rec.Body.String() != `{"id":"d"}` || rec.Header().Get("X-Request-Id") != "req-1" {
				t.Fatalf("client got %d %q %v", rec.Code, rec.Body, rec.Header())
			}
			if tc.prepare == nil && string(got.Raw) != tc.body {
				t.Fatalf("decode-only body not byte-identical:\n%s\n%s", got.Raw, tc.body)
			}
		})
	}
}

func TestDecodePassesWorkerErrorsThrough(t *testing.T) {
	gw := newFakeGateway(t, func(w http.ResponseWriter, _ captured) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Worker", "vllm")
		w.Header().Set("Set-Cookie", "session=worker")
		w.Header().Set("Openai-Processing-Ms", "12")
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"error":{"message":"max_tokens too large"}}`)
	})
	s := newStep(t, DecodeStep, gw, nil)
	rc, rec := newRC(t, "/v1/chat/completions", `{"messages":[]}`, nil)
	if err := s.Execute(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	// The worker's headers pass through the allow list only (upstream.CopyResponseHeader).
	h := rec.Header()
	if rec.Code != 422 || rec.Body.String() != `{"error":{"message":"max_tokens too large"}}` ||
		h.Get("Openai-Processing-Ms") != "12" || h.Get("X-Worker") != "" || h.Get("Set-Cookie") != "" {
		t.Fatalf("client got %d %q %v", rec.Code, rec.Body, rec.Header())
	}
}

func TestDecodeTransportError(t *testing.T) {
	gw := newFakeGateway(t, okJSON(`{}`))
	s := newStep(t, DecodeStep, gw, nil)
	gw.srv.Close()
	rc, rec := newRC(t, "/v1/chat/completions", `{"messages":[]}`, nil)
	err := s.Execute(context.Background(), rc)
	if e := apierror.From(err); e.Status != 502 || rec.Body.Len() != 0 {
		t.Fatalf("err = %v (%d), client body %q", err, e.Status, rec.Body)
	}
}

// flushRecorder records writes with the time each flush happened.
type flushRecorder struct {
	header  http.Header
	status  int
	chunks  []string
	pending strings.Builder
}

func (f *flushRecorder) Header() http.Header         { return f.header }
func (f *flushRecorder) WriteHeader(code int)        { f.status = code }
func (f *flushRecorder) Write(b []byte) (int, error) { return f.pending.Write(b) }
func (f *flushRecorder) Flush() {
	if f.pending.Len() > 0 {
		f.chunks = append(f.chunks, f.pending.String())
		f.pending.Reset()
	}
}

func TestDecodeStreamsEventByEvent(t *testing.T) {
	events := []string{"data: {\"a\":1}\n\n", "data: {\"a\":2}\n\n", "data: [DONE]\n\n"}
	gw := newFakeGateway(t, func(w http.ResponseWriter, _ captured) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range events {
			_, _ = io.WriteString(w, e)
			w.(http.Flusher).Flush()
			time.Sleep(20 * time.Millisecond)
		}
	})
	s := newStep(t, DecodeStep, gw, nil)
	rc, _ := newRC(t, "/v1/chat/completions", `{"messages":[],"stream":true}`, nil)
	fr := &flushRecorder{header: http.Header{}}
	rc.Writer = fr
	if err := s.Execute(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	if fr.status != 200 || strings.Join(fr.chunks, "|") != strings.Join(events, "|") {
		t.Fatalf("flushed chunks %q, want one per event %q", fr.chunks, events)
	}
}

func TestDecodeClientCancelStopsUpstream(t *testing.T) {
	upstreamDone := make(chan struct{})
	gw := newFakeGateway(t, func(w http.ResponseWriter, c captured) {
		defer close(upstreamDone)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 1000; i++ {
			if _, err := io.WriteString(w, "data: {}\n\n"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			time.Sleep(5 * time.Millisecond)
		}
	})
	s := newStep(t, DecodeStep, gw, nil)
	rc, _ := newRC(t, "/v1/chat/completions", `{"messages":[],"stream":true}`, nil)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	err := s.Execute(ctx, rc)
	if err == nil {
		t.Fatal("cancelled stream reported success")
	}
	select {
	case <-upstreamDone:
	case <-time.After(3 * time.Second):
		t.Fatal("upstream kept streaming after the client cancelled")
	}
}

func TestConditionalDecode(t *testing.T) {
	tests := map[string]struct {
		answer    func(http.ResponseWriter, captured)
		closeGW   bool
		wantDone  bool
		wantCode  int
		wantBody  string
		rendered  bool
		wantTok   bool
		cancelled bool
	}{
		"412 continues silently": {
			answer: func(w http.ResponseWriter, _ captured) {
				http.Error(w, `{"error":"no cache"}`, http.StatusPreconditionFailed)
			},
		},
		"hit is the answer": {
			answer:   okJSON(`{"id":"hit"}`),
			wantDone: true, wantCode: 200, wantBody: `{"id":"hit"}`,
		},
		"worker error is the answer": {
			answer: func(w http.ResponseWriter, _ captured) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = io.WriteString(w, `{"error":{"message":"boom"}}`)
			},
			wantDone: true, wantCode: 500, wantBody: `{"error":{"message":"boom"}}`,
		},
		"rendered chat carries tokens": {
			answer:   okJSON(`{}`),
			rendered: true, wantTok: true, wantDone: true, wantCode: 200, wantBody: `{}`,
		},
		"unreachable decode falls back to the cascade": {closeGW: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			gw := newFakeGateway(t, tc.answer)
			s := newStep(t, ConditionalDecodeStep, gw, nil)
			if tc.closeGW {
				gw.srv.Close()
			}
			rc, rec := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":5}`, nil)
			if tc.rendered {
				rc.Rendered = true
				rc.SetTokenIDs([]int{1, 2})
			}
			err := s.Execute(context.Background(), rc)
			if tc.wantDone != errors.Is(err, pipeline.ErrDone) || (!tc.wantDone && err != nil) {
				t.Fatalf("err = %v, want done=%v", err, tc.wantDone)
			}
			if !tc.wantDone {
				if rec.Body.Len() != 0 || rec.Code != 200 || len(rec.Header()) != 0 {
					t.Fatalf("fallback wrote to the client: %d %q", rec.Code, rec.Body)
				}
				if !tc.closeGW {
					leg := gw.only()
					if leg.Header.Get("Prefer") != "if-available" || leg.Header.Get("EPP-Profile") != "decode" {
						t.Fatalf("headers %v", leg.Header)
					}
					jsonEq(t, "probe body", leg.Body, `{"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":5}`)
				}
				return
			}
			if rec.Code != tc.wantCode || rec.Body.String() != tc.wantBody {
				t.Fatalf("client got %d %q", rec.Code, rec.Body)
			}
			if _, hasTok := gw.only().Body["tokens"]; hasTok != tc.wantTok {
				t.Fatalf("tokens present = %v", hasTok)
			}
		})
	}
}

// After a prefill with kv-nixl and data_parallel_size > 1, the decode leg carries the rank the
// prefill worker answered in kv_transfer_params.remote_dp_rank when it is an integer in
// [0, size), else the prefill leg's own (the request id's hash); without a prefill, or with
// size 1, it carries none.
func TestDecodeDataParallelRank(t *testing.T) {
	hash := hashRank("req-1", 8)
	tests := map[string]struct {
		size      int
		prefilled bool
		kv        string
		want      string
	}{
		"answered rank":              {size: 8, prefilled: true, kv: `{"remote_engine_id":"e","remote_dp_rank":3}`, want: "3"},
		"answered rank zero":         {size: 8, prefilled: true, kv: `{"remote_dp_rank":0}`, want: "0"},
		"answered last rank":         {size: 8, prefilled: true, kv: `{"remote_dp_rank":7}`, want: "7"},
		"answered integral float":    {size: 8, prefilled: true, kv: `{"remote_dp_rank":6.0}`, want: "6"},
		"out of range":               {size: 8, prefilled: true, kv: `{"remote_dp_rank":8}`, want: hash},
		"negative":                   {size: 8, prefilled: true, kv: `{"remote_dp_rank":-1}`, want: hash},
		"fractional":                 {size: 8, prefilled: true, kv: `{"remote_dp_rank":2.5}`, want: hash},
		"string":                     {size: 8, prefilled: true, kv: `{"remote_dp_rank":"3"}`, want: hash},
		"null":                       {size: 8, prefilled: true, kv: `{"remote_dp_rank":null}`, want: hash},
		"absent":                     {size: 8, prefilled: true, kv: `{"remote_engine_id":"e"}`, want: hash},
		"no params answered":         {size: 8, prefilled: true, want: hash},
		"no prefill":                 {size: 8, kv: `{"remote_dp_rank":3}`},
		"size 1":                     {size: 1, prefilled: true, kv: `{"remote_dp_rank":0}`},
		"size 1, no prefill":         {size: 1},
		"size 2, answered rank":      {size: 2, prefilled: true, kv: `{"remote_dp_rank":1}`, want: "1"},
		"size 2, answered too large": {size: 2, prefilled: true, kv: `{"remote_dp_rank":3}`, want: hashRank("req-1", 2)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			gw := newFakeGateway(t, okJSON(`{"id":"d"}`))
			s := newStep(t, DecodeStep, gw, map[string]any{"kv_connector": "kv-nixl", "data_parallel_size": tc.size})
			rc, _ := newRC(t, "/v1/chat/completions", `{"messages":[]}`, nil)
			rc.Prefilled = tc.prefilled
			if tc.kv != "" {
				rc.PrefillKV = json.RawMessage(tc.kv)
			}
			if err := s.Execute(context.Background(), rc); err != nil {
				t.Fatal(err)
			}
			if got := gw.only().Header.Values("X-Data-Parallel-Rank"); strings.Join(got, ",") != tc.want {
				t.Fatalf("X-Data-Parallel-Rank %q, want %q", got, tc.want)
			}
		})
	}
}

// A decode retried after a failed KV transfer (no kv_transfer_params on the retry) keeps its
// rank, and the request's forwarded headers are not edited.
func TestDecodeDataParallelRankOnRetry(t *testing.T) {
	var calls atomic.Int32
	gw := newFakeGateway(t, func(w http.ResponseWriter, c captured) {
		if calls.Add(1) == 1 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"KV transfer failed"}}`)
			return
		}
		okJSON(`{"id":"d"}`)(w, c)
	})
	s := newStep(t, DecodeStep, gw, map[string]any{"kv_connector": "kv-nixl", "data_parallel_size": 4})
	rc, rec := newRC(t, "/v1/chat/completions", `{"messages":[]}`, nil)
	rc.Forwarded = gateway.ForwardedTrusted(http.Header{"X-Data-Parallel-Rank": {"0"}})
	rc.Prefilled, rc.PrefillKV = true, json.RawMessage(`{"remote_engine_id":"e","remote_dp_rank":2}`)
	if err := s.Execute(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	legs := gw.requests()
	if len(legs) != 2 || rec.Code != 200 {
		t.Fatalf("%d decode attempts, client got %d", len(legs), rec.Code)
	}
	for i, l := range legs {
		if got := l.Header.Values("X-Data-Parallel-Rank"); len(got) != 1 || got[0] != "2" {
			t.Fatalf("attempt %d: X-Data-Parallel-Rank %q, want 2", i+1, got)
		}
	}
	if _, ok := legs[1].Body["kv_transfer_params"]; ok {
		t.Fatal("the retry kept the failed transfer's params")
	}
	if rc.Forwarded.Get("X-Data-Parallel-Rank") != "0" {
		t.Fatalf("rc.Forwarded was edited: %v", rc.Forwarded)
	}
}

package server_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/server"
)

// benchBodies are the request sizes the issue asks for: a small chat, a long text prompt and a
// chat carrying a ~1 MiB inline image.
func benchBodies() map[string][]byte {
	small := `{"model":"m","messages":[{"role":"user","content":"Write a haiku about disaggregated inference, please."}],"max_tokens":16}`
	text := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":16}`, strings.Repeat("lorem ipsum ", 256<<10/12))
	img := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xff, 0xd8, 0xff}, (1<<20)*3/4/3)) // JPEG magic: the media guard sniffs the content
	image := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"describe"},{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,%s"}}]}],"max_tokens":16}`, img)
	return map[string][]byte{"200B": []byte(small), "256KiB-text": []byte(text), "1MiB-image": []byte(image)}
}

var discardBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// instantWorker answers every leg at once, like a worker with a warm cache: prefill legs get NIXL
// params listing a KV block id per 16 tokens, as vLLM's NIXL connector and the simworker answer
// (~6 bytes a token of text: ~2,700 ids for 256 KiB; an image is a few blocks), decode legs a
// small completion. It reads each body fully, as a worker must.
func instantWorker(w http.ResponseWriter, r *http.Request) {
	bp := discardBufs.Get().(*[]byte)
	first, _ := io.ReadFull(r.Body, (*bp)[:4096])
	image := bytes.Contains((*bp)[:first], []byte(`"image_url"`))
	rest, _ := io.CopyBuffer(io.Discard, r.Body, *bp)
	discardBufs.Put(bp)
	blocks := (first + int(rest)) / 96
	if image {
		blocks = 5
	}
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.URL.Path == "/v1/chat/completions/render":
		// One image: 1 BOS + 2 text tokens + 64 placeholders.
		_, _ = io.WriteString(w, renderAnswer)
		return
	case r.Header.Get("EPP-Profile") == "encode":
		_, _ = io.WriteString(w, `{"id":"e","choices":[],"ec_transfer_params":{"h1":{"peer_host":"10.0.0.2","peer_port":5501,"size_bytes":2359296,"nixl_agent_metadata_b64":"AAAA"}}}`)
		return
	}
	if r.Header.Get("EPP-Profile") == "prefill" {
		_, _ = w.Write(prefillAnswer(blocks))
		return
	}
	_, _ = io.WriteString(w, `{"id":"d","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
}

// prefillAnswers are the prefill answers by block count (built once each).
var prefillAnswers sync.Map

// prefillAnswer is a NIXL prefill answer listing blocks KV block ids (at least one).
func prefillAnswer(blocks int) []byte {
	blocks = max(blocks, 1)
	if a, ok := prefillAnswers.Load(blocks); ok {
		return a.([]byte)
	}
	b := []byte(`{"id":"p","choices":[],"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[`)
	for i := range blocks {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(11108605+i), 10)
	}
	b = append(b, `]],"remote_engine_id":"e","remote_host":"10.0.0.1","remote_port":5600}}`...)
	prefillAnswers.Store(blocks, b)
	return b
}

var renderAnswer = func() string {
	ids := []byte(`[1,4,9`)
	for i := 0; i < 64; i++ {
		ids = append(ids, ",32000"...)
	}
	ids = append(ids, ']')
	return `{"token_ids":` + string(ids) + `,"features":{"mm_hashes":{"image":["h1"]},"mm_placeholders":{"image":[{"offset":3,"length":64}]},"kwargs_data":{"image":[null]}}}`
}()

// BenchmarkRequestPath measures one request through the coordinator's handler, with the worker
// legs on loopback HTTP. B/op covers the coordinator and the in-process worker.
func BenchmarkRequestPath(b *testing.B) {
	worker := httptest.NewServer(http.HandlerFunc(instantWorker))
	defer worker.Close()
	pipelines := map[string][]config.Step{
		"decode-only":    {{Type: "decode"}},
		"prefill-decode": {{Type: "prefill", Params: map[string]any{"kv_connector": "kv-nixl"}}, {Type: "decode"}},
		// The full multimodal pipeline (render, one encode leg per image, prefill, decode).
		"multimodal": {{Type: "replace-media-urls"}, {Type: "render", Params: map[string]any{"address": worker.URL}},
			{Type: "encode", Params: map[string]any{"ec_connector": "ec-nixl"}}, {Type: "prefill", Params: map[string]any{"kv_connector": "kv-nixl"}}, {Type: "decode"}},
	}
	bodies := benchBodies()
	for _, pname := range []string{"decode-only", "prefill-decode", "multimodal"} {
		cfg := config.Default()
		cfg.Gateway.Address = worker.URL
		cfg.Pipeline.Steps = pipelines[pname]
		p, err := builder.Build(cfg, builder.Options{})
		if err != nil {
			b.Fatal(err)
		}
		holder := &pipeline.Holder{}
		holder.Swap(p)
		h := server.New(server.Options{Server: cfg.Server, Pipelines: holder, Log: logr.Discard()}).Handler()
		names := []string{"200B", "256KiB-text", "1MiB-image"}
		if pname == "multimodal" {
			names = []string{"1MiB-image"}
		}
		for _, bname := range names {
			raw := bodies[bname]
			b.Run(pname+"/"+bname, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(raw)))
				serveChats(b, h, raw)
				b.ReportMetric(float64(len(raw)), "body-bytes")
			})
		}
	}
}

// serveChats sends raw as a chat request to h b.N times; each must be answered 200.
func serveChats(b *testing.B, h http.Handler, raw []byte) {
	rd := bytes.NewReader(raw)
	for i := 0; i < b.N; i++ {
		rd.Reset(raw)
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", rd)
		req.ContentLength = int64(len(raw))
		rec := &discardWriter{h: http.Header{}}
		h.ServeHTTP(rec, req)
		if rec.status != http.StatusOK {
			b.Fatalf("status %d", rec.status)
		}
	}
}

// discardWriter is a ResponseWriter that keeps only the status.
type discardWriter struct {
	h      http.Header
	status int
}

func (d *discardWriter) Header() http.Header { return d.h }
func (d *discardWriter) WriteHeader(s int)   { d.status = s }
func (d *discardWriter) Write(p []byte) (int, error) {
	if d.status == 0 {
		d.status = 200
	}
	return len(p), nil
}
func (d *discardWriter) Flush() {}

// streamingWorker answers a decode leg like instantWorker, or, for a streamed request, with an
// event stream of 16 token events, the usage chunk and [DONE].
func streamingWorker(w http.ResponseWriter, r *http.Request) {
	bp := discardBufs.Get().(*[]byte)
	n, _ := io.ReadFull(r.Body, *bp)
	stream := bytes.Contains((*bp)[:n], []byte(`"stream":true`))
	_, _ = io.CopyBuffer(io.Discard, r.Body, *bp)
	discardBufs.Put(bp)
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"d","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, streamAnswer)
}

var streamAnswer = func() string {
	var b strings.Builder
	for range 16 {
		b.WriteString(`data: {"id":"d","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}` + "\n\n")
	}
	b.WriteString(`data: {"id":"d","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":16,"total_tokens":28}}` + "\n\n")
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}()

// BenchmarkRequestPathObserved is one decode-only request with the metrics on (as a coordinator
// with its admin port runs), unstreamed and streamed (16 token events): the cost of the request
// and answer metrics (time to first token, inter-token latency, tokens from the usage).
func BenchmarkRequestPathObserved(b *testing.B) {
	worker := httptest.NewServer(http.HandlerFunc(streamingWorker))
	defer worker.Close()
	cfg := config.Default()
	cfg.Gateway.Address = worker.URL
	cfg.Pipeline.Steps = []config.Step{{Type: "decode"}}
	tel := observe.Telemetry{Metrics: observe.NewMetrics(prometheus.NewRegistry())}
	p, err := builder.Build(cfg, builder.Options{Telemetry: tel})
	if err != nil {
		b.Fatal(err)
	}
	holder := &pipeline.Holder{}
	holder.Swap(p)
	h := server.New(server.Options{Server: cfg.Server, Pipelines: holder, Log: logr.Discard(), Telemetry: tel}).Handler()
	for name, raw := range map[string][]byte{
		"200B":        []byte(`{"model":"m","messages":[{"role":"user","content":"Write a haiku about disaggregated inference, please."}],"max_tokens":16}`),
		"200B-stream": []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"Write a haiku about disaggregated inference, please."}],"max_tokens":16}`),
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			serveChats(b, h, raw)
		})
	}
}

// BenchmarkServed is one request through the coordinator as it runs: its listener and net/http
// server on loopback TCP, a closed loop of 16 keep-alive clients writing whole requests (the
// load harness's shape), and the worker's legs on loopback HTTP. Unlike BenchmarkRequestPath
// (the handler called directly) it pays the connection layer, the request body read from a
// socket and the legs written to one, where large-body costs live. B/op and allocs/op cover the
// coordinator, the in-process worker and the clients (the last two fixed per body).
func BenchmarkServed(b *testing.B) {
	worker := httptest.NewServer(http.HandlerFunc(instantWorker))
	defer worker.Close()
	bodies := benchBodies()
	for _, pname := range []string{"decode-only", "prefill-decode"} {
		steps := []config.Step{{Type: "decode"}}
		if pname == "prefill-decode" {
			steps = []config.Step{{Type: "prefill", Params: map[string]any{"kv_connector": "kv-nixl"}}, {Type: "decode"}}
		}
		cfg := config.Default()
		cfg.Gateway.Address = worker.URL
		cfg.Pipeline.Steps = steps
		p, err := builder.Build(cfg, builder.Options{})
		if err != nil {
			b.Fatal(err)
		}
		holder := &pipeline.Holder{}
		holder.Swap(p)
		srv := server.New(server.Options{Server: cfg.Server, Pipelines: holder, Log: logr.Discard()})
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		go func() { _ = srv.Serve(l) }()
		for _, bname := range []string{"200B", "256KiB-text", "1MiB-image"} {
			raw := bodies[bname]
			req := append([]byte(fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: coordinator\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(raw))), raw...)
			b.Run(pname+"/"+bname, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(raw)))
				b.SetParallelism(8) // 16 clients on 2 CPUs
				b.RunParallel(func(pb *testing.PB) {
					c, err := net.Dial("tcp", l.Addr().String())
					if err != nil {
						b.Error(err)
						return
					}
					defer c.Close()
					br := bufio.NewReader(c)
					for pb.Next() {
						if _, err := c.Write(req); err != nil {
							b.Error(err)
							return
						}
						resp, err := http.ReadResponse(br, nil)
						if err != nil {
							b.Error(err)
							return
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						_ = resp.Body.Close()
						if resp.StatusCode != http.StatusOK {
							b.Errorf("status %d", resp.StatusCode)
							return
						}
					}
				})
			})
		}
		_ = srv.Close()
	}
}

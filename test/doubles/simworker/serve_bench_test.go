//go:build unix

package simworker

import (
	"bytes"
	"context"
	"encoding/base64"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"
)

// benchBody is one chat request body of the benchmarks.
type benchBody struct {
	name string
	// head is the body up to and including "max_tokens":16; the benchmarks
	// append leg-specific members and the closing brace.
	head string
}

// benchBodies returns the chat bodies of test/harness/bench: a ~200 B chat, a 256 KiB
// text chat and a ~1 MiB chat with a text part and an inline base64 JPEG.
func benchBodies() []benchBody {
	chat := func(content string) string {
		return `{"model":"sim-model","messages":[{"role":"user","content":"` + content + `"}],"max_tokens":16`
	}
	img := make([]byte, 768<<10) // 1 MiB of base64
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range img {
		img[i] = byte(rng.Uint32())
	}
	copy(img, []byte{0xff, 0xd8, 0xff, 0xe0})
	return []benchBody{
		{"200B", chat(strings.Repeat("lorem ipsum ", 11))},
		{"256KiB-text", chat(strings.Repeat("lorem ipsum ", 256<<10/12))},
		{"1MiB-image", `{"model":"sim-model","messages":[{"role":"user","content":[{"type":"text","text":"describe this image"},` +
			`{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,` + base64.StdEncoding.EncodeToString(img) + `"}}]}],"max_tokens":16`},
	}
}

// benchServer is a started worker whose ServeHTTP the benchmarks call
// directly, as if requests had arrived on its listener.
type benchServer struct {
	w    *Worker
	addr net.Addr
}

// newBenchServer starts an instant "both" worker that records nothing, like
// the worker of test/harness/bench; decode legs verify their KV transfer through its
// side channel.
func newBenchServer(b *testing.B) *benchServer {
	b.Helper()
	w, err := Start(Config{Role: RoleBoth, DisableRecording: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = w.Close() })
	u, err := url.Parse(w.URL())
	if err != nil {
		b.Fatal(err)
	}
	addr, err := net.ResolveTCPAddr("tcp", u.Host)
	if err != nil {
		b.Fatal(err)
	}
	return &benchServer{w: w, addr: addr}
}

// serve sends one POST to the worker and returns the recorded answer,
// failing the benchmark unless it is a 200.
func (s *benchServer) serve(b *testing.B, path string, body []byte) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, s.addr))
	rec := httptest.NewRecorder()
	s.w.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		b.Fatalf("status %d: %s", rec.Code, rec.Body.Bytes())
	}
	return rec
}

// legBodies returns, for each benchmarked leg of body, a func making its request: the client
// request answered locally, the prefill leg, and the decode leg carrying the kv_transfer_params
// of a prefill leg just served by p (a worker of its own, so that the prefill benchmarks cannot
// evict the handle). A decode frees the blocks it pulled, as vLLM does, so every decode needs a
// prefill of its own (outside the timer; cpu-ns/op, the process's CPU time, still counts it).
func legBodies(b *testing.B, p *benchServer, body benchBody) map[string]func() []byte {
	prefill := []byte(strings.Replace(body.head, `"max_tokens":16`, `"max_tokens":1`, 1) +
		`,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false}}`)
	fixed := func(req []byte) func() []byte { return func() []byte { return req } }
	decode := func(extra string) func() []byte {
		return func() []byte {
			kv := kvOfBody(b, p.serve(b, PathChatCompletions, prefill).Body.Bytes())
			return []byte(body.head + extra + `,"kv_transfer_params":` + kv + `}`)
		}
	}
	return map[string]func() []byte{
		"local":         fixed([]byte(body.head + `}`)),
		"local-stream":  fixed([]byte(body.head + `,"stream":true}`)),
		"prefill":       fixed(prefill),
		"decode":        decode(""),
		"decode-stream": decode(`,"stream":true`),
	}
}

// kvOfBody returns the raw kv_transfer_params member of an answer.
func kvOfBody(b *testing.B, answer []byte) string {
	_, kv, ok := strings.Cut(string(answer), `"kv_transfer_params":`)
	if !ok {
		b.Fatalf("no kv_transfer_params in %s", answer)
	}
	return strings.TrimSuffix(kv, "}")
}

// BenchmarkServeChat measures one chat request through Worker.ServeHTTP for
// each benchmark body and leg (see legBodies).
func BenchmarkServeChat(b *testing.B) {
	s, p := newBenchServer(b), newBenchServer(b)
	for _, body := range benchBodies() {
		legs := legBodies(b, p, body)
		for _, leg := range []string{"local", "local-stream", "prefill", "decode", "decode-stream"} {
			next := legs[leg]
			b.Run(body.name+"/"+leg, func(b *testing.B) {
				b.SetBytes(int64(len(next())))
				b.ReportAllocs()
				defer reportCPU(b)()
				for b.Loop() {
					b.StopTimer() // a decode's prefill is not the decode's cost
					req := next()
					b.StartTimer()
					s.serve(b, PathChatCompletions, req)
				}
			})
		}
	}
}

// BenchmarkServeRender measures the chat render endpoint for each benchmark
// body.
func BenchmarkServeRender(b *testing.B) {
	s := newBenchServer(b)
	for _, body := range benchBodies() {
		req := []byte(body.head + `}`)
		b.Run(body.name, func(b *testing.B) {
			b.SetBytes(int64(len(req)))
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				s.serve(b, PathChatRender, req)
			}
		})
	}
}

// reportCPU starts measuring the CPU time (user and system, all threads:
// handlers, side-channel peers, garbage collection) the process spends; the
// returned function reports it per op as cpu-ns/op. Unlike ns/op it counts
// the work done on other cores, such as concurrent garbage collection.
func reportCPU(b *testing.B) func() {
	start := cpuTime(b)
	return func() {
		b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
	}
}

// cpuTime returns the CPU time the process has used so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

package extprocgw

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/epd-dev/coordinator/test/harness/refused"
	"github.com/epd-dev/coordinator/test/internal/loopback"
)

// fakeEPP is an ext_proc server that behaves as llm-d's EPP does on the wire: it answers the
// request headers and body only after the whole body, picks what pick returns (in the dynamic
// metadata, or the header with viaHeader), or answers immediate when it is set, and streams the
// response body back chunk by chunk through transform.
type fakeEPP struct {
	extprocv3.UnimplementedExternalProcessorServer
	pick      string
	viaHeader bool
	immediate *extprocv3.ImmediateResponse
	transform func([]byte) []byte

	mu   sync.Mutex
	seen []*seen
}

// seen is what the fake got for one request.
type seen struct {
	headers         map[string]string
	body            []byte
	served          string
	responseHeaders map[string]string
}

func headerMap(hm *corev3.HeaderMap) map[string]string {
	out := map[string]string{}
	for _, h := range hm.GetHeaders() {
		out[h.GetKey()] = string(h.GetRawValue())
	}
	return out
}

func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: key, RawValue: []byte(value)}}
}

func streamed(body []byte, eos bool) *extprocv3.CommonResponse {
	return &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
		StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: eos},
	}}}
}

func (f *fakeEPP) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	s := &seen{}
	f.mu.Lock()
	f.seen = append(f.seen, s)
	f.mu.Unlock()
	record := func(update func()) {
		f.mu.Lock()
		defer f.mu.Unlock()
		update()
	}
	for {
		req, err := srv.Recv()
		if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
			return nil // the gateway closed or dropped the stream
		}
		if err != nil {
			return err
		}
		switch v := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			record(func() { s.headers = headerMap(v.RequestHeaders.GetHeaders()) })
		case *extprocv3.ProcessingRequest_RequestBody:
			record(func() { s.body = append(s.body, v.RequestBody.GetBody()...) })
			if !v.RequestBody.GetEndOfStream() {
				continue
			}
			if f.immediate != nil {
				return srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: f.immediate}})
			}
			sets := []*corev3.HeaderValueOption{setHeader("x-epp-touched", "yes"), setHeader("content-length", "1")}
			var md *structpb.Struct
			if f.viaHeader {
				sets = append(sets, setHeader(DestinationKey, f.pick))
			} else {
				md = &structpb.Struct{Fields: map[string]*structpb.Value{MetadataNamespace: structpb.NewStructValue(&structpb.Struct{
					Fields: map[string]*structpb.Value{DestinationKey: structpb.NewStringValue(f.pick)},
				})}}
			}
			if err := srv.Send(&extprocv3.ProcessingResponse{
				Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
					HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: sets, RemoveHeaders: []string{"x-drop-me"}},
				}}},
				DynamicMetadata: md,
			}); err != nil {
				return err
			}
			// the body in two chunks, as the EPP chunks large bodies
			f.mu.Lock()
			body := append([]byte(nil), s.body...)
			f.mu.Unlock()
			half := len(body) / 2
			for i, part := range [][]byte{body[:half], body[half:]} {
				if err := srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
					RequestBody: &extprocv3.BodyResponse{Response: streamed(part, i == 1)},
				}}); err != nil {
					return err
				}
			}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			record(func() {
				s.responseHeaders = headerMap(v.ResponseHeaders.GetHeaders())
				s.served = req.GetMetadataContext().GetFilterMetadata()[MetadataNamespace].GetFields()[ServedKey].GetStringValue()
			})
			if err := srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
				ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
					HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("x-epp-response", "seen")}},
				}},
			}}); err != nil {
				return err
			}
		case *extprocv3.ProcessingRequest_ResponseBody:
			chunk := v.ResponseBody.GetBody()
			if f.transform != nil {
				chunk = f.transform(chunk)
			}
			if err := srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
				ResponseBody: &extprocv3.BodyResponse{Response: streamed(chunk, v.ResponseBody.GetEndOfStream())},
			}}); err != nil {
				return err
			}
		}
	}
}

func (f *fakeEPP) requests() []seen {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]seen, len(f.seen))
	for i, s := range f.seen {
		out[i] = *s
	}
	return out
}

// startEPP serves f on a loopback port (TLS with a self-signed certificate when tlsOn) and
// returns its address.
func startEPP(t *testing.T, f *fakeEPP, tlsOn bool) string {
	t.Helper()
	var opts []grpc.ServerOption
	if tlsOn {
		opts = append(opts, grpc.Creds(credentials.NewServerTLSFromCert(selfSigned(t))))
	}
	srv := grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(srv, f)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

func selfSigned(t *testing.T) *tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// worker is an upstream that records what it got and answers name, or streams it with stream.
type worker struct {
	addr string
	mu   sync.Mutex
	got  []http.Header
	body [][]byte
}

func startWorker(t *testing.T, name string) *worker {
	t.Helper()
	w := &worker{}
	srv, err := loopback.Serve("", http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.mu.Lock()
		w.got = append(w.got, r.Header.Clone())
		w.body = append(w.body, b)
		w.mu.Unlock()
		if r.URL.Query().Get("stream") != "" {
			rw.Header().Set("Content-Type", "text/event-stream")
			for _, part := range []string{"data: a\n\n", "data: b\n\n"} {
				_, _ = io.WriteString(rw, part)
				rw.(http.Flusher).Flush()
			}
			return
		}
		if r.URL.Query().Get("break") != "" {
			rw.Header().Set("Content-Length", "100")
			rw.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(rw, "partial")
			rw.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		rw.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(rw, `{"served_by":"`+name+`"}`)
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	w.addr = strings.TrimPrefix(srv.URL(), "http://")
	return w
}

func (w *worker) requests() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.got)
}

// resetAddr accepts connections, reads the request's first line and resets the connection
// before any response (a worker that dies mid-request).
func resetAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = bufio.NewReader(c).ReadString('\n')
			_ = c.(*net.TCPConn).SetLinger(0)
			_ = c.Close()
		}
	}()
	return ln.Addr().String()
}

func post(t *testing.T, url, body string, header map[string]string) (*http.Response, []byte, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

var retryBoth = &RetryPolicy{RetryOn: []string{RetryConnectFailure, RetryReset}, NumRetries: 2}

func TestGateway(t *testing.T) {
	type endpoint int
	const (
		workerA endpoint = iota
		workerB
		dead
		reset
	)
	cases := []struct {
		name      string
		pick      []endpoint
		viaHeader bool
		retry     *RetryPolicy
		immediate *extprocv3.ImmediateResponse
		// want
		status    int
		body      string
		attempts  []endpoint
		failures  []string
		answered  int        // the EPP's own status
		contacted []endpoint // workers that got the request
	}{
		{name: "pick in the metadata", pick: []endpoint{workerA}, status: 200, body: `{"served_by":"a"}`, attempts: []endpoint{workerA}, failures: []string{""}, contacted: []endpoint{workerA}},
		{name: "pick in the header", pick: []endpoint{workerB}, viaHeader: true, status: 200, body: `{"served_by":"b"}`, attempts: []endpoint{workerB}, failures: []string{""}, contacted: []endpoint{workerB}},
		{name: "a live primary: its fallbacks unused", pick: []endpoint{workerA, workerB}, retry: retryBoth, status: 200, body: `{"served_by":"a"}`, attempts: []endpoint{workerA}, failures: []string{""}, contacted: []endpoint{workerA}},
		{name: "primary refuses, retry policy: the fallback serves", pick: []endpoint{dead, workerB}, retry: retryBoth, status: 200, body: `{"served_by":"b"}`,
			attempts: []endpoint{dead, workerB}, failures: []string{"connection failure", ""}, contacted: []endpoint{workerB}},
		{name: "primary refuses, no retry policy: 503", pick: []endpoint{dead, workerB}, status: 503, body: BodyUpstreamFailure("connection failure", false),
			attempts: []endpoint{dead}, failures: []string{"connection failure"}},
		{name: "primary resets before headers, retry on reset: the fallback serves", pick: []endpoint{reset, workerA}, retry: retryBoth, status: 200, body: `{"served_by":"a"}`,
			attempts: []endpoint{reset, workerA}, failures: []string{"connection termination", ""}, contacted: []endpoint{workerA}},
		{name: "primary resets, retry on connect-failure only: 503", pick: []endpoint{reset, workerA}, retry: &RetryPolicy{RetryOn: []string{RetryConnectFailure}, NumRetries: 2},
			status: 503, body: BodyUpstreamFailure("connection termination", false), attempts: []endpoint{reset}, failures: []string{"connection termination"}},
		{name: "no fallback left: 503 after the retry", pick: []endpoint{dead, dead}, retry: retryBoth, status: 503, body: BodyUpstreamFailure("connection failure", true),
			attempts: []endpoint{dead, dead}, failures: []string{"connection failure", "connection failure"}},
		{name: "retries spent before the list", pick: []endpoint{dead, reset, workerA}, retry: &RetryPolicy{RetryOn: []string{RetryConnectFailure, RetryReset}, NumRetries: 1},
			status: 503, body: BodyUpstreamFailure("connection termination", true), attempts: []endpoint{dead, reset}, failures: []string{"connection failure", "connection termination"}},
		{name: "a single refused pick with a retry policy: 503", pick: []endpoint{dead}, retry: retryBoth, status: 503, body: BodyUpstreamFailure("connection failure", false),
			attempts: []endpoint{dead}, failures: []string{"connection failure"}},
		{name: "immediate 412", immediate: &extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: typev3.StatusCode_PreconditionFailed}, Body: []byte("no decode worker has the requested KV cache")},
			status: 412, body: "no decode worker has the requested KV cache", answered: 412},
		{name: "immediate 429 with a header", immediate: &extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests}, Body: []byte("dropping request"),
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("x-request-dropped-reason", "no-endpoints")}}},
			status: 429, body: "dropping request", answered: 429},
		{name: "immediate 503", immediate: &extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: typev3.StatusCode_ServiceUnavailable}, Body: []byte("no pods")},
			status: 503, body: "no pods", answered: 503},
		{name: "no pick: no healthy upstream", pick: nil, status: 503, body: BodyNoHealthyUpstream},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := startWorker(t, "a"), startWorker(t, "b")
			addrs := map[endpoint]string{workerA: a.addr, workerB: b.addr, dead: refused.Addr(t), reset: resetAddr(t)}
			var pick []string
			for i, e := range tc.pick {
				addr := addrs[e]
				if e == dead && i > 0 {
					addr = refused.Addr(t) // a second dead endpoint
				}
				pick = append(pick, addr)
			}
			f := &fakeEPP{pick: strings.Join(pick, ","), viaHeader: tc.viaHeader, immediate: tc.immediate}
			gw, err := Start(Config{EPP: startEPP(t, f, false), Plaintext: true, Retry: tc.retry, RecordBodies: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = gw.Close() })
			resp, body, err := post(t, gw.URL()+"/v1/chat/completions", `{"model":"m","messages":[]}`,
				map[string]string{"EPP-Profile": "decode", "X-Request-Id": "req-1", "X-Drop-Me": "1", "Content-Type": "application/json"})
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || string(body) != tc.body {
				t.Fatalf("got %d %q, want %d %q", resp.StatusCode, body, tc.status, tc.body)
			}
			if tc.name == "immediate 429 with a header" && resp.Header.Get("X-Request-Dropped-Reason") != "no-endpoints" {
				t.Errorf("the immediate response's header was not relayed: %v", resp.Header)
			}
			recs := gw.Settled(t.Context())
			if len(recs) != 1 {
				t.Fatalf("%d records", len(recs))
			}
			rec := recs[0]
			if rec.RequestID != "req-1" || rec.Header.Get("X-Drop-Me") != "1" || rec.Profile != "decode" || rec.Path != "/v1/chat/completions" || rec.Status != tc.status || rec.Immediate != tc.answered {
				t.Errorf("record %+v", rec)
			}
			if tc.answered == 0 && (strings.Join(rec.Picks, ",") != f.pick || string(rec.Body) != `{"model":"m","messages":[]}`) {
				t.Errorf("picks %v, body %q; want %s and the body", rec.Picks, rec.Body, f.pick)
			}
			if len(rec.Attempts) != len(tc.attempts) {
				t.Fatalf("attempts %+v, want %d", rec.Attempts, len(tc.attempts))
			}
			for i, at := range rec.Attempts {
				if at.Endpoint != pick[i] || at.Failure != tc.failures[i] || (at.Failure == "") != (at.Status == 200) {
					t.Errorf("attempt %d: %+v, want %s %q", i, at, pick[i], tc.failures[i])
				}
			}
			got := map[endpoint]int{workerA: a.requests(), workerB: b.requests()}
			for _, e := range tc.contacted {
				got[e]--
			}
			if got[workerA] != 0 || got[workerB] != 0 {
				t.Errorf("workers contacted: a %d, b %d; want %v", a.requests(), b.requests(), tc.contacted)
			}
			// What the EPP saw: the pseudo-headers and the request's headers, then the whole body.
			seen := f.requests()
			if len(seen) != 1 {
				t.Fatalf("the EPP saw %d streams", len(seen))
			}
			h := seen[0].headers
			if h[":method"] != "POST" || h[":path"] != "/v1/chat/completions" || h[":scheme"] != "http" || h[":authority"] == "" ||
				h["epp-profile"] != "decode" || h["x-request-id"] != "req-1" || string(seen[0].body) != `{"model":"m","messages":[]}` {
				t.Errorf("the EPP saw %v %q", h, seen[0].body)
			}
			if tc.status == 200 {
				served := pick[len(rec.Attempts)-1]
				if seen[0].served != served || seen[0].responseHeaders[":status"] != "200" {
					t.Errorf("the EPP was told %q served, status %q; want %s", seen[0].served, seen[0].responseHeaders[":status"], served)
				}
				if resp.Header.Get("X-Epp-Response") != "seen" {
					t.Errorf("the EPP's response header mutation was not applied: %v", resp.Header)
				}
				w := a
				if tc.contacted[0] == workerB {
					w = b
				}
				w.mu.Lock()
				wh, wb := w.got[0], w.body[0]
				w.mu.Unlock()
				if wh.Get("X-Epp-Touched") != "yes" || wh.Get("X-Drop-Me") != "" || string(wb) != `{"model":"m","messages":[]}` {
					t.Errorf("the worker got %v %q", wh, wb)
				}
			}
		})
	}
}

// The response body passes through the EPP chunk by chunk; a stream arrives event by event.
func TestResponseBodyThroughTheEPP(t *testing.T) {
	a := startWorker(t, "a")
	f := &fakeEPP{pick: a.addr, transform: bytes.ToUpper}
	gw, err := Start(Config{EPP: startEPP(t, f, true)}) // TLS, certificate not verified
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	resp, body, err := post(t, gw.URL()+"/v1/chat/completions?stream=1", `{"stream":true}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || string(body) != "DATA: A\n\nDATA: B\n\n" || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("got %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if rec := gw.Records()[0]; rec.RequestID == "" {
		t.Errorf("no request id generated: %+v", rec)
	}
	if id := f.requests()[0].headers["x-request-id"]; id == "" {
		t.Error("the EPP got no x-request-id")
	}

	// Unstreamed, with the body mode NONE: relayed as the worker sent it.
	gw2, err := Start(Config{EPP: startEPP(t, &fakeEPP{pick: a.addr, transform: bytes.ToUpper}, false), Plaintext: true, ResponseBody: None})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw2.Close() })
	resp, body, err = post(t, gw2.URL()+"/v1/completions", `{}`, nil)
	if err != nil || resp.StatusCode != http.StatusOK || string(body) != `{"served_by":"a"}` {
		t.Fatalf("got %v %q %v", resp, body, err)
	}
}

// A worker connection that breaks after the headers resets the client's connection.
func TestBrokenAfterHeaders(t *testing.T) {
	a := startWorker(t, "a")
	gw, err := Start(Config{EPP: startEPP(t, &fakeEPP{pick: a.addr}, false), Plaintext: true, Retry: retryBoth})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	resp, body, err := post(t, gw.URL()+"/v1/completions?break=1", `{}`, nil)
	if err == nil || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("got %v %q %v, want an unexpected EOF", resp, body, err)
	}
	if resp.StatusCode != http.StatusOK || len(body) > len("partial") || string(body) != "partial"[:len(body)] {
		t.Errorf("got %d %q before the reset", resp.StatusCode, body)
	}
	rec := gw.Settled(t.Context())[0]
	if !rec.Broken || len(rec.Attempts) != 1 || rec.Attempts[0].Status != 200 {
		t.Errorf("record %+v", rec)
	}
}

// An unreachable EPP is a 500, as Envoy answers with failure_mode_allow false.
func TestEPPUnreachable(t *testing.T) {
	gw, err := Start(Config{EPP: refused.Addr(t), Plaintext: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	resp, _, err := post(t, gw.URL()+"/v1/completions", `{}`, nil)
	if err != nil || resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("got %v %v", resp, err)
	}
}

// Package extprocgw is a stand-in for Envoy in front of a real endpoint picker (EPP), written to
// Envoy's documented behaviour for the tests that run the coordinator against llm-d's EPP
// (test/suites/realepp). No Envoy runs on the build machines; this is the part of it those
// tests need, configured as llm-d's guides configure Envoy for the coordinator topology
// (llm-d-router test/coordinator/e2e/coordinator/testdata/envoy.yaml): one HTTP/1.1 listener
// whose route runs the ext_proc filter toward the EPP and forwards to the endpoint it picks.
//
// # Per request (envoy.filters.http.ext_proc, processing_mode as the guides set it)
//
//   - request_header_mode SEND: one ext_proc stream per request, opened with the request's
//     headers (the pseudo-headers :method, :path, :authority and :scheme first, then every
//     request header, values in raw_value). A request without x-request-id gets one (the HTTP
//     connection manager's generate_request_id; the guides' preserve_external_request_id keeps
//     the caller's, the coordinator's).
//   - request_body_mode FULL_DUPLEX_STREAMED: the body is streamed to the EPP as it is read,
//     the last chunk with end_of_stream; the EPP answers the headers and the body only once it
//     has the whole body (it schedules on it). The body forwarded is the concatenation of the
//     EPP's streamed_response chunks; Content-Length is recomputed (Envoy removes the header in
//     this mode and never lets a processor set it).
//   - The answers are applied as Envoy applies them: header mutations (set_headers overwrite,
//     or add with append: true; :method, :authority, :scheme, host and x-envoy-* are not
//     settable; remove_headers), the dynamic metadata, and an ImmediateResponse, which is the
//     client's answer (its status, its header mutations, its body as text/plain unless it set
//     a content type) and ends the request: nothing is forwarded.
//   - The pick: the dynamic metadata envoy.lb / x-gateway-destination-endpoint, else the header
//     of that name (GAIE's endpoint picker protocol), a comma-separated list: the primary
//     endpoint first, then fallbacks. A request without a pick gets 503 "no healthy upstream".
//   - response_header_mode SEND: the worker's status (as :status) and headers go to the EPP,
//     with the endpoint that served in the metadata_context envoy.lb /
//     x-gateway-destination-endpoint-served (the protocol's "Destination Endpoint Served"), and
//     its header mutations apply to the client's response, so the EPP's response plugins run.
//   - response_body_mode (Config.ResponseBody): FULL_DUPLEX_STREAMED (the guides' default) sends
//     each chunk of the worker's body to the EPP and writes the EPP's streamed_response chunks to
//     the client as they come (flushed: server-sent events arrive one by one; the EPP answers a
//     streamed response chunk by chunk and an unstreamed one once whole); the client's response
//     is chunked (Envoy drops Content-Length in this mode). NONE relays the body directly.
//   - A worker connection that breaks after the response headers resets the client's
//     connection mid-body, as Envoy's downstream reset does.
//
// # Upstream failures and the route's retry policy (Config.Retry)
//
// The cluster is modelled as the guides' InferencePool backend with Envoy's override_host load
// balancing policy reading the pick (envoy.load_balancing_policies.override_host; Istio and
// Envoy Gateway configure it that way): the first attempt goes to the primary endpoint and each
// retry to the next endpoint of the pick's list. Without a retry policy (Envoy's default: none)
// a connection refused, or a connection reset or closed before the response headers, is
// answered 503 text/plain "upstream connect error or disconnect/reset before headers. reset
// reason: connection failure" (or "... connection termination"). With a policy whose RetryOn
// lists the failure (connect-failure, reset) and retries left, the request is sent again, with
// the same headers and body, to the next endpoint of the list; when none is left, or the
// retries are spent, the last failure is answered as above ("... retried and the latest reset
// reason: ..." after a retry). What this stand-in does not model: Envoy's retry backoff (25 ms
// base, jittered: retries here are immediate), the override_host policy's fallback load
// balancer (which, once the list is exhausted, would pick any endpoint of the cluster), the
// retry buffer limit (per_connection_buffer_limit_bytes: bodies over it are not retried by
// Envoy; here every body is), and the route timeout.
//
// The ext_proc stream failing (the EPP unreachable or resetting the stream) is answered 500
// text/plain, as Envoy does with failure_mode_allow false (the guides' setting).
package extprocgw

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/epd-dev/coordinator/test/internal/loopback"
)

// The GAIE endpoint picker protocol's names.
const (
	// MetadataNamespace is the dynamic metadata namespace of the pick.
	MetadataNamespace = "envoy.lb"
	// DestinationKey names the pick, in the metadata and as a header.
	DestinationKey = "x-gateway-destination-endpoint"
	// ServedKey names the endpoint that served, in the metadata sent with the response headers.
	ServedKey = "x-gateway-destination-endpoint-served"
)

// Retry conditions (Envoy's retry_on names) the stand-in understands.
const (
	// RetryConnectFailure: the connection to the endpoint could not be made.
	RetryConnectFailure = "connect-failure"
	// RetryReset: the connection was reset or closed before the response headers.
	RetryReset = "reset"
)

// The plain-text bodies of the answers the stand-in makes itself, as Envoy words them.
const (
	BodyNoHealthyUpstream = "no healthy upstream"
	bodyResetPrefix       = "upstream connect error or disconnect/reset before headers. "
	reasonConnect         = "connection failure"
	reasonTermination     = "connection termination"
)

// BodyUpstreamFailure is Envoy's local reply to an upstream failure before the response
// headers: reason is "connection failure" or "connection termination", retried whether the
// request was retried first.
func BodyUpstreamFailure(reason string, retried bool) string {
	if retried {
		return bodyResetPrefix + "retried and the latest reset reason: " + reason
	}
	return bodyResetPrefix + "reset reason: " + reason
}

// BodyMode is an ext_proc body processing mode.
type BodyMode int

const (
	// FullDuplexStreamed is FULL_DUPLEX_STREAMED (the zero value).
	FullDuplexStreamed BodyMode = iota
	// None is NONE: the body does not go to the processor.
	None
)

// RetryPolicy is the route's retry_policy.
type RetryPolicy struct {
	// RetryOn lists the conditions that are retried (RetryConnectFailure, RetryReset).
	RetryOn []string
	// NumRetries is the most retries of one request (Envoy's num_retries).
	NumRetries int
}

func (p *RetryPolicy) retries(reason string) bool {
	if p == nil {
		return false
	}
	want := RetryReset
	if reason == reasonConnect {
		want = RetryConnectFailure
	}
	for _, on := range p.RetryOn {
		if on == want {
			return true
		}
	}
	return false
}

// Config configures a Gateway.
type Config struct {
	// EPP is the endpoint picker's ext_proc address (host:port).
	EPP string
	// Plaintext talks to EPP without TLS (tests' fake processors). The default is TLS without
	// certificate verification, as the guides' empty validation_context toward the EPP's
	// self-signed certificate.
	Plaintext bool
	// Retry is the route's retry policy; nil: no retries (Envoy's default).
	Retry *RetryPolicy
	// ResponseBody is the response_body_mode (default FULL_DUPLEX_STREAMED).
	ResponseBody BodyMode
	// ConnectTimeout bounds a connection to an endpoint (the cluster's connect_timeout).
	// Default 5s.
	ConnectTimeout time.Duration
	// Addr is the listen address. Default "127.0.0.1:0".
	Addr string
	// RecordBodies keeps each forwarded request body in its Record.
	RecordBodies bool
}

// Attempt is one try of a request at an endpoint.
type Attempt struct {
	Endpoint string
	// Status is the endpoint's response status; 0 when it failed before its headers.
	Status int
	// Failure is the failure before the headers ("connection failure", "connection
	// termination"), or "".
	Failure string
}

// Record is what the stand-in did with one request.
type Record struct {
	// RequestID is the request's x-request-id (generated when it had none).
	RequestID string
	// Header is the request's headers as the stand-in received them.
	Header http.Header
	// Profile is the request's EPP-Profile (or x-llm-d-epp-profile) header.
	Profile string
	Path    string
	// Picks is the EPP's list, primary first (nil when it answered itself).
	Picks []string
	// Immediate is the status of the EPP's ImmediateResponse, 0 when it picked.
	Immediate int
	// Attempts are the tries at endpoints, in order.
	Attempts []Attempt
	// Status is the status the client got (0 while in flight; 499 when the client left first).
	Status int
	// Broken reports that the endpoint's connection broke after the response headers (the
	// client's connection was reset mid-body).
	Broken bool
	// Body is the request body as forwarded (Config.RecordBodies).
	Body []byte
}

// Served is the endpoint that answered with headers, or "".
func (r Record) Served() string {
	for _, a := range r.Attempts {
		if a.Status != 0 {
			return a.Endpoint
		}
	}
	return ""
}

// Gateway is a running stand-in.
type Gateway struct {
	cfg       Config
	conn      *grpc.ClientConn
	client    extprocv3.ExternalProcessorClient
	transport *http.Transport
	srv       *loopback.Server

	mu      sync.Mutex
	records []*Record
	changed chan struct{} // closed and replaced on every record update
}

// Start connects to the EPP (lazily, as gRPC does) and starts serving.
func Start(cfg Config) (*Gateway, error) {
	if cfg.EPP == "" {
		return nil, errors.New("extprocgw: no EPP address")
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 5 * time.Second
	}
	creds := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the guides' empty validation_context: the EPP's certificate is self-signed
	if cfg.Plaintext {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(cfg.EPP, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	g := &Gateway{
		changed: make(chan struct{}),
		cfg:     cfg,
		conn:    conn,
		client:  extprocv3.NewExternalProcessorClient(conn),
		transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: cfg.ConnectTimeout}).DialContext,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
	}
	if g.srv, err = loopback.Serve(cfg.Addr, g); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return g, nil
}

// URL is the listener's base URL.
func (g *Gateway) URL() string { return g.srv.URL() }

// Close stops serving and closes the EPP connection.
func (g *Gateway) Close() error {
	err := g.srv.Close()
	g.transport.CloseIdleConnections()
	return errors.Join(err, g.conn.Close())
}

// Records returns copies of the records in arrival order.
func (g *Gateway) Records() []Record {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]Record, len(g.records))
	for i, r := range g.records {
		out[i] = *r
		out[i].Picks = append([]string(nil), r.Picks...)
		out[i].Attempts = append([]Attempt(nil), r.Attempts...)
	}
	return out
}

// Settled returns the records once none is in flight (a client can read the end of an answer
// before the stand-in has recorded how the request ended), or as they are when ctx ends.
func (g *Gateway) Settled(ctx context.Context) []Record {
	for {
		g.mu.Lock()
		inflight := false
		for _, r := range g.records {
			inflight = inflight || r.Status == 0
		}
		changed := g.changed
		g.mu.Unlock()
		if !inflight {
			return g.Records()
		}
		select {
		case <-ctx.Done():
			return g.Records()
		case <-changed:
		}
	}
}

// Reset forgets the records.
func (g *Gateway) Reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.records = nil
}

func (g *Gateway) update(f func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f()
	close(g.changed)
	g.changed = make(chan struct{})
}

// errStream is an ext_proc protocol or transport failure.
type errStream struct{ err error }

func (e errStream) Error() string { return "ext_proc: " + e.err.Error() }

// ServeHTTP handles one request as Envoy's ext_proc filter and router do.
func (g *Gateway) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Header.Get("X-Request-Id") == "" {
		r.Header.Set("X-Request-Id", uuid.NewString())
	}
	profile := r.Header.Get("EPP-Profile")
	if profile == "" {
		profile = r.Header.Get("X-Llm-D-Epp-Profile")
	}
	rec := &Record{RequestID: r.Header.Get("X-Request-Id"), Header: r.Header.Clone(), Profile: profile, Path: r.URL.Path}
	g.update(func() { g.records = append(g.records, rec) })
	sw := loopback.NewStatusWriter(rw)
	defer func() {
		g.update(func() {
			rec.Status = sw.Status()
			if rec.Status == 0 {
				rec.Status = 499
			}
		})
	}()

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stream, err := g.client.Process(ctx)
	if err != nil {
		writePlain(sw, http.StatusInternalServerError, "ext_proc: "+err.Error())
		return
	}
	req, err := g.requestPhase(stream, r)
	if err != nil {
		var ir *immediate
		if errors.As(err, &ir) {
			g.update(func() { rec.Immediate = ir.status })
			ir.write(sw)
			return
		}
		if r.Context().Err() == nil {
			writePlain(sw, http.StatusInternalServerError, err.Error())
		}
		return
	}
	picks := req.picks()
	g.update(func() {
		rec.Picks = picks
		if g.cfg.RecordBodies {
			rec.Body = req.body
		}
	})
	if len(picks) == 0 {
		writePlain(sw, http.StatusServiceUnavailable, BodyNoHealthyUpstream)
		return
	}
	resp, endpoint, failure, retried := g.forward(ctx, r, req, picks, rec)
	if resp == nil {
		if r.Context().Err() == nil {
			writePlain(sw, http.StatusServiceUnavailable, BodyUpstreamFailure(failure, retried))
		}
		return
	}
	defer resp.Body.Close()
	if err := g.responsePhase(stream, cancel, sw, resp, endpoint); err != nil {
		if r.Context().Err() != nil {
			return
		}
		var ir *immediate
		if errors.As(err, &ir) && sw.Status() == 0 {
			ir.write(sw)
			return
		}
		if sw.Status() == 0 {
			writePlain(sw, http.StatusInternalServerError, err.Error())
			return
		}
		g.update(func() { rec.Broken = true })
		panic(http.ErrAbortHandler) // reset the client's connection mid-body, as Envoy does
	}
}

// request is the request as the EPP left it.
type request struct {
	header   http.Header
	path     string
	body     []byte
	metadata *structpb.Struct
}

// picks reads the EPP's endpoint list: the metadata first, else the header.
func (q *request) picks() []string {
	value := ""
	if q.metadata != nil {
		if ns := q.metadata.GetFields()[MetadataNamespace].GetStructValue(); ns != nil {
			value = ns.GetFields()[DestinationKey].GetStringValue()
		}
	}
	if value == "" {
		value = q.header.Get(DestinationKey)
	}
	var out []string
	for e := range strings.SplitSeq(value, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// immediate is the EPP's own answer.
type immediate struct {
	status int
	header http.Header
	body   []byte
}

func (i *immediate) Error() string { return "immediate response " + strconv.Itoa(i.status) }

func newImmediate(ir *extprocv3.ImmediateResponse) *immediate {
	out := &immediate{status: int(ir.GetStatus().GetCode()), header: http.Header{}, body: ir.GetBody()}
	if out.status < 200 { // Envoy: an invalid status becomes 500
		out.status = http.StatusInternalServerError
	}
	applyMutation(out.header, ir.GetHeaders(), false)
	return out
}

func (i *immediate) write(w http.ResponseWriter) {
	for k, v := range i.header {
		w.Header()[k] = v
	}
	if w.Header().Get("Content-Type") == "" && len(i.body) > 0 {
		w.Header().Set("Content-Type", "text/plain")
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(i.body)))
	w.WriteHeader(i.status)
	_, _ = w.Write(i.body)
}

// bodyChunk is how much of a body goes in one ext_proc message at most (Envoy sends what it
// read from the connection; the EPP chunks at 62 KB).
const bodyChunk = 64 << 10

// requestPhase sends the request's headers and body to the EPP and applies its answers. The
// body is read whole first and then streamed to the EPP in chunks: the EPP answers nothing
// before the end of the body, so it sees what Envoy would send it.
func (g *Gateway) requestPhase(stream extprocv3.ExternalProcessor_ProcessClient, r *http.Request) (*request, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	header := r.Header.Clone()
	noBody := len(body) == 0
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte(r.Method)},
		{Key: ":path", RawValue: []byte(r.URL.RequestURI())},
		{Key: ":authority", RawValue: []byte(r.Host)},
		{Key: ":scheme", RawValue: []byte("http")},
	}}
	for k, vs := range header {
		for _, v := range vs {
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
		}
	}
	sendErr := make(chan error, 1)
	go func() {
		sendErr <- func() error {
			if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
				RequestHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: noBody},
			}}); err != nil {
				return err
			}
			for off := 0; off < len(body); off += bodyChunk {
				end := min(off+bodyChunk, len(body))
				if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
					RequestBody: &extprocv3.HttpBody{Body: body[off:end], EndOfStream: end == len(body)},
				}}); err != nil {
					return err
				}
			}
			return nil
		}()
	}()

	q := &request{header: header, path: r.URL.RequestURI()}
	headersDone, bodyDone := false, noBody
	for !headersDone || !bodyDone {
		resp, err := stream.Recv()
		if err != nil {
			select {
			case e := <-sendErr:
				if e != nil {
					return nil, errStream{fmt.Errorf("sending the request: %w", e)}
				}
			default:
			}
			return nil, errStream{err}
		}
		if md := resp.GetDynamicMetadata(); md != nil {
			q.metadata = mergeStruct(q.metadata, md)
		}
		switch v := resp.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			return nil, newImmediate(v.ImmediateResponse)
		case *extprocv3.ProcessingResponse_RequestHeaders:
			if headersDone {
				return nil, errStream{errors.New("a second request headers response")}
			}
			headersDone = true
			applyMutation(q.header, v.RequestHeaders.GetResponse().GetHeaderMutation(), true)
			if p := q.header.Get(":path"); p != "" {
				q.path = p
			}
			q.header.Del(":path")
		case *extprocv3.ProcessingResponse_RequestBody:
			if !headersDone {
				return nil, errStream{errors.New("a request body response before the headers response")}
			}
			sr := v.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				return nil, errStream{errors.New("a request body response without streamed_response in FULL_DUPLEX_STREAMED mode")}
			}
			q.body = append(q.body, sr.GetBody()...)
			bodyDone = sr.GetEndOfStream()
		default:
			return nil, errStream{fmt.Errorf("unexpected %T during the request", v)}
		}
	}
	if err := <-sendErr; err != nil {
		return nil, errStream{fmt.Errorf("sending the request: %w", err)}
	}
	return q, nil
}

// forward sends the request to the pick, retrying down the list as the route's policy allows.
// It returns the response and its endpoint, or nil with the last failure's reason.
func (g *Gateway) forward(ctx context.Context, r *http.Request, q *request, picks []string, rec *Record) (*http.Response, string, string, bool) {
	failure := ""
	for i, endpoint := range picks {
		if i > 0 && (g.cfg.Retry == nil || i > g.cfg.Retry.NumRetries || !g.cfg.Retry.retries(failure)) {
			return nil, "", failure, i > 1
		}
		resp, reason := g.try(ctx, r, q, endpoint)
		at := Attempt{Endpoint: endpoint, Failure: reason}
		if resp != nil {
			at.Status = resp.StatusCode
		}
		g.update(func() { rec.Attempts = append(rec.Attempts, at) })
		if resp != nil {
			return resp, endpoint, "", i > 0
		}
		if ctx.Err() != nil {
			return nil, "", reason, i > 0
		}
		failure = reason
	}
	return nil, "", failure, len(picks) > 1
}

// try sends the request to one endpoint; a failure before the headers is returned as its reason.
func (g *Gateway) try(ctx context.Context, r *http.Request, q *request, endpoint string) (*http.Response, string) {
	out, err := http.NewRequestWithContext(ctx, r.Method, "http://"+endpoint+q.path, bytes.NewReader(q.body))
	if err != nil {
		return nil, reasonTermination
	}
	for k, vs := range q.header {
		if strings.HasPrefix(k, ":") || hopByHop[k] {
			continue
		}
		out.Header[k] = vs
	}
	out.Host = r.Host
	out.ContentLength = int64(len(q.body))
	resp, err := g.transport.RoundTrip(out)
	if err != nil {
		if op := (*net.OpError)(nil); errors.As(err, &op) && op.Op == "dial" {
			return nil, reasonConnect
		}
		return nil, reasonTermination
	}
	return resp, ""
}

// hopByHop are the headers a proxy does not forward (Content-Length is set from the body).
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true, "Trailer": true,
	"Transfer-Encoding": true, "Upgrade": true, "Content-Length": true,
}

// responsePhase sends the response's headers and body through the EPP to the client.
func (g *Gateway) responsePhase(stream extprocv3.ExternalProcessor_ProcessClient, cancel context.CancelFunc, w http.ResponseWriter, resp *http.Response, endpoint string) error {
	served := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		MetadataNamespace: {Fields: map[string]*structpb.Value{ServedKey: structpb.NewStringValue(endpoint)}},
	}}
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(strconv.Itoa(resp.StatusCode))}}}
	for k, vs := range resp.Header {
		for _, v := range vs {
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
		}
	}
	noBody := resp.ContentLength == 0
	if err := stream.Send(&extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: noBody}},
		MetadataContext: served,
	}); err != nil {
		return errStream{err}
	}
	header := resp.Header.Clone()
	pr, err := stream.Recv()
	if err != nil {
		return errStream{err}
	}
	if ir := pr.GetImmediateResponse(); ir != nil {
		return newImmediate(ir)
	}
	hr := pr.GetResponseHeaders()
	if hr == nil {
		return errStream{fmt.Errorf("unexpected %T answering the response headers", pr.GetResponse())}
	}
	applyMutation(header, hr.GetResponse().GetHeaderMutation(), g.cfg.ResponseBody == FullDuplexStreamed)
	for k := range hopByHop {
		header.Del(k)
	}
	streamed := g.cfg.ResponseBody == FullDuplexStreamed && !noBody
	if !streamed && resp.ContentLength >= 0 {
		header.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	for k, vs := range header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	flush := func() { _ = http.NewResponseController(w).Flush() }
	flush()
	if noBody {
		return nil
	}
	if !streamed {
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				if _, werr := w.Write(buf[:n]); werr != nil {
					return werr
				}
				flush()
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
		}
	}

	// FULL_DUPLEX_STREAMED: the worker's chunks go to the EPP as they arrive; its chunks go to
	// the client as they arrive. A worker connection that breaks is reported in upstreamErr
	// before the stream is cancelled, which ends the wait for the EPP.
	upstreamErr := make(chan error, 1)
	go func() {
		buf := make([]byte, bodyChunk)
		for {
			n, err := resp.Body.Read(buf)
			eof := errors.Is(err, io.EOF)
			if err != nil && !eof {
				upstreamErr <- err
				cancel()
				return
			}
			if n > 0 || eof {
				if serr := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
					ResponseBody: &extprocv3.HttpBody{Body: append([]byte(nil), buf[:n]...), EndOfStream: eof},
				}}); serr != nil || eof {
					return
				}
			}
		}
	}()
	for {
		pr, err := stream.Recv()
		if err != nil {
			select {
			case uerr := <-upstreamErr:
				return uerr
			default:
				return errStream{err}
			}
		}
		br := pr.GetResponseBody()
		if br == nil {
			return errStream{fmt.Errorf("unexpected %T answering the response body", pr.GetResponse())}
		}
		sr := br.GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			return errStream{errors.New("a response body response without streamed_response in FULL_DUPLEX_STREAMED mode")}
		}
		if len(sr.GetBody()) > 0 {
			if _, err := w.Write(sr.GetBody()); err != nil {
				return err
			}
			flush()
		}
		if sr.GetEndOfStream() {
			return nil
		}
	}
}

// unsettable are the headers an ext_proc processor may not set (Envoy's default mutation rules).
var unsettable = map[string]bool{":method": true, ":authority": true, ":scheme": true, "host": true}

// applyMutation applies a header mutation as Envoy's ext_proc does: removals, then sets
// (overwrite unless append is true). skipContentLength drops a Content-Length set, as Envoy does
// in the streamed body modes.
func applyMutation(h http.Header, m *extprocv3.HeaderMutation, skipContentLength bool) {
	if m == nil {
		return
	}
	for _, name := range m.GetRemoveHeaders() {
		lower := strings.ToLower(name)
		if unsettable[lower] || strings.HasPrefix(lower, "x-envoy-") || strings.HasPrefix(lower, ":") {
			continue
		}
		h.Del(name)
	}
	for _, sh := range m.GetSetHeaders() {
		hv := sh.GetHeader()
		if hv == nil {
			continue
		}
		key := strings.ToLower(hv.GetKey())
		if unsettable[key] || strings.HasPrefix(key, "x-envoy-") || (skipContentLength && key == "content-length") ||
			(strings.HasPrefix(key, ":") && key != ":path") {
			continue
		}
		value := string(hv.GetRawValue())
		if value == "" {
			value = hv.GetValue()
		}
		name := key
		if !strings.HasPrefix(key, ":") {
			name = http.CanonicalHeaderKey(key)
		}
		if sh.GetAppend().GetValue() { //nolint:staticcheck // Envoy's ext_proc reads the deprecated append field, not append_action
			h[name] = append(h[name], value)
		} else {
			h[name] = []string{value}
		}
	}
}

// mergeStruct merges b's namespaces into a (a later answer's keys win), as Envoy merges dynamic
// metadata.
func mergeStruct(a, b *structpb.Struct) *structpb.Struct {
	if a == nil {
		return b
	}
	for ns, v := range b.GetFields() {
		old := a.GetFields()[ns].GetStructValue()
		nv := v.GetStructValue()
		if old == nil || nv == nil {
			a.Fields[ns] = v
			continue
		}
		for k, f := range nv.GetFields() {
			old.Fields[k] = f
		}
	}
	return a
}

// writePlain answers status with a text/plain body, as Envoy's local replies are.
func writePlain(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

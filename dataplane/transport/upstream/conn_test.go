package upstream

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
)

// pieces is a WholeBody over several slices that counts how it was sent.
type pieces struct {
	bufs    net.Buffers
	writeTo int
	reads   int // bytes that went through Read (net/http also reads past the end, to check the length)
}

// handedOver is a pieces that also hands its slices over (piecewise), counting the calls.
type handedOver struct {
	*pieces
	calls, closed int
}

func (h *handedOver) Pieces() net.Buffers { h.calls++; return h.bufs }
func (h *handedOver) Close() error        { h.closed++; return nil }

func (p *pieces) Read(b []byte) (int, error) {
	n, err := p.bufs.Read(b)
	p.reads += n
	return n, err
}

// Close makes pieces a ReadCloser, as a WholeBody must be (or net/http wraps it).
func (p *pieces) Close() error { return nil }

func (p *pieces) WriteTo(w io.Writer) (int64, error) { p.writeTo++; return p.bufs.WriteTo(w) }

func (p *pieces) Len() int64 {
	var n int64
	for _, b := range p.bufs {
		n += int64(len(b))
	}
	return n
}

// recordConn is a net.Conn that keeps what is written to it.
type recordConn struct {
	net.Conn
	out bytes.Buffer
}

func (c *recordConn) Write(b []byte) (int, error) { return c.out.Write(b) }

func newPieces(parts ...string) *pieces {
	p := &pieces{}
	for _, s := range parts {
		p.bufs = append(p.bufs, []byte(s))
	}
	return p
}

func TestLegConnReadFrom(t *testing.T) {
	tests := map[string]struct {
		body      *pieces
		limit     int64
		want      string
		vectored  bool
		remaining int64
	}{
		"whole body within the limit: one vectored write": {body: newPieces("ab", "cd", "ef"), limit: 6, want: "abcdef", vectored: true},
		"limit larger than the body":                      {body: newPieces("ab", "c"), limit: 10, want: "abc", vectored: true, remaining: 7},
		"body longer than the limit: copied up to it":     {body: newPieces("ab", "cd"), limit: 3, want: "abc"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := &legConn{Conn: &recordConn{}}
			lr := &io.LimitedReader{R: tc.body, N: tc.limit}
			n, err := c.ReadFrom(lr)
			rec := c.Conn.(*recordConn)
			if err != nil || rec.out.String() != tc.want || n != int64(len(tc.want)) {
				t.Fatalf("wrote %q (%d), err %v; want %q", rec.out.String(), n, err, tc.want)
			}
			if vectored := tc.body.writeTo == 1 && tc.body.reads == 0; vectored != tc.vectored {
				t.Fatalf("WriteTo calls %d, bytes read %d; want vectored=%v", tc.body.writeTo, tc.body.reads, tc.vectored)
			}
			if tc.vectored && lr.N != tc.remaining {
				t.Fatalf("limit left %d, want %d", lr.N, tc.remaining)
			}
		})
	}
}

func TestLegConnPlainReader(t *testing.T) {
	c := &legConn{Conn: &recordConn{}}
	n, err := c.ReadFrom(strings.NewReader("plain"))
	if err != nil || n != 5 || c.Conn.(*recordConn).out.String() != "plain" {
		t.Fatalf("wrote %d, %v", n, err)
	}
}

// TestClientSendsWholeBodiesVectored sends WholeBodies through NewClient's transports to a
// loopback server: each arrives intact, on plain HTTP written without a Read (a body that hands
// its pieces over goes out with the header block in one vectored write; any other with WriteTo),
// with the request id, the caller's fields and the forwarded headers, and the client's own
// header set is left alone.
func TestClientSendsWholeBodiesVectored(t *testing.T) {
	type got struct {
		body string
		h    http.Header
	}
	for _, tc := range []struct {
		name     string
		tls      bool
		handOver bool
	}{{"plain, pieces handed over", false, true}, {"plain, WriteTo", false, false}, {"https (net/http's transport), WriteTo", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			seen := make(chan got, 1)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				seen <- got{string(b), r.Header.Clone()}
				w.WriteHeader(http.StatusOK)
				_, _ = io.WriteString(w, `{"ok":true}`)
			})
			opts := TransportOptions{ResponseHeaderTimeout: 5 * time.Second}
			var srv *httptest.Server
			if tc.tls {
				srv = httptest.NewTLSServer(h)
				opts.CAFile = writeServerCA(t, srv)
			} else {
				srv = httptest.NewServer(h)
			}
			defer srv.Close()
			c, err := NewClient(srv.URL+"/", opts, 0, observe.Telemetry{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			p := newPieces(`{"a":`, strings.Repeat("x", 100<<10), `}`)
			var body io.Reader = p
			ho := &handedOver{pieces: p}
			if tc.handOver {
				body = ho
			}
			size := p.Len()
			base := http.Header{"X-Tenant": {"t1", "t2"}}
			out, err := c.Call(context.Background(), Request{Path: "/v1/x", Phase: "test", Header: base, RequestID: "rid", Body: body, Size: size},
				Field{Name: "X-Role", Value: "prefill"}, Field{Name: "X-Empty", Value: ""})
			if err != nil || string(out) != `{"ok":true}` {
				t.Fatalf("Call = %q, %v", out, err)
			}
			g := <-seen
			if int64(len(g.body)) != size || !strings.HasPrefix(g.body, `{"a":xxx`) || !strings.HasSuffix(g.body, `x}`) {
				t.Fatalf("server read %d bytes", len(g.body))
			}
			switch {
			case tc.tls: // TLS encrypts a copy: no vectored write of the caller's slices
			case p.reads != 0:
				t.Fatalf("%d bytes of the body went through Read", p.reads)
			case tc.handOver && (ho.calls != 1 || p.writeTo != 0 || ho.closed == 0):
				t.Fatalf("pieces handed over %d times, WriteTo %d, closed %d; want one vectored write, then Close", ho.calls, p.writeTo, ho.closed)
			case !tc.handOver && p.writeTo == 0: // a second WriteTo (of nothing) is net/http checking the length
				t.Fatal("the body was not written with WriteTo")
			}
			if g.h.Get(RequestIDHeader) != "rid" || g.h.Get("X-Role") != "prefill" || g.h.Get("Content-Type") != "application/json" ||
				len(g.h.Values("X-Tenant")) != 2 || g.h.Get("Traceparent") != "" {
				t.Fatalf("headers %v", g.h)
			}
			if _, ok := g.h["X-Empty"]; ok {
				t.Fatal("an empty field was sent")
			}
			if len(base) != 1 {
				t.Fatalf("the base header set was modified: %v", base)
			}
		})
	}
}

func TestCallErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, strings.Repeat("e", 20<<10))
	}))
	defer srv.Close()
	c, err := NewClient(srv.URL, TransportOptions{}, 0, observe.Telemetry{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Call(context.Background(), Request{Phase: "render"})
	up := asUpstream(t, err)
	if up.Phase != "render" || up.Status != 503 || len(up.Body) != maxErrorBody {
		t.Fatalf("error %+v (body %d bytes)", up, len(up.Body))
	}
	srv.Close()
	_, err = c.Call(context.Background(), Request{Phase: "render"})
	if up := asUpstream(t, err); up.Status != 0 || up.Err == nil {
		t.Fatalf("transport error %+v", up)
	}
	if _, err := NewClient("gateway:80", TransportOptions{}, 0, observe.Telemetry{}); err == nil {
		t.Fatal("a base URL without a scheme was accepted")
	}
}

func asUpstream(t *testing.T, err error) *apierror.UpstreamError {
	t.Helper()
	var up *apierror.UpstreamError
	if !errors.As(err, &up) {
		t.Fatalf("err = %v, want an *apierror.UpstreamError", err)
	}
	return up
}

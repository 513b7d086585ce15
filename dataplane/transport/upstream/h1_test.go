package upstream

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// connCounter counts the connections an httptest server accepted and closed. Its ConnState hook
// never blocks: httptest runs it under the server's lock, so a blocked hook would hang Close.
type connCounter struct {
	opened, closed atomic.Int32
	awaited        int32         // closes waitClosed has already consumed
	closedCh       chan struct{} // a wake-up after a close (capacity 1; extras are merged)
}

func newCountingServer(t *testing.T, h http.Handler) (*httptest.Server, *connCounter) {
	t.Helper()
	cc := &connCounter{closedCh: make(chan struct{}, 1)}
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			cc.opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			cc.closed.Add(1)
			select {
			case cc.closedCh <- struct{}{}:
			default: // a wake-up is already pending
			}
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, cc
}

// waitClosed waits for n more server-side closes (an event, at most 5 s).
func (cc *connCounter) waitClosed(t *testing.T, n int) {
	t.Helper()
	cc.awaited += int32(n)
	deadline := time.After(5 * time.Second)
	for cc.closed.Load() < cc.awaited {
		select {
		case <-cc.closedCh:
		case <-deadline:
			t.Fatalf("the server saw %d connections closed of %d opened; waited for %d more", cc.closed.Load(), cc.opened.Load(), n)
		}
	}
}

func h1Client(t *testing.T, o TransportOptions) (*http.Client, *h1Transport) {
	t.Helper()
	tr := newH1Transport(o, dialerOf(o).DialContext)
	t.Cleanup(tr.close)
	return &http.Client{Transport: tr}, tr
}

func post(ctx context.Context, t *testing.T, c *http.Client, url, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return c.Do(req)
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	if n, err := resp.Body.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("a read after the end = %d, %v; want 0, EOF (as io.Reader's convention)", n, err)
	}
	return string(b)
}

func echoHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Method", r.Method)
		fmt.Fprintf(w, "%s %s %d %s", r.URL.RequestURI(), r.Header.Get("Content-Length"), len(b), b)
	})
}

// TestH1Reuse: sequential calls share one connection; the answer, path, query and body arrive
// as sent, whatever the framing of the request body.
func TestH1Reuse(t *testing.T) {
	srv, cc := newCountingServer(t, echoHandler())
	c, tr := h1Client(t, TransportOptions{})
	tests := []struct {
		name string
		body io.Reader
		size int64
		want string
	}{
		{"strings reader", strings.NewReader("abc"), 3, "/p?q=1 3 3 abc"},
		{"unknown length: chunked", io.MultiReader(strings.NewReader("ab"), strings.NewReader("cd")), -1, "/p?q=1  4 abcd"},
		{"empty", nil, 0, "/p?q=1 0 0 "},
	}
	for _, tc := range tests {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/p?q=1", tc.body)
		req.ContentLength = tc.size
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := readAll(t, resp); got != tc.want || resp.Header.Get("X-Method") != "POST" {
			t.Fatalf("%s: answer %q, want %q", tc.name, got, tc.want)
		}
	}
	if n := cc.opened.Load(); n != 1 {
		t.Fatalf("%d connections for 3 sequential calls, want 1", n)
	}
	if tr.nIdle != 1 {
		t.Fatalf("%d idle connections, want 1", tr.nIdle)
	}
}

// TestH1StaleIdle: a connection the upstream closed while it was idle is not written to: the
// next call dials a new one and succeeds.
func TestH1StaleIdle(t *testing.T) {
	srv, cc := newCountingServer(t, echoHandler())
	c, _ := h1Client(t, TransportOptions{})
	resp, err := post(context.Background(), t, c, srv.URL+"/a", "x")
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	srv.CloseClientConnections() // the upstream's keep-alive timeout
	cc.waitClosed(t, 1)
	resp, err = post(context.Background(), t, c, srv.URL+"/b", "y")
	if err != nil {
		t.Fatalf("call after the upstream closed the idle connection: %v", err)
	}
	if got := readAll(t, resp); got != "/b 1 1 y" {
		t.Fatalf("answer %q", got)
	}
	if n := cc.opened.Load(); n != 2 {
		t.Fatalf("%d connections opened, want 2", n)
	}
}

// TestH1IdleLimits: idle connections past IdleConnTimeout are closed by the transport, and at
// most MaxIdleConnsPerHost are kept.
func TestH1IdleLimits(t *testing.T) {
	release := make(chan struct{})
	var arrived sync.WaitGroup
	srv, cc := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			arrived.Done()
			<-release
		}
		_, _ = io.WriteString(w, "ok")
	}))
	c, tr := h1Client(t, TransportOptions{MaxIdleConnsPerHost: 2, IdleConnTimeout: 100 * time.Millisecond})
	var wg sync.WaitGroup
	arrived.Add(3)
	for range 3 { // three calls at once: three connections
		wg.Go(func() {
			resp, err := post(context.Background(), t, c, srv.URL+"/hold", "")
			if err == nil {
				readAll(t, resp)
			}
		})
	}
	arrived.Wait()
	close(release)
	wg.Wait()
	cc.waitClosed(t, 1) // the third is over the idle limit
	tr.mu.Lock()
	idle := tr.nIdle
	tr.mu.Unlock()
	if cc.opened.Load() != 3 || idle != 2 {
		t.Fatalf("opened %d, idle %d; want 3 and 2", cc.opened.Load(), idle)
	}
	cc.waitClosed(t, 2) // the idle timeout closes the other two
	tr.mu.Lock()
	idle = tr.nIdle
	tr.mu.Unlock()
	if idle != 0 {
		t.Fatalf("%d idle connections after the idle timeout", idle)
	}
}

// TestH1NotReused: a connection is closed, not pooled, when the answer says Connection: close,
// when the body is closed before its end (a stream the caller abandons), and when the call was
// cancelled.
func TestH1NotReused(t *testing.T) {
	srv, cc := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/close":
			w.Header().Set("Connection", "close")
			_, _ = io.WriteString(w, "bye")
		case "/stream":
			for i := range 1000 {
				fmt.Fprintf(w, "data: %d\n\n", i)
				w.(http.Flusher).Flush()
			}
		}
	}))
	c, tr := h1Client(t, TransportOptions{})

	resp, err := post(context.Background(), t, c, srv.URL+"/close", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); got != "bye" {
		t.Fatalf("answer %q", got)
	}
	cc.waitClosed(t, 1)

	resp, err = post(context.Background(), t, c, srv.URL+"/stream", "")
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "data: 0\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	resp.Body.Close() // abandoned mid-stream: no drain of the other 999 events
	if _, err := resp.Body.Read(make([]byte, 1)); err == nil {
		t.Fatal("read after Close succeeded")
	}
	cc.waitClosed(t, 1)
	if tr.nIdle != 0 {
		t.Fatalf("%d idle connections, want 0", tr.nIdle)
	}
}

// TestH1Cancel: cancelling a call fails it promptly with the context's error, whether it waits
// for the headers or reads the body, and the connection is not reused.
func TestH1Cancel(t *testing.T) {
	headersSent, arrived := make(chan struct{}), make(chan struct{}, 1)
	srv, cc := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		if r.URL.Path == "/body" {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			close(headersSent)
		}
		<-r.Context().Done() // hangs until the client goes
	}))
	c, _ := h1Client(t, TransportOptions{})

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := post(ctx, t, c, srv.URL+"/headers", "")
		done <- err
	}()
	<-arrived
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("waiting for headers: err %v, want context.Canceled", err)
	}
	cc.waitClosed(t, 1)

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	resp, err := post(ctx, t, c, srv.URL+"/body", "")
	if err != nil {
		t.Fatal(err)
	}
	<-arrived
	<-headersSent
	go cancel()
	if _, err := io.ReadAll(resp.Body); !errors.Is(err, context.Canceled) {
		t.Fatalf("reading the body: err %v, want context.Canceled", err)
	}
	cc.waitClosed(t, 1)
}

// TestH1HeaderTimeout: an upstream that sends no headers in time fails the call with a timeout.
func TestH1HeaderTimeout(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	srv, _ := newCountingServer(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	c, _ := h1Client(t, TransportOptions{ResponseHeaderTimeout: 50 * time.Millisecond})
	_, err := post(context.Background(), t, c, srv.URL, "")
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !strings.Contains(err.Error(), "awaiting response headers") {
		t.Fatalf("err %v, want a header timeout", err)
	}
}

// rawServer runs handle on every connection to a loopback listener.
func rawServer(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// TestH1Peers: what peers that are not net/http servers do: interim 1xx answers before the
// answer, an answer sent before the body was read (and the connection closed), a reset, a peer
// that closes before answering, and one that sends unasked bytes while idle.
func TestH1Peers(t *testing.T) {
	readHead := func(c net.Conn) *bufio.Reader {
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil || line == "\r\n" {
				return br
			}
		}
	}
	tests := []struct {
		name   string
		handle func(net.Conn)
		body   string
		want   string // the answer's body, or "error: <substring>"
	}{
		{"100 Continue and 103 Early Hints first", func(c net.Conn) {
			readHead(c)
			_, _ = io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}, "", "ok"},
		{"413 before the body, then close (a reset, as the body is left unread)", func(c net.Conn) {
			readHead(c)
			_, _ = io.WriteString(c, "HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbig")
		}, strings.Repeat("x", 8<<20), "big"},
		{"reset before answering", func(c net.Conn) {
			readHead(c)
			_ = c.(*net.TCPConn).SetLinger(0)
		}, "", "error: connection reset"},
		{"closed before answering", func(c net.Conn) { readHead(c) }, "", "error: unexpected EOF"},
		{"headers that never end", func(c net.Conn) {
			readHead(c)
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\n")
			line := "X-Filler: " + strings.Repeat("a", 1000) + "\r\n"
			for i := 0; i < 4<<10; i++ { // 4 MiB, until the client hangs up
				if _, err := io.WriteString(c, line); err != nil {
					return
				}
			}
		}, "", "error: headers exceed"},
		{"garbage instead of an answer", func(c net.Conn) {
			readHead(c)
			_, _ = io.WriteString(c, "SSH-2.0-OpenSSH\r\n\r\n")
		}, "", "error: malformed HTTP"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			url := rawServer(t, tc.handle)
			c, _ := h1Client(t, TransportOptions{})
			resp, err := post(context.Background(), t, c, url, tc.body)
			if want, ok := strings.CutPrefix(tc.want, "error: "); ok {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("err %v, want one saying %q", err, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := readAll(t, resp); got != tc.want {
				t.Fatalf("answer %q, want %q", got, tc.want)
			}
		})
	}
}

// TestH1UnaskedBytesWhileIdle: a connection on which the upstream sent something while it was
// idle (a parting 408) is dropped, not read as the next call's answer.
func TestH1UnaskedBytesWhileIdle(t *testing.T) {
	var conns atomic.Int32
	parted := make(chan struct{})
	url := rawServer(t, func(c net.Conn) {
		n := conns.Add(1)
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n%d", n)
			if n == 1 {
				_, _ = io.WriteString(c, "HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
				close(parted) // on loopback the bytes are in the client's socket once written
			}
		}
	})
	c, _ := h1Client(t, TransportOptions{})
	for want := range []string{"1", "2"} {
		resp, err := post(context.Background(), t, c, url, "")
		if err != nil {
			t.Fatal(err)
		}
		got := readAll(t, resp)
		if want == 0 && got != "1" || want == 1 && got != "2" {
			t.Fatalf("call %d answered by connection %q", want+1, got)
		}
		if want == 0 {
			<-parted
		}
	}
}

// TestH1RefusesBadHeaders: a header value with a line break (header injection) or an invalid
// name fails the call before anything is sent.
func TestH1RefusesBadHeaders(t *testing.T) {
	srv, cc := newCountingServer(t, echoHandler())
	c, _ := h1Client(t, TransportOptions{})
	for _, h := range []http.Header{{"X-A": {"v\r\nX-Injected: 1"}}, {"Bad Name": {"v"}}, {"X-A": {"nul\x00"}}} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("b"))
		req.Header = h
		if _, err := c.Do(req); err == nil || !strings.Contains(err.Error(), "invalid header field") {
			t.Fatalf("header %q: err %v", h, err)
		}
	}
	if n := cc.opened.Load(); n != 0 {
		t.Fatalf("%d connections opened for refused calls", n)
	}
}

// TestH1Closed: a closed transport refuses new calls; a call under way finishes and its
// connection is then closed, not pooled.
func TestH1Closed(t *testing.T) {
	release, arrived := make(chan struct{}), make(chan struct{})
	srv, cc := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(arrived)
		<-release
		_, _ = io.WriteString(w, "late")
	}))
	c, tr := h1Client(t, TransportOptions{})
	done := make(chan string, 1)
	go func() {
		resp, err := post(context.Background(), t, c, srv.URL, "")
		if err != nil {
			done <- err.Error()
			return
		}
		done <- readAll(t, resp)
	}()
	<-arrived
	tr.close()
	if _, err := post(context.Background(), t, c, srv.URL, ""); !errors.Is(err, errH1Closed) {
		t.Fatalf("call on a closed transport: %v", err)
	}
	close(release)
	if got := <-done; got != "late" {
		t.Fatalf("the call under way got %q", got)
	}
	cc.waitClosed(t, 1)
}

// TestH1Concurrent: many calls at once, each answer its own.
func TestH1Concurrent(t *testing.T) {
	srv, _ := newCountingServer(t, echoHandler())
	c, _ := h1Client(t, TransportOptions{MaxIdleConnsPerHost: 4})
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			for j := range 10 {
				body := fmt.Sprintf("%d-%d", i, j)
				resp, err := post(context.Background(), t, c, srv.URL+"/c", body)
				if err != nil {
					t.Error(err)
					return
				}
				if got, want := readAll(t, resp), fmt.Sprintf("/c %d %d %s", len(body), len(body), body); got != want {
					t.Errorf("answer %q, want %q", got, want)
				}
			}
		})
	}
	wg.Wait()
}

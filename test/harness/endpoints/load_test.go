package endpoints

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestLoadRetriesOnlyAStaleConnection runs a Load against a server that mishandles the second
// request of its first connection in one way each, and every request after that serves: only
// a kept-alive connection closed with no byte of answer is sent again (and counted as retried);
// a fresh connection closed unanswered and an answer cut short are failures.
func TestLoadRetriesOnlyAStaleConnection(t *testing.T) {
	tests := map[string]struct {
		// second mishandles the first connection's second request, read whole, before the
		// connection closes (its first request is answered).
		second      func(c net.Conn)
		firstFresh  bool // the first request is mishandled instead (on a new connection)
		wantRetried int
		wantFailed  int
	}{
		"kept-alive connection closed unanswered": {second: func(c net.Conn) {}, wantRetried: 1},
		"kept-alive connection reset unanswered": {
			second: func(c net.Conn) { _ = c.(*net.TCPConn).SetLinger(0) }, wantRetried: 1,
		},
		"new connection closed unanswered": {second: func(c net.Conn) {}, firstFresh: true, wantFailed: 1},
		"answer cut after its headers": {
			second: func(c net.Conn) {
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
			},
			wantFailed: 1,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			var conns atomic.Int32
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					first := conns.Add(1) == 1
					go serveConn(c, func(n int) bool {
						if !first || n != map[bool]int{true: 1, false: 2}[tc.firstFresh] {
							return false
						}
						tc.second(c)
						return true
					})
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			load := StartLoad("http://"+l.Addr().String(), 1, Chat("m", 1))
			err = load.WaitFor(ctx, func(r Result) bool { return r.Served >= 3 })
			res := load.Stop()
			if err != nil {
				t.Fatal(err)
			}
			if res.Retried != tc.wantRetried || res.Failed != tc.wantFailed {
				t.Fatalf("retried %d (%v), failed %d (%v); want retried %d, failed %d",
					res.Retried, res.Retries, res.Failed, res.Failures, tc.wantRetried, tc.wantFailed)
			}
			if tc.wantRetried > 0 && !strings.Contains(res.Retries[0], ErrStaleConnection.Error()) {
				t.Fatalf("retry reason %q does not name a stale connection", res.Retries[0])
			}
		})
	}
}

// serveConn answers the requests of c with a chat completion, keeping the connection alive,
// until mishandle (given the request's number on c, from 1, after reading it whole) takes one
// over: then it closes c.
func serveConn(c net.Conn, mishandle func(n int) bool) {
	defer c.Close()
	r := bufio.NewReader(c)
	for n := 1; ; n++ {
		req, err := http.ReadRequest(r)
		if err != nil {
			return
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return
		}
		if mishandle(n) {
			return
		}
		body := `{"id":"x","object":"chat.completion","choices":[]}`
		if _, err := io.WriteString(c, fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)); err != nil {
			return
		}
	}
}

package simworker

import (
	"net"
	"net/http"
)

// resetConn cuts the connection of a request with a TCP reset, as a killed process's peer sees
// it; what was flushed before stays delivered. When the connection cannot be taken over (not
// HTTP/1), the handler aborts instead.
func resetConn(rw http.ResponseWriter) {
	conn, _, err := http.NewResponseController(rw).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

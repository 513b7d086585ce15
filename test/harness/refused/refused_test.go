package refused

import (
	"errors"
	"net"
	"syscall"
	"testing"
)

// TestAddr: a connection to the address is refused, and a listener cannot take its port while
// the test runs.
func TestAddr(t *testing.T) {
	addr := Addr(t)
	for range 3 {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			t.Fatalf("dialing %s connected, want refused", addr)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dialing %s: %v, want connection refused", addr, err)
		}
	}
	if l, err := net.Listen("tcp", addr); err == nil {
		l.Close()
		t.Fatalf("a listener took %s while it is held", addr)
	}
	if a, b := Addr(t), Addr(t); a == b || a == addr {
		t.Fatalf("two held addresses are the same: %s, %s, %s", addr, a, b)
	}
}

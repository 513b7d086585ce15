// Package refused makes loopback addresses that refuse connections for a test's whole life:
// the dead worker, the unreachable Redis, the picker that is gone.
package refused

import (
	"net"
	"strconv"
	"syscall"
	"testing"
)

// Addr returns a loopback host:port whose connections are refused until tb ends. Its port is
// held by a socket bound but not listening: a connection finds no listener (refused), and no
// listener, the test's own servers included, can take the port meanwhile. An address that was
// merely free a moment ago can be handed to the next listener: extprocgw's TestGateway once got
// its own gateway's port as the "dead" pick and forwarded to itself until the process ran out
// of files.
func Addr(tb testing.TB) string {
	tb.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		tb.Fatal(err)
	}
	syscall.CloseOnExec(fd)
	tb.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		tb.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}

//go:build unix

package upstream

import (
	"errors"
	"net"
	"syscall"
)

// alive reports whether an idle connection may carry a call: the peer has not closed it, reset
// it or sent anything unasked (a server's parting 408, say). It peeks without blocking.
func alive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var (
		buf  [1]byte
		rerr error
	)
	if err := raw.Read(func(fd uintptr) bool {
		_, _, rerr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true // never wait: an idle connection has nothing to read
	}); err != nil {
		return false
	}
	// Anything but "nothing to read" is the end: a byte read (something unasked) or none with
	// no error (the peer closed), or an error (reset).
	return errors.Is(rerr, syscall.EAGAIN) || errors.Is(rerr, syscall.EWOULDBLOCK)
}

package upstream

import (
	"context"
	"io"
	"net"
)

// WholeBody is a request body that knows its remaining length and can write itself out at once.
// The connections of NewTransport write such a body with one vectored write (writev) of
// the pieces it is made of — the large values of the client's body included — instead of
// net/http's default of copying it through a 32 KiB buffer. It must also be an io.Closer, or
// net/http wraps it and the connection never sees it.
type WholeBody interface {
	io.WriterTo
	// Len is the number of bytes left to write.
	Len() int64
}

// dialer returns a DialContext whose connections write WholeBody request bodies directly.
func dialer(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &legConn{Conn: c}, nil
	}
}

// legConn is an outbound client connection. net/http's transport sends a request body of
// known length as io.Copy(conn, io.LimitReader(body, ContentLength)), which lands in ReadFrom.
type legConn struct {
	net.Conn
}

// ReadFrom writes a WholeBody that fits the limit in one go, and anything else as usual.
func (c *legConn) ReadFrom(r io.Reader) (int64, error) {
	if lr, ok := r.(*io.LimitedReader); ok {
		if b, ok := lr.R.(WholeBody); ok && b.Len() <= lr.N {
			n, err := b.WriteTo(c.Conn)
			lr.N -= n
			return n, err
		}
	}
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

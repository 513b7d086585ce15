// Package bodybuf owns the bytes of a request body: read once into a size-classed pooled buffer,
// shared by the parsed body and every outbound leg body made from it, and returned to the pool
// when the last of them lets go. A leg body releases its reference when it has been read or
// written to its end, or closed, whichever comes first, so a transport still sending a leg after
// its answer arrived keeps the bytes alive.
package bodybuf

import (
	"errors"
	"io"
	"math/bits"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
)

// ErrReleased reports a leg body opened after the buffer went back to the pool (a bug).
var ErrReleased = errors.New("bodybuf: request body already released")

// Buffer is a request body's bytes with a reference count. Read hands out one reference, the
// request's own; every Body opened on it holds one more.
type Buffer struct {
	pooled *[]byte // nil when the bytes did not come from the pool
	data   []byte
	refs   atomic.Int32
}

// Of wraps bytes that do not come from the pool (tests, bodies of unknown length).
func Of(data []byte) *Buffer {
	b := &Buffer{data: data}
	b.refs.Store(1)
	return b
}

// Read reads r's whole body, refusing more than limit bytes (a declared length over the limit is
// refused before anything is read). Errors are client-facing (*apierror.Error: 413, 400).
func Read(r *http.Request, limit int64) (*Buffer, error) {
	if r.ContentLength > limit {
		return nil, apierror.TooLarge(limit)
	}
	if r.ContentLength < 0 {
		raw, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
		if err != nil {
			return nil, apierror.BadRequest("unreadable_body", "failed to read request body")
		}
		if int64(len(raw)) > limit {
			return nil, apierror.TooLarge(limit)
		}
		return Of(raw), nil
	}
	p := pool.get(int(r.ContentLength))
	b := &Buffer{pooled: p, data: (*p)[:r.ContentLength]}
	b.refs.Store(1)
	if _, err := io.ReadFull(r.Body, b.data); err != nil {
		b.Release()
		return nil, apierror.BadRequest("unreadable_body", "failed to read request body")
	}
	// Read to EOF: only then does net/http watch the connection, so that a client that goes away
	// cancels the request context (and every upstream leg with it).
	var probe [1]byte
	_, _ = r.Body.Read(probe[:])
	return b, nil
}

// Bytes are the body's bytes, valid until the last reference is released.
func (b *Buffer) Bytes() []byte { return b.data }

// Release drops one reference; the last one returns the bytes to the pool.
func (b *Buffer) Release() {
	if b.refs.Add(-1) == 0 && b.pooled != nil {
		pool.put(b.pooled)
	}
}

// retain takes a reference unless the buffer was already released.
func (b *Buffer) retain() bool {
	for {
		n := b.refs.Load()
		if n <= 0 {
			return false
		}
		if b.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Open returns a body reading pieces (slices of the buffer and of other memory, as
// body.Object.Buffers returns them), holding a reference until it is done. Opened after the last
// reference was released, the body fails with ErrReleased.
func (b *Buffer) Open(pieces net.Buffers) *Body {
	if !b.retain() {
		return &Body{done: true, err: ErrReleased}
	}
	return &Body{bufs: append(net.Buffers(nil), pieces...), buf: b}
}

// Body is an outbound request body over a Buffer. It implements upstream.WholeBody, so the leg
// goes out in one vectored write, and is a ReadCloser so that net/http does not wrap it.
type Body struct {
	bufs net.Buffers
	buf  *Buffer
	done bool
	err  error
}

func (d *Body) finish() {
	if !d.done {
		d.done = true
		d.buf.Release()
	}
}

// Read reads the next bytes; at EOF the reference is released.
func (d *Body) Read(p []byte) (int, error) {
	if d.err != nil {
		return 0, d.err
	}
	n, err := d.bufs.Read(p)
	if errors.Is(err, io.EOF) {
		d.finish()
	}
	return n, err
}

// WriteTo writes the remaining pieces to w (a writev on a TCP connection) and then releases the
// reference.
func (d *Body) WriteTo(w io.Writer) (int64, error) {
	if d.err != nil {
		return 0, d.err
	}
	n, err := d.bufs.WriteTo(w)
	if err == nil {
		d.finish()
	}
	return n, err
}

// Pieces are the slices left to write, for a transport that writes them with its own header
// block in one vectored write; it then Closes the body.
func (d *Body) Pieces() net.Buffers { return d.bufs }

// Len is the number of bytes left.
func (d *Body) Len() int64 {
	var n int64
	for _, b := range d.bufs {
		n += int64(len(b))
	}
	return n
}

// Close releases the reference if the body was not read to its end.
func (d *Body) Close() error {
	d.finish()
	return nil
}

// pool recycles buffers by power-of-two size class (512 B to 64 MiB), so a stream of megabyte
// requests does not allocate and zero a megabyte each, and a small request held by a long stream
// (its body is kept to resume it) holds little.
var pool sizedPool

type sizedPool struct{ classes [18]sync.Pool }

const minClass = 9 // 512 B

func classOf(n int) int {
	c := bits.Len(uint(max(n, 1) - 1))
	return max(c, minClass) - minClass
}

func (p *sizedPool) get(n int) *[]byte {
	c := classOf(n)
	if c >= len(p.classes) {
		b := make([]byte, n)
		return &b
	}
	if b, ok := p.classes[c].Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 1<<(c+minClass))
	return &b
}

func (p *sizedPool) put(b *[]byte) {
	c := classOf(cap(*b))
	if c < len(p.classes) && cap(*b) == 1<<(c+minClass) {
		*b = (*b)[:cap(*b)]
		p.classes[c].Put(b)
	}
}

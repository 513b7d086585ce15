package bodybuf

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
)

func TestRead(t *testing.T) {
	tests := map[string]struct {
		body   string
		length int64 // -1: unknown (chunked)
		limit  int64
		status int // 0: read
		pooled bool
	}{
		"declared length":            {body: `{"a":1}`, length: 7, limit: 100, pooled: true},
		"declared length over limit": {body: `{"a":1}`, length: 7, limit: 6, status: http.StatusRequestEntityTooLarge},
		"unknown length":             {body: `{"a":1}`, length: -1, limit: 100},
		"unknown length over limit":  {body: `{"a":1}`, length: -1, limit: 6, status: http.StatusRequestEntityTooLarge},
		"exactly the limit":          {body: `{"a":1}`, length: -1, limit: 7},
		"shorter than declared":      {body: `{"a"`, length: 7, limit: 100, status: http.StatusBadRequest},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tc.body))
			r.ContentLength = tc.length
			b, err := Read(r, tc.limit)
			if tc.status != 0 {
				var e *apierror.Error
				if !errors.As(err, &e) || e.Status != tc.status {
					t.Fatalf("err = %v, want status %d", err, tc.status)
				}
				return
			}
			if err != nil || string(b.Bytes()) != tc.body || (b.pooled != nil) != tc.pooled {
				t.Fatalf("Read = %q (pooled %v), %v", b.Bytes(), b.pooled != nil, err)
			}
			b.Release()
		})
	}
}

// pooledBuffer is a pooled buffer holding s, with the request's reference.
func pooledBuffer(s string) *Buffer {
	p := pool.get(len(s))
	b := &Buffer{pooled: p, data: (*p)[:len(s)]}
	copy(b.data, s)
	b.refs.Store(1)
	return b
}

func TestLegBodiesHoldTheBuffer(t *testing.T) {
	finish := map[string]func(t *testing.T, d *Body){
		"read to EOF": func(t *testing.T, d *Body) {
			if got, err := io.ReadAll(d); err != nil || string(got) != "head-tail" {
				t.Fatalf("read %q, %v", got, err)
			}
		},
		"written out": func(t *testing.T, d *Body) {
			var w bytes.Buffer
			if n, err := d.WriteTo(&w); err != nil || n != 9 || w.String() != "head-tail" {
				t.Fatalf("wrote %q (%d), %v", w.String(), n, err)
			}
		},
		"closed unread": func(t *testing.T, d *Body) { _ = d.Close() },
	}
	for name, done := range finish {
		t.Run(name, func(t *testing.T) {
			b := pooledBuffer("head")
			first := b.Open(net.Buffers{b.Bytes(), []byte("-tail")})
			second := b.Open(net.Buffers{b.Bytes(), []byte("-tail")})
			if first.Len() != 9 || b.refs.Load() != 3 {
				t.Fatalf("len %d, refs %d", first.Len(), b.refs.Load())
			}
			b.Release() // the request is done; the legs are still being sent
			done(t, first)
			if b.refs.Load() != 1 {
				t.Fatalf("refs %d after one leg finished, want 1", b.refs.Load())
			}
			_ = first.Close() // finishing twice releases once
			if b.refs.Load() != 1 {
				t.Fatalf("refs %d after a second close", b.refs.Load())
			}
			done(t, second)
			if b.refs.Load() != 0 {
				t.Fatalf("refs %d after every holder let go, want 0", b.refs.Load())
			}
		})
	}
}

func TestOpenAfterReleaseFails(t *testing.T) {
	b := pooledBuffer("x")
	b.Release()
	d := b.Open(net.Buffers{[]byte("x")})
	if _, err := d.Read(make([]byte, 1)); !errors.Is(err, ErrReleased) {
		t.Fatalf("Read err = %v, want ErrReleased", err)
	}
	if _, err := d.WriteTo(io.Discard); !errors.Is(err, ErrReleased) {
		t.Fatalf("WriteTo err = %v, want ErrReleased", err)
	}
	_ = d.Close()
	if b.refs.Load() != 0 {
		t.Fatalf("refs %d", b.refs.Load())
	}
}

func TestPoolSizeClasses(t *testing.T) {
	for n, want := range map[int]int{0: 512, 1: 512, 200: 512, 512: 512, 513: 1 << 10, 4 << 10: 4 << 10, 4<<10 + 1: 8 << 10, 1 << 20: 1 << 20, 64 << 20: 64 << 20} {
		if got := cap(*pool.get(n)); got != want {
			t.Errorf("get(%d) has capacity %d, want %d", n, got, want)
		}
	}
}

package conn

import (
	"strings"
	"testing"
)

// TestFramer feeds the bytes of a connection, in one piece and byte by byte, and checks how each
// request is served: "ok", "close" (the framer lost track: served, then the connection closes)
// or "refuse" (ambiguous framing, or what follows a chunked body whose framing broke).
func TestFramer(t *testing.T) {
	const get = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
	tests := map[string]struct {
		stream string
		want   []string
	}{
		"pipelined requests without bodies": {stream: get + get + get, want: []string{"ok", "ok", "ok", "ok"}},
		"Content-Length body, then a request": {
			stream: "POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 27\r\n\r\n" + get[:27] + get,
			want:   []string{"ok", "ok", "ok"},
		},
		"chunked body with extensions and trailers, then a request": {
			stream: "POST /v1/x HTTP/1.1\r\nHost: x\r\ntransfer-encoding: Chunked\r\n\r\n5;ext=1\r\nhello\r\n1A\r\n" + strings.Repeat("G", 26) +
				"\r\n0\r\nX-Trailer: 1\r\n\r\n" + get,
			want: []string{"ok", "ok", "ok"},
		},
		"bare LF ends head lines": {stream: "GET / HTTP/1.1\nHost: x\n\n" + get, want: []string{"ok", "ok", "ok"}},
		"Content-Length and Transfer-Encoding": {
			stream: "POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + get,
			want:   []string{"refuse", "refuse"},
		},
		"the ambiguous request behind a good one": {
			stream: get + "POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\ncontent-length: 4\r\n\r\n0\r\n\r\n" + get,
			want:   []string{"ok", "refuse", "refuse"},
		},
		"a folded Transfer-Encoding still counts": {
			stream: "POST /v1/x HTTP/1.1\r\nTransfer-Encoding:\r\n chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n" + get,
			want:   []string{"refuse", "refuse"},
		},
		"Transfer-Encoding on HTTP/1.0": {
			stream: "POST /v1/x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + get,
			want:   []string{"refuse", "refuse"},
		},
		"OPTIONS * is not handed to the handler": {
			stream: "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n" + get + "POST /v1/x HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
			want:   []string{"ok", "refuse"},
		},
		"a chunk line ending in a bare LF refuses what follows": {
			stream: "POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n" + get,
			want:   []string{"ok", "refuse", "refuse"},
		},
		"chunk data not followed by CRLF refuses what follows": {
			stream: "POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhello\r\n0\r\n\r\n" + get,
			want:   []string{"ok", "refuse"},
		},
		"chunk data followed by a bare LF refuses what follows": {
			stream: "POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\n0\r\n\r\n" + get,
			want:   []string{"ok", "refuse"},
		},
		"an invalid chunk size refuses what follows": {
			stream: "POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n" + get,
			want:   []string{"ok", "refuse"},
		},
		"a trailer line ending in a bare LF refuses what follows": {
			stream: "POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Trailer: 1\n\r\n" + get,
			want:   []string{"ok", "refuse", "refuse"},
		},
		"the blank line after the last chunk as a bare LF refuses what follows": {
			stream: "POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\n" + get,
			want:   []string{"ok", "refuse"},
		},
		"differing Content-Lengths (net/http refuses them)": {
			stream: "POST /v1/x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx" + get,
			want:   []string{"close", "close"},
		},
		"equal Content-Lengths are one": {
			stream: "POST /v1/x HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nxx" + get,
			want:   []string{"ok", "ok"},
		},
		"an unsupported transfer coding (net/http answers 501)": {
			stream: "POST /v1/x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + get,
			want:   []string{"close", "close"},
		},
		"a head line without a colon": {stream: "GET / HTTP/1.1\r\nnonsense\r\n\r\n" + get, want: []string{"close", "close"}},
		"a long request line keeps its version": {
			stream: "POST /v1/" + strings.Repeat("a", 1000) + " HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
			want:   []string{"refuse"},
		},
		"a long header value is not a framing value": {
			stream: "POST /v1/x HTTP/1.1\r\nX-Long: " + strings.Repeat("v", 2000) + "\r\nContent-Length: 3\r\n\r\nabc" + get,
			want:   []string{"ok", "ok", "ok"},
		},
	}
	for name, tc := range tests {
		for _, split := range []bool{false, true} {
			t.Run(name, func(t *testing.T) {
				f := newFramer(MaxHeaderBytes)
				if split {
					for i := range len(tc.stream) {
						f.feed([]byte{tc.stream[i]})
					}
				} else {
					f.feed([]byte(tc.stream))
				}
				for i, want := range tc.want {
					refusal, closeAfter := f.verdict(i)
					got := "ok"
					switch {
					case refusal != "":
						got = "refuse"
					case closeAfter:
						got = "close"
					}
					if got != want {
						t.Fatalf("request %d (split %v): %s, want %s", i, split, got, want)
					}
				}
			})
		}
	}
}

func TestFramerHeadLimit(t *testing.T) {
	f := newFramer(1024)
	f.feed([]byte("GET / HTTP/1.1\r\nX-Big: " + strings.Repeat("a", 8000)))
	if _, closeAfter := f.verdict(0); !closeAfter {
		t.Fatal("a head over the limit must lose track (net/http answers 431 and closes)")
	}
}

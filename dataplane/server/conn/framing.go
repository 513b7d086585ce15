package conn

import (
	"bytes"
	"strconv"
	"strings"
)

// framer follows the HTTP/1.x message framing of the bytes a client sends on one connection, as
// net/http reads them, to see what net/http hides from handlers: a request head with both
// Content-Length and Transfer-Encoding (net/http drops the Content-Length and serves the chunked
// body, then keeps the connection open, so whatever an intermediary that trusted the
// Content-Length took for body is served as the next request), and Transfer-Encoding on an
// HTTP/1.0 request. RFC 9112 section 6.1 says the server must close the connection after
// responding to either.
//
// Requests are counted as net/http hands them to the handler (OPTIONS * is answered by
// net/http itself). Where the framer cannot follow a connection (malformed framing that
// net/http may read differently), it stops, and every later request on the connection is
// served with Connection: close: nothing can be smuggled behind it. Where that framing is a
// chunked body's (a chunk or trailer line ending in a bare LF, a bad chunk size, chunk data not
// followed by CRLF), the requests after it are refused instead: net/http accepts some of these
// (a bare LF ends a trailer line for it), an intermediary may not, and what it took for body
// must never reach a worker.
type framer struct {
	state framerState
	// line is the start of the line being read, lineLen its whole length so far, tail its
	// last bytes (a long request line ends with the version).
	line    []byte
	lineLen int
	tail    []byte
	// n counts what is left of a Content-Length body or a chunk.
	n int64
	// headBytes bounds a head the way net/http does (MaxHeaderBytes plus its slack).
	headBytes, maxHead int
	// requests counts the heads handed to the handler; ambiguous and lost are the index of the
	// first request refused and of the first one the framer could not follow (-1: none), why
	// the reason of the refusal.
	requests, ambiguous, lost int
	why                       string
	// The head being read.
	requestLine    bool
	http10, optAll bool
	cl, te         []string
	lastTE         bool
}

type framerState uint8

const (
	stHead framerState = iota
	stBody
	stChunkSize
	stChunkData
	stChunkCR
	stChunkLF
	stTrailer
	stDone // nothing more to learn on this connection (ambiguous or lost)
)

const (
	// keptLine is how much of a line the framer looks at: header names and the framing values
	// are short; longer values are not framing values net/http accepts.
	keptLine = 256
	keptTail = 16
	// maxChunkLine is net/http's bound on a chunk-size line.
	maxChunkLine = 4096
)

func newFramer(maxHeaderBytes int) *framer {
	return &framer{ambiguous: -1, lost: -1, requestLine: true, maxHead: maxHeaderBytes + 4096 + keptLine}
}

// Why the framer refuses a request (the message of its 400).
const (
	whyAmbiguous    = "the request has Transfer-Encoding together with Content-Length, or on HTTP/1.0 (RFC 9112 section 6.1)"
	whyBrokenChunks = "the request follows a chunked body whose framing is malformed (a line not ending in CRLF, or a bad chunk): nothing after it on the connection is served (RFC 9112 section 7.1)"
)

// verdict says how the request with index i must be served: refused (refusal says why), served
// and the connection closed (the framer lost track), or normally.
func (f *framer) verdict(i int) (refusal string, closeAfter bool) {
	switch {
	case f.ambiguous >= 0 && i >= f.ambiguous:
		return f.why, true
	case f.lost >= 0 && i >= f.lost:
		return "", true
	}
	return "", false
}

// feed follows the bytes read from the connection.
func (f *framer) feed(p []byte) {
	for len(p) > 0 && f.state != stDone {
		switch f.state {
		case stHead, stChunkSize, stTrailer:
			i := bytes.IndexByte(p, '\n')
			chunk := p
			if i >= 0 {
				chunk, p = p[:i+1], p[i+1:]
			} else {
				p = nil
			}
			f.addToLine(chunk)
			if f.state == stHead {
				if f.headBytes += len(chunk); f.headBytes > f.maxHead {
					f.loseTrack() // net/http answers 431 and closes
					return
				}
			} else if f.lineLen > maxChunkLine {
				f.loseTrack()
				return
			}
			if i >= 0 {
				f.endLine()
			}
		case stBody, stChunkData:
			k := min(int64(len(p)), f.n)
			f.n -= k
			p = p[k:]
			if f.n == 0 {
				if f.state == stBody {
					f.nextHead()
				} else {
					f.state = stChunkCR
				}
			}
		case stChunkCR, stChunkLF:
			want := byte('\r')
			if f.state == stChunkLF {
				want = '\n'
			}
			if p[0] != want {
				f.loseTrack()
				return
			}
			p = p[1:]
			if f.state == stChunkCR {
				f.state = stChunkLF
			} else {
				f.state = stChunkSize
			}
		}
	}
}

func (f *framer) addToLine(b []byte) {
	if room := keptLine - len(f.line); room > 0 {
		f.line = append(f.line, b[:min(room, len(b))]...)
	}
	f.lineLen += len(b)
	f.tail = append(f.tail, b...)
	if len(f.tail) > keptTail {
		f.tail = append(f.tail[:0], f.tail[len(f.tail)-keptTail:]...)
	}
}

// endLine handles a complete line (ending in \n) of the head, a chunk-size line or a trailer.
func (f *framer) endLine() {
	line, full, crlf := f.line, f.lineLen <= keptLine, f.lineLen >= 2 && bytes.HasSuffix(f.tail, []byte("\r\n"))
	line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
	tail := string(bytes.TrimRight(f.tail, "\r\n"))
	f.line, f.lineLen, f.tail = f.line[:0], 0, f.tail[:0]
	switch f.state {
	case stChunkSize:
		f.chunkSize(line, full, crlf)
	case stTrailer:
		if !crlf {
			f.loseTrack() // net/http wants CRLF after a chunked body's trailers
			return
		}
		if len(line) == 0 {
			f.nextHead()
		}
	default:
		f.headLine(line, full, tail)
	}
}

func (f *framer) headLine(line []byte, full bool, tail string) {
	switch {
	case f.requestLine:
		f.requestLine = false
		method, rest, ok := strings.Cut(string(line), " ")
		if !ok || method == "" {
			f.loseTrack() // net/http answers 400 and closes
			return
		}
		f.http10 = strings.HasSuffix(tail, " HTTP/1.0")
		f.optAll = method == "OPTIONS" && strings.HasPrefix(rest, "* ")
	case len(line) == 0:
		f.endHead()
	case line[0] == ' ' || line[0] == '\t': // obs-fold: a continuation of the previous field
		if f.lastTE && len(f.te) > 0 {
			f.te[len(f.te)-1] += " " + strings.TrimSpace(string(line))
		}
	default:
		name, value, ok := strings.Cut(string(line), ":")
		if !ok {
			f.loseTrack() // net/http answers 400 and closes
			return
		}
		if !full {
			value = "\x00" // longer than any framing value net/http accepts
		}
		f.lastTE = false
		switch {
		case strings.EqualFold(name, "Content-Length"):
			f.cl = append(f.cl, strings.TrimSpace(value))
		case strings.EqualFold(name, "Transfer-Encoding"):
			f.te, f.lastTE = append(f.te, strings.TrimSpace(value)), true
		}
	}
}

// endHead decides the framing of the body that follows the head, as net/http does.
func (f *framer) endHead() {
	i := f.requests
	if !f.optAll {
		f.requests++
	}
	if len(f.te) > 0 && (len(f.cl) > 0 || f.http10) {
		f.refuseFrom(i, whyAmbiguous)
		return
	}
	switch {
	case len(f.te) > 0:
		if len(f.te) != 1 || !strings.EqualFold(f.te[0], "chunked") {
			f.loseTrackAt(i) // net/http answers 501 and closes
			return
		}
		f.resetHead()
		f.state = stChunkSize
	case len(f.cl) > 0:
		n, err := strconv.ParseUint(f.cl[0], 10, 63)
		for _, v := range f.cl[1:] {
			if v != f.cl[0] {
				err = strconv.ErrSyntax
			}
		}
		if err != nil || f.cl[0] == "" || f.cl[0][0] == '+' {
			f.loseTrackAt(i) // net/http answers 400 and closes
			return
		}
		f.resetHead()
		if f.n = int64(n); f.n > 0 {
			f.state = stBody
		} else {
			f.nextHead()
		}
	default:
		f.nextHead()
	}
}

func (f *framer) chunkSize(line []byte, full, crlf bool) {
	if !crlf || !full || bytes.IndexByte(line, '\r') >= 0 {
		f.loseTrack()
		return
	}
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	line = bytes.TrimRight(line, " \t")
	n, err := strconv.ParseUint(string(line), 16, 64)
	if err != nil || len(line) == 0 || len(line) > 16 || line[0] == '+' || n > 1<<62 {
		f.loseTrack()
		return
	}
	if n == 0 {
		f.state = stTrailer
		return
	}
	f.n, f.state = int64(n), stChunkData
}

func (f *framer) resetHead() {
	f.requestLine, f.http10, f.optAll, f.lastTE = true, false, false, false
	f.cl, f.te = f.cl[:0], f.te[:0]
	f.headBytes = 0
}

func (f *framer) nextHead() {
	f.resetHead()
	f.state = stHead
}

// loseTrack stops following the connection: every request not yet counted (the one whose
// head is being read, or the ones after the body being read) is served with Connection: close,
// or refused when it is a chunked body's framing that broke.
func (f *framer) loseTrack() {
	if f.state >= stChunkSize && f.state <= stTrailer {
		f.refuseFrom(f.requests, whyBrokenChunks)
		return
	}
	f.loseTrackAt(f.requests)
}

func (f *framer) refuseFrom(i int, why string) {
	f.ambiguous, f.why, f.state = i, why, stDone
}

func (f *framer) loseTrackAt(i int) {
	f.lost, f.state = i, stDone
}

package mediaserver

import (
	"bytes"
	"errors"
	"hash/fnv"
	"image"
	"image/color"
	"image/png"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxBigBytes bounds /big so that a typo cannot stream forever.
const maxBigBytes = 1 << 34

// bigChunk is the write size of /big.
const bigChunk = 32 << 10

// jpegMagic starts every /big body, so that content sniffing sees a JPEG.
var jpegMagic = []byte{0xFF, 0xD8, 0xFF, 0xE0}

// PNG returns the deterministic PNG served at /img/{name}.png. Its
// dimensions (16..143 pixels per side) and so its size depend on name.
func PNG(name string) []byte {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	seed := h.Sum32()
	w, hgt := 16+int(seed%128), 16+int(seed>>8%128)
	img := image.NewNRGBA(image.Rect(0, 0, w, hgt))
	for y := range hgt {
		for x := range w {
			v := uint32(x*7+y*13) ^ seed>>(uint(x+y)%24)
			img.SetNRGBA(x, y, color.NRGBA{R: uint8(v), G: uint8(v >> 8), B: uint8(x ^ y), A: 255})
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		panic("mediaserver: encoding PNG: " + err.Error()) // cannot happen with an in-memory buffer
	}
	return buf.Bytes()
}

// BigBody returns the first n bytes served by /big: a JPEG magic number
// followed by a deterministic pattern.
func BigBody(n int) []byte {
	b := make([]byte, n)
	fillBig(b, 0)
	return b
}

// fillBig fills b with the /big content starting at offset off.
func fillBig(b []byte, off int64) {
	for i := range b {
		p := off + int64(i)
		if p < int64(len(jpegMagic)) {
			b[i] = jpegMagic[p]
		} else {
			b[i] = byte(p*31 + p>>8)
		}
	}
}

// handleImage answers /img/{name}.png[?type=T] (see writeTyped).
func handleImage(rw http.ResponseWriter, r *http.Request) {
	name, ok := strings.CutSuffix(r.PathValue("file"), ".png")
	if !ok || name == "" {
		http.NotFound(rw, r)
		return
	}
	writeTyped(rw, r, PNG(name), "image/png")
}

// writePNG answers a PNG with its length.
func writePNG(rw http.ResponseWriter, b []byte) {
	rw.Header().Set("Content-Type", "image/png")
	rw.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = rw.Write(b)
}

// handleBig answers /big?bytes=N[&chunked=1][&type=T][&declare=M].
func handleBig(rw http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	n, err := strconv.ParseInt(q.Get("bytes"), 10, 64)
	if err != nil || n < 0 || n > maxBigBytes {
		http.Error(rw, "bytes must be an integer in [0, 2^34]", http.StatusBadRequest)
		return
	}
	ctype := "image/jpeg"
	if t := q.Get("type"); t != "" {
		if _, _, err := mime.ParseMediaType(t); err != nil {
			http.Error(rw, "type must be a media type", http.StatusBadRequest)
			return
		}
		ctype = t
	}
	chunked := q.Get("chunked") == "1" || q.Get("chunked") == "true"
	declared := strconv.FormatInt(n, 10)
	if d := q.Get("declare"); d != "" {
		if m, err := strconv.ParseInt(d, 10, 64); err != nil || m < n || chunked {
			http.Error(rw, "declare must be an integer at least bytes, without chunked", http.StatusBadRequest)
			return
		}
		declared = d
	}
	rw.Header().Set("Content-Type", ctype)
	if !chunked {
		rw.Header().Set("Content-Length", declared)
	}
	rw.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(rw)
	if chunked {
		_ = rc.Flush() // commit to chunked encoding before any byte is known
	}
	buf := make([]byte, bigChunk)
	for off := int64(0); off < n; {
		if r.Context().Err() != nil {
			return
		}
		chunk := buf[:min(int64(len(buf)), n-off)]
		fillBig(chunk, off)
		if _, err := rw.Write(chunk); err != nil {
			return
		}
		off += int64(len(chunk))
	}
}

// handleSlow answers /slow?delay=D[&mode=body].
func handleSlow(rw http.ResponseWriter, r *http.Request) {
	d, err := parseDelay(r.URL.Query().Get("delay"))
	if err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	body := PNG("slow")
	if r.URL.Query().Get("mode") == "body" {
		rw.Header().Set("Content-Type", "image/png")
		rw.Header().Set("Content-Length", strconv.Itoa(len(body)))
		rw.WriteHeader(http.StatusOK)
		_ = http.NewResponseController(rw).Flush()
		if !sleep(r, d) {
			return
		}
		_, _ = io.Copy(rw, bytes.NewReader(body))
		return
	}
	if !sleep(r, d) {
		return
	}
	writePNG(rw, body)
}

// parseDelay accepts a Go duration ("250ms") or integer milliseconds ("250").
func parseDelay(s string) (time.Duration, error) {
	if s == "" {
		return time.Second, nil
	}
	if ms, err := strconv.Atoi(s); err == nil && ms >= 0 {
		return time.Duration(ms) * time.Millisecond, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, errBadDelay
	}
	return d, nil
}

// errBadDelay reports an unparsable delay.
var errBadDelay = errors.New("delay must be a duration (250ms) or milliseconds (250)")

// sleep waits d unless the request is cancelled first; it reports whether
// the request is still live.
func sleep(r *http.Request, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.Context().Done():
		return false
	case <-t.C:
		return true
	}
}

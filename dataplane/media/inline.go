package media

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// writeBody writes the request's media into its body: each download as a base64 data: URL, and
// every part not in the canonical shape rewritten to it ({"type": "image_url", "image_url":
// {"url": ...}}, the part's other members kept), so that render, encode and the workers read one
// shape. The new messages value is built in one allocation of its exact size, reserved in the
// process budget first; the downloaded bytes are let go once it is written. The body with its
// media inlined must stay within max_inlined_body_size.
func (s *Inliner) writeBody(rc *request.Context, l Layout, items []mediaItem, use *mediaUse) error {
	key := l.Messages
	rawMsgs, _ := rc.Body.Get(key)
	type edit struct {
		it        *mediaItem
		off       int
		pre, post []byte
	}
	var edits []edit
	size, end := len(rawMsgs), 0
	for i := range items {
		it := &items[i]
		if it.canonical && !it.fetched {
			continue
		}
		off := body.Offset(rawMsgs, it.raw)
		if off < end {
			return fmt.Errorf("replace-media-urls: %s is not where the walker found it", it.where())
		}
		end = off + len(it.raw)
		pre, post := canonicalPart(it)
		size += len(pre) + urlTokenLen(it) + len(post) - len(it.raw)
		edits = append(edits, edit{it: it, off: off, pre: pre, post: post})
	}
	if total := int64(rc.Body.Size() - len(rawMsgs) + size); total > s.maxBody {
		return apierror.InvalidField(key, "with its media inlined the request is %d bytes, more than max_inlined_body_size (%d bytes)", total, s.maxBody)
	}
	if len(edits) == 0 {
		return nil
	}
	downloads := use.holding()
	if err := use.hold(int64(size)); err != nil {
		return err
	}
	buf := make([]byte, 0, size)
	last := 0
	for _, e := range edits {
		buf = append(buf, rawMsgs[last:e.off]...)
		buf = append(buf, e.pre...)
		if it := e.it; it.fetched {
			start := len(buf) + 1
			buf = append(buf, `"data:`...)
			buf = append(buf, it.contentType...)
			buf = append(buf, ";base64,"...)
			for _, c := range it.data {
				n := len(buf)
				buf = buf[:n+base64.StdEncoding.EncodedLen(len(c))]
				base64.StdEncoding.Encode(buf[n:], c)
			}
			// The entry's URL shares the body (never modified after this).
			it.url, it.data = unsafe.String(&buf[start], len(buf)-start), nil
			buf = append(buf, '"')
		} else {
			buf = append(buf, it.urlRaw...)
		}
		buf = append(buf, e.post...)
		last = e.off + len(e.it.raw)
	}
	buf = append(buf, rawMsgs[last:]...)
	rc.Body.Set(key, buf)
	use.drop(downloads)
	return nil
}

// canonicalPart returns the canonical part of an item around its URL token: pre is
// {"type":<partType>,<field>:{"url": and post the media member's other members, }, the part's
// other members and }.
func canonicalPart(it *mediaItem) (pre, post []byte) {
	if it.input {
		return inputPart(it)
	}
	pre = body.AppendQuote([]byte(`{"type":`), it.kind.partType)
	pre = append(body.AppendQuote(append(pre, ','), it.kind.field), `:{"url":`...)
	if it.inner != nil {
		for _, f := range it.inner.Fields() {
			if f.Key != "url" {
				post = appendMember(post, f)
			}
		}
	}
	post = append(post, '}')
	for _, f := range it.obj.Fields() {
		if f.Key != "type" && f.Key != it.kind.field {
			post = appendMember(post, f)
		}
	}
	return pre, append(post, '}')
}

// inputPart is canonicalPart for a Responses input_image: {"type":"input_image",
// "image_url": before the URL, then the part's other members (and those of an image_url object,
// but its url) and }.
func inputPart(it *mediaItem) (pre, post []byte) {
	pre = []byte(`{"type":"input_image","image_url":`)
	if it.inner != nil {
		for _, f := range it.inner.Fields() {
			if f.Key != "url" && !it.obj.Has(f.Key) {
				post = appendMember(post, f)
			}
		}
	}
	for _, f := range it.obj.Fields() {
		if f.Key != "type" && f.Key != it.kind.field {
			post = appendMember(post, f)
		}
	}
	return pre, append(post, '}')
}

func appendMember(dst []byte, f body.Field) []byte {
	dst = append(dst, ',')
	dst = body.AppendQuote(dst, f.Key)
	dst = append(dst, ':')
	return append(dst, f.Value...)
}

// urlTokenLen is the length of an item's URL as a JSON string in the written body.
func urlTokenLen(it *mediaItem) int {
	if !it.fetched {
		return len(it.urlRaw)
	}
	return len(`"data:;base64,"`) + len(it.contentType) + base64.StdEncoding.EncodedLen(int(it.size))
}

// mediaUse accounts one request's media: its total (max_request_media_size) and what it holds of
// the process-wide budget (max_inflight_media_size, checked by each step against its own limit).
// Held are the downloaded bytes (as they arrive) and the inlined body (until the request ends);
// inline data: already in a client body is bounded by server.max_request_body_size instead.
//
// A request refused by the budget lets go of all it holds at once, before its other downloads have
// stopped: requests that fill the budget together then cannot all be refused, since the last one
// standing holds no more than one request may (the budget is at least max_request_media_size +
// max_inlined_body_size). Letting go only when the request ends lets them refuse each other.
type mediaUse struct {
	s     *Inliner
	total atomic.Int64

	mu   sync.Mutex
	held int64 // bytes of the process budget held
	out  bool  // the budget is let go for good: refused, or the request ended
}

// add counts n more media bytes of the request.
func (u *mediaUse) add(it *mediaItem, n int64) error {
	if u.total.Add(n) > u.s.maxRequest {
		return apierror.InvalidField(it.key, "%s: the request's media is more than max_request_media_size (%d bytes)", it.where(), u.s.maxRequest)
	}
	return nil
}

// hold reserves n bytes of the process budget, or fails at once with a 429 (nothing queues) and
// lets go of everything the request holds.
func (u *mediaUse) hold(n int64) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.out {
		if u.s.inFlight.Reserve(n, u.s.maxInFlight) {
			u.held += n
			return nil
		}
		u.letGo()
	}
	return &apierror.Error{Status: http.StatusTooManyRequests, Type: apierror.TypeUnavailable, Code: "media_capacity_exhausted",
		Message: "the coordinator holds as much media as it may for requests in flight (max_inflight_media_size); retry shortly", RetryAfter: time.Second}
}

// holding returns the bytes of the budget the request holds.
func (u *mediaUse) holding() int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.held
}

// drop lets go of n held bytes.
func (u *mediaUse) drop(n int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.out {
		u.held -= n
		u.s.inFlight.Release(n)
	}
}

// release lets go of everything the request holds (safe to call more than once).
func (u *mediaUse) release() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.letGo()
}

// letGo returns all the request holds to the budget and closes it for the request (u.mu held).
func (u *mediaUse) letGo() {
	u.s.inFlight.Release(u.held)
	u.held, u.out = 0, true
}

// checkDataURL validates data:<media type>[;params];base64,<data> with a media type of types and
// returns the media type and the decoded size, computed from the base64 length without decoding.
func checkDataURL(u string, types []string) (string, int64, error) {
	if !hasPrefixFold(u, "data:") {
		return "", 0, errors.New("not a data: URL")
	}
	header, payload, ok := strings.Cut(u[len("data:"):], ",")
	if !ok {
		return "", 0, errors.New("malformed data: URL (no comma)")
	}
	params := strings.Split(header, ";")
	mt := strings.ToLower(strings.TrimSpace(params[0]))
	isBase64 := false
	for _, p := range params[1:] {
		if strings.EqualFold(strings.TrimSpace(p), "base64") {
			isBase64 = true
		}
	}
	switch {
	case !isBase64:
		return "", 0, errors.New("data: URL must be base64-encoded (;base64)")
	case mt == "":
		return "", 0, errors.New("data: URL has no media type")
	case !allowedType(mt, types):
		return "", 0, fmt.Errorf("data: URL media type %q is not one of %s", mt, strings.Join(types, ", "))
	case payload == "":
		return "", 0, errors.New("data: URL has no data")
	}
	n, ok := base64Size(payload)
	if !ok {
		return "", 0, errors.New("data: URL payload is not valid padded base64")
	}
	return mt, n, nil
}

// base64Size checks the alphabet and padding of standard base64 (what Python's b64decode and Go's
// StdEncoding accept, without line breaks) and returns the decoded size, without decoding.
func base64Size(s string) (int64, bool) {
	if len(s) == 0 || len(s)%4 != 0 {
		return 0, false
	}
	n := len(s)
	for n > len(s)-2 && s[n-1] == '=' {
		n--
	}
	for i := 0; i < n; i++ {
		if !base64Alphabet[s[i]] {
			return 0, false
		}
	}
	return int64(n) * 3 / 4, true
}

var base64Alphabet = func() (t [256]bool) {
	for _, c := range "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/" {
		t[c] = true
	}
	return t
}()

// allowedType reports whether mt is one of types.
func allowedType(mt string, types []string) bool { return slices.Contains(types, mt) }

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

package server

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net/http"
	"regexp"
	"strings"
	"sync"

	"github.com/google/uuid"

	"github.com/epd-dev/coordinator/dataplane/apierror"
	"github.com/epd-dev/coordinator/dataplane/body"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
)

// validRequestID is the shape of a client x-request-id that is kept as is.
var validRequestID = regexp.MustCompile(`^[A-Za-z0-9-]{1,128}$`)

// Request ids are not secrets: draw their randomness in batches rather than per request.
func init() { uuid.EnableRandPool() }

// requestID keeps a valid client id and otherwise generates a UUIDv4; replaced reports that a
// client value was discarded.
func requestID(client string) (id string, replaced bool) {
	if validRequestID.MatchString(client) {
		return client, false
	}
	return uuid.NewString(), client != ""
}

// errTooLarge is the 413 for a body over the limit.
func errTooLarge(limit int64) *apierror.Error {
	return &apierror.Error{
		Status:  http.StatusRequestEntityTooLarge,
		Type:    apierror.TypeInvalidRequest,
		Code:    "request_too_large",
		Message: fmt.Sprintf("request body too large: the limit is %d bytes", limit),
	}
}

// readBody reads the whole request body, refusing more than limit bytes. A declared length over
// the limit is refused before reading anything. The buffer comes from a pool; release returns it
// once the request is done with it (see bodyPool).
func readBody(r *http.Request, limit int64) (raw []byte, release func(), err error) {
	if r.ContentLength > limit {
		return nil, noop, errTooLarge(limit)
	}
	if r.ContentLength >= 0 {
		buf := bodyPool.get(int(r.ContentLength))
		raw = (*buf)[:r.ContentLength]
		if _, err := io.ReadFull(r.Body, raw); err != nil {
			bodyPool.put(buf)
			return nil, noop, apierror.BadRequest("unreadable_body", "failed to read request body")
		}
		// Read to EOF: only then does net/http watch the connection, so that a client that goes
		// away cancels the request context (and every upstream leg with it).
		var probe [1]byte
		_, _ = r.Body.Read(probe[:])
		return raw, func() { bodyPool.put(buf) }, nil
	}
	raw, err = io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, noop, apierror.BadRequest("unreadable_body", "failed to read request body")
	}
	if int64(len(raw)) > limit {
		return nil, noop, errTooLarge(limit)
	}
	return raw, noop, nil
}

func noop() {}

// bodyPool recycles request-body buffers by power-of-two size class (4 KiB to 64 MiB), so a
// stream of megabyte requests does not allocate and zero a megabyte each.
var bodyPool sizedPool

type sizedPool struct{ classes [15]sync.Pool }

const minBodyClass = 12 // 4 KiB

func classOf(n int) int {
	c := bits.Len(uint(max(n, 1) - 1))
	return max(c, minBodyClass) - minBodyClass
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
	b := make([]byte, 1<<(c+minBodyClass))
	return &b
}

func (p *sizedPool) put(b *[]byte) {
	c := classOf(cap(*b))
	if c < len(p.classes) && cap(*b) == 1<<(c+minBodyClass) {
		*b = (*b)[:cap(*b)]
		p.classes[c].Put(b)
	}
}

// parseBody parses the body once and checks the fields every format relies on, so that a wrong
// type is a clear 400 here rather than a confusing worker error later.
func parseBody(raw []byte, api pipeline.API) (obj *body.Object, model string, stream bool, err error) {
	obj, err = body.Parse(raw)
	switch {
	case errors.Is(err, body.ErrInvalidJSON):
		return nil, "", false, apierror.BadRequest("invalid_json", "invalid JSON body")
	case errors.Is(err, body.ErrNotObject):
		return nil, "", false, apierror.BadRequest("invalid_body", "request body must be a JSON object")
	case err != nil:
		return nil, "", false, apierror.BadRequest("invalid_json", "invalid JSON body: %v", err)
	}
	if model, _, err = obj.String("model"); err != nil {
		return nil, "", false, apierror.InvalidField("model", "%v", err)
	}
	// The model outlives the request (metric labels, exported spans): do not share the body's memory.
	model = strings.Clone(model)
	if stream, _, err = obj.Bool("stream"); err != nil {
		return nil, "", false, apierror.InvalidField("stream", "%v", err)
	}
	for _, k := range []string{"max_tokens", "max_completion_tokens", "min_tokens"} {
		if _, _, err := obj.Int(k); err != nil {
			return nil, "", false, apierror.InvalidField(k, "%v", err)
		}
	}
	if err := expectKind(obj, "stream_options", 'o', "an object", false); err != nil {
		return nil, "", false, err
	}
	switch api {
	case pipeline.APIChat:
		err = expectKind(obj, "messages", 'a', "an array", true)
	case pipeline.APICompletions:
		if err = expectPresent(obj, "prompt"); err == nil {
			if k := obj.Kind("prompt"); k != 's' && k != 'a' {
				err = apierror.InvalidField("prompt", "\"prompt\" must be a string or an array")
			}
		}
	case pipeline.APIGenerate:
		if err = expectKind(obj, "token_ids", 'a', "an array", true); err == nil {
			err = expectKind(obj, "sampling_params", 'o', "an object", false)
		}
	}
	if err != nil {
		return nil, "", false, err
	}
	return obj, model, stream, nil
}

func expectPresent(obj *body.Object, key string) error {
	if k := obj.Kind(key); k == 0 || k == 'z' {
		return apierror.InvalidField(key, "%q is required", key)
	}
	return nil
}

func expectKind(obj *body.Object, key string, kind byte, what string, required bool) error {
	k := obj.Kind(key)
	if k == 0 || k == 'z' {
		if required {
			return apierror.InvalidField(key, "%q is required", key)
		}
		return nil
	}
	if k != kind {
		return apierror.InvalidField(key, "%q must be %s", key, what)
	}
	return nil
}

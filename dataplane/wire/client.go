package wire

import (
	"errors"
	"net/http"
	"strings"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/state/body"
)

// Client is a client API as the server serves it: one of the Formats, whose requests run in
// their own format and whose answers pass through (Native), or an API the pipeline does not
// speak, translated to a Format at the edge (Messages). Either way the server parses the body
// once, runs the pipeline in Format, writes the answer on the request's Writer and ends it with
// its Finish.
type Client interface {
	// Route is the API's label in the request metrics.
	Route() string
	// Format is the format the pipeline runs the API's requests in.
	Format() Format
	// Parse parses raw, a client body, once into the body the pipeline runs, checked within lim
	// (every error a 400 naming the member at fault, or the limit).
	Parse(raw []byte, lim Limits) (Request, error)
}

// Limits are the bounds of the configuration a client's request is parsed and answered within.
type Limits struct {
	// MaxContentBlocks bounds the content blocks of a Messages request (server.max_content_blocks;
	// 0: no bound).
	MaxContentBlocks int
	// MaxEvent bounds one event of a streamed answer translated for the client, in bytes
	// (gateway.max_event_size; 0: no bound).
	MaxEvent int64
}

// Request is a client's request parsed for the pipeline.
type Request struct {
	// Body is the body the pipeline runs, in the client's Format.
	Body *body.Object
	// Model is the requested model (a copy: it outlives the body).
	Model string
	// Stream is the client's stream flag.
	Stream bool
	// answer, when set, writes the pipeline's answer in the client's API (a translation).
	answer func(w http.ResponseWriter, requestID string) Answer
	// written is the answer made by Writer, finished by Finish.
	written Answer
}

// Answer is a translation's writer: the pipeline writes its answer on it, and Finish completes it
// once the pipeline returned.
type Answer interface {
	http.ResponseWriter
	// Finish completes the answer after the pipeline returned err, and returns the request's
	// error.
	Finish(err error) error
}

// Writer is where the pipeline writes the request's answer: w itself, or the translation in
// front of it.
func (r *Request) Writer(w http.ResponseWriter, requestID string) http.ResponseWriter {
	if r.answer == nil {
		return w
	}
	r.written = r.answer(w, requestID)
	return r.written
}

// Finish completes the answer once the pipeline returned err and returns the request's error.
func (r *Request) Finish(err error) error {
	if r.written == nil {
		return err
	}
	return r.written.Finish(err)
}

// Native is the client of a format the workers serve themselves: its body runs as the client
// sent it (checked) and its answer passes through.
type Native struct{ F Format }

// routes are the formats' metrics labels.
var routes = map[Format]string{Chat: "chat", Completions: "completions", Generate: "generate", Responses: "responses"}

// Route is the format's metrics label.
func (n Native) Route() string { return routes[n.F] }

// Format is the format itself.
func (n Native) Format() Format { return n.F }

// Parse parses the body once and checks what every format relies on (model a string, stream a
// boolean, the token limits integers, stream_options an object), then what the format does
// (Format.Check), so that a wrong type is a clear 400 here rather than a worker's error later.
func (n Native) Parse(raw []byte, _ Limits) (Request, error) {
	obj, err := body.Parse(raw)
	switch {
	case errors.Is(err, body.ErrInvalidJSON):
		return Request{}, apierror.BadRequest("invalid_json", "invalid JSON body")
	case errors.Is(err, body.ErrNotObject):
		return Request{}, apierror.BadRequest("invalid_body", "request body must be a JSON object")
	case err != nil:
		return Request{}, apierror.BadRequest("invalid_json", "invalid JSON body: %v", err)
	}
	r := Request{Body: obj}
	if r.Model, _, err = obj.String("model"); err != nil {
		return Request{}, apierror.InvalidField("model", "%v", err)
	}
	// The model outlives the request (metric labels, exported spans): do not share the body's memory.
	r.Model = strings.Clone(r.Model)
	if r.Stream, _, err = obj.Bool("stream"); err != nil {
		return Request{}, apierror.InvalidField("stream", "%v", err)
	}
	for _, k := range []string{"max_tokens", "max_completion_tokens", "min_tokens"} {
		if _, _, err := obj.Int(k); err != nil {
			return Request{}, apierror.InvalidField(k, "%v", err)
		}
	}
	if err := expectKind(obj, "stream_options", body.KindObject, "an object", false); err != nil {
		return Request{}, err
	}
	if err := checkPartition(obj); err != nil {
		return Request{}, err
	}
	if err := n.F.Check(obj); err != nil {
		return Request{}, err
	}
	return r, nil
}

// MaxPartitionKeyLen bounds cache_salt and prompt_cache_key, in bytes: every leg carries them,
// each encode leg too, so a long one would be copied once per media item.
const MaxPartitionKeyLen = 1024

// checkPartition refuses a cache_salt or prompt_cache_key (partitionKeys) that is not a string
// of at most MaxPartitionKeyLen bytes.
func checkPartition(obj *body.Object) error {
	for _, k := range partitionKeys[1:] {
		s, _, err := obj.String(k)
		if err != nil {
			return apierror.InvalidField(k, "%v", err)
		}
		if len(s) > MaxPartitionKeyLen {
			return apierror.InvalidField(k, "%s must be at most %d bytes, got %d", k, MaxPartitionKeyLen, len(s))
		}
	}
	return nil
}

// ClientFor is the client API served at path (nil: none).
func ClientFor(path string) Client {
	return clients[path]
}

// clients are the client APIs by path, made once (a Client made per request would be boxed).
var clients = func() map[string]Client {
	m := map[string]Client{MessagesPath: Messages}
	for _, p := range Paths {
		m[p] = Native{ForPath(p)}
	}
	return m
}()

// ClientPaths are the paths of every client API.
var ClientPaths = append(append([]string(nil), Paths...), MessagesPath)

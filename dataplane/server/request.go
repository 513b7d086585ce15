package server

import (
	"errors"
	"regexp"
	"strings"

	"github.com/google/uuid"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/wire/responses"
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

// parseBody parses the body once and checks the fields every format relies on, so that a wrong
// type is a clear 400 here rather than a confusing worker error later.
func parseBody(raw []byte, api request.API) (obj *body.Object, model string, stream bool, err error) {
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
	if err := expectKind(obj, "stream_options", body.KindObject, "an object", false); err != nil {
		return nil, "", false, err
	}
	switch api {
	case request.APIChat:
		err = expectKind(obj, "messages", body.KindArray, "an array", true)
	case request.APICompletions:
		if err = expectPresent(obj, "prompt"); err == nil {
			if k := obj.Kind("prompt"); k != body.KindString && k != body.KindArray {
				err = apierror.InvalidField("prompt", "\"prompt\" must be a string or an array")
			}
		}
	case request.APIGenerate:
		if err = expectKind(obj, "token_ids", body.KindArray, "an array", true); err == nil {
			err = expectKind(obj, "sampling_params", body.KindObject, "an object", false)
		}
	case request.APIResponses:
		if err = responses.Check(obj); err == nil {
			responses.Stateless(obj)
		}
	}
	if err != nil {
		return nil, "", false, err
	}
	return obj, model, stream, nil
}

func expectPresent(obj *body.Object, key string) error {
	if k := obj.Kind(key); k == body.KindNone || k == body.KindNull {
		return apierror.InvalidField(key, "%q is required", key)
	}
	return nil
}

func expectKind(obj *body.Object, key string, kind body.Kind, what string, required bool) error {
	k := obj.Kind(key)
	if k == body.KindNone || k == body.KindNull {
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

package asyncbroker

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strings"

	"github.com/epd-dev/coordinator/dataplane/apierror"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/upstream"
)

// requestsPath is the prefix of a queued request's URL.
const requestsPath = "/v1/requests/"

// validID is the shape of a request id (the server's x-request-id rule).
var validID = regexp.MustCompile(`^[A-Za-z0-9-]{1,128}$`)

// Routes serves the results of queued requests on the coordinator's listener:
// GET /v1/requests/{id} (the result, 202 while pending, 410 when unknown) and
// DELETE /v1/requests/{id} (cancel and forget, 204), both scoped to the caller's tenant, and,
// with serve_models, GET /v1/models listing the routes' models.
func (s *Step) Routes() []pipeline.Route {
	r := []pipeline.Route{
		{Pattern: "GET " + requestsPath + "{id}", Handler: http.HandlerFunc(s.handleGet)},
		{Pattern: "DELETE " + requestsPath + "{id}", Handler: http.HandlerFunc(s.handleDelete)},
	}
	if s.cfg.serveModels {
		r = append(r, pipeline.Route{Pattern: "GET /v1/models", Handler: http.HandlerFunc(s.handleModels)})
	}
	return r
}

// target reads the id and tenant of a /v1/requests/{id} call.
func (s *Step) target(r *http.Request) (id, tenant string, e *apierror.Error) {
	id = r.PathValue("id")
	if id == "" {
		// Dispatched through ServeMux.Handler, which does not set path values.
		id = strings.TrimPrefix(r.URL.Path, requestsPath)
	}
	if !validID.MatchString(id) {
		return "", "", invalid("invalid request id: 1 to 128 letters, digits or '-'")
	}
	tenant, err := s.tenant(r.Header)
	if err != nil {
		var ae *apierror.Error
		if errors.As(err, &ae) {
			return "", "", ae
		}
		return "", "", invalid("%v", err)
	}
	return id, tenant, nil
}

// handleGet answers with the request's result, or its state.
func (s *Step) handleGet(w http.ResponseWriter, r *http.Request) {
	reqID := w.Header().Get(upstream.RequestIDHeader)
	id, tenant, e := s.target(r)
	if e != nil {
		apierror.Write(w, e, reqID)
		return
	}
	client, release, err := s.hold()
	if err != nil {
		apierror.Write(w, lookupFailed(err), reqID)
		return
	}
	defer release()
	state, payload, err := s.lookup(r.Context(), client, keysFor(tenant, id), s.cfg.fetchGrace)
	if err != nil {
		s.log.Error(err, "async-broker: result lookup failed", "id", id, "tenant", tenant)
		apierror.Write(w, lookupFailed(err), reqID)
		return
	}
	switch state {
	case stateReady:
		status, body, e := mapResult(payload)
		if e != nil {
			apierror.Write(w, e, reqID)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(body)
	case statePending:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write(acceptedBody(id, StatusPending))
	case stateExpired:
		apierror.Write(w, errDeadline(), reqID)
	case stateCancelled:
		apierror.Write(w, errCancelled(), reqID)
	default:
		apierror.Write(w, &apierror.Error{Status: http.StatusGone, Type: apierror.TypeInvalidRequest, Code: "UNKNOWN_REQUEST",
			Message: "unknown request: it never existed for this tenant, was deleted, or its result expired"}, reqID)
	}
}

// handleDelete cancels the request if it is live (a queued copy is dropped, a running one
// aborted) and deletes its result. It is idempotent: 204 whether or not the request was known.
func (s *Step) handleDelete(w http.ResponseWriter, r *http.Request) {
	reqID := w.Header().Get(upstream.RequestIDHeader)
	id, tenant, e := s.target(r)
	if e != nil {
		apierror.Write(w, e, reqID)
		return
	}
	client, release, err := s.hold()
	if err != nil {
		apierror.Write(w, deleteFailed(err), reqID)
		return
	}
	defer release()
	cancelled, err := s.cancel(context.WithoutCancel(r.Context()), client, keysFor(tenant, id), "", true)
	if err != nil {
		s.log.Error(err, "async-broker: cancel failed", "id", id, "tenant", tenant)
		apierror.Write(w, deleteFailed(err), reqID)
		return
	}
	verbose(s.log, "async-broker: request deleted", "id", id, "tenant", tenant, "was_live", cancelled)
	w.WriteHeader(http.StatusNoContent)
}

// handleModels lists the models named by routes.
func (s *Step) handleModels(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		OwnedBy string `json:"owned_by"`
	}
	out := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	seen := map[string]bool{}
	for _, r := range s.cfg.routes {
		if r.model == "" || r.model == wildcard || seen[r.model] {
			continue
		}
		seen[r.model] = true
		out.Data = append(out.Data, model{ID: r.model, Object: "model", OwnedBy: "llm-d-async"})
	}
	b, _ := json.Marshal(out)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(b, '\n'))
}

func lookupFailed(err error) *apierror.Error {
	return &apierror.Error{Status: http.StatusInternalServerError, Type: apierror.TypeAPI, Code: "LOOKUP_FAILED",
		Message: "the result could not be read from the broker (Redis); retry later", Cause: err}
}

func deleteFailed(err error) *apierror.Error {
	return &apierror.Error{Status: http.StatusInternalServerError, Type: apierror.TypeAPI, Code: "DELETE_FAILED",
		Message: "the request could not be cancelled in the broker (Redis); retry later", Cause: err}
}

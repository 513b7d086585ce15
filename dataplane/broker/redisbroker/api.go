package redisbroker

import (
	"context"
	"net/http"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
)

// ServeResult answers GET /v1/requests/{id} (id and tenant validated by the step) with the
// request's result, or its state: 202 while queued or running, 504 after its deadline, 499 after
// a DELETE, 410 when the tenant has no such request.
func (b *Broker) ServeResult(w http.ResponseWriter, r *http.Request, tenant, id string) {
	reqID := w.Header().Get(upstream.RequestIDHeader)
	client, release, err := b.hold()
	if err != nil {
		apierror.Write(w, lookupFailed(err), reqID)
		return
	}
	defer release()
	state, payload, err := b.lookup(r.Context(), client, keysFor(tenant, id), b.cfg.FetchGrace)
	if err != nil {
		b.log.Error(err, "async-broker: result lookup failed", "id", id, "tenant", tenant)
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

// ServeDelete answers DELETE /v1/requests/{id} (id and tenant validated by the step): it cancels
// the request if it is live (a queued copy is dropped, a running one aborted) and deletes its
// result. It is idempotent: 204 whether or not the request was known.
func (b *Broker) ServeDelete(w http.ResponseWriter, r *http.Request, tenant, id string) {
	reqID := w.Header().Get(upstream.RequestIDHeader)
	client, release, err := b.hold()
	if err != nil {
		apierror.Write(w, deleteFailed(err), reqID)
		return
	}
	defer release()
	cancelled, err := b.cancel(context.WithoutCancel(r.Context()), client, keysFor(tenant, id), "", true)
	if err != nil {
		b.log.Error(err, "async-broker: cancel failed", "id", id, "tenant", tenant)
		apierror.Write(w, deleteFailed(err), reqID)
		return
	}
	verbose(b.log, "async-broker: request deleted", "id", id, "tenant", tenant, "was_live", cancelled)
	w.WriteHeader(http.StatusNoContent)
}

func lookupFailed(err error) *apierror.Error {
	return &apierror.Error{Status: http.StatusInternalServerError, Type: apierror.TypeAPI, Code: "LOOKUP_FAILED",
		Message: "the result could not be read from the broker (Redis); retry later", Cause: err}
}

func deleteFailed(err error) *apierror.Error {
	return &apierror.Error{Status: http.StatusInternalServerError, Type: apierror.TypeAPI, Code: "DELETE_FAILED",
		Message: "the request could not be cancelled in the broker (Redis); retry later", Cause: err}
}

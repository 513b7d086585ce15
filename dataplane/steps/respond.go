package steps

import (
	"errors"
	"net/http"

	"github.com/epd-dev/coordinator/dataplane/logging"
	"github.com/epd-dev/coordinator/dataplane/request"
	"github.com/epd-dev/coordinator/dataplane/upstream"
)

// respond relays a worker's answer to the client and logs how a broken relay ended.
func respond(rc *request.Context, resp *http.Response, phase string) error {
	err := upstream.Relay(rc.Writer, resp, rc.ID, rc.Stream)
	switch {
	case err == nil:
	case errors.Is(err, upstream.ErrClientGone):
		rc.Log.V(logging.Verbose).Info("client went away during the response", "phase", phase, "err", err.Error())
	default:
		rc.Log.Error(err, "worker response broke off; the client received a partial response", "phase", phase)
	}
	return err
}

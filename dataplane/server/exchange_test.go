package server

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/relay"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
)

// A response cut off counts against the pipeline; a client that left (its context ended, or a
// write to it failed) does not, nor does an error answered before the response started.
func TestCut(t *testing.T) {
	live := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	gone := live.WithContext(ctx)
	tests := map[string]struct {
		req    *http.Request
		cause  error
		apiErr *apierror.Error
		want   bool
	}{
		"served":                          {req: live},
		"a worker died mid-stream":        {req: live, cause: errors.Join(relay.ErrBroken, errors.New("unexpected EOF")), want: true},
		"the client's write failed":       {req: live, cause: errors.Join(upstream.ErrClientGone, syscall.EPIPE)},
		"the client's context ended":      {req: gone, cause: context.Canceled},
		"an error before the response":    {req: live, cause: errors.New("upstream 503"), apiErr: &apierror.Error{Status: 503}},
		"a failure after the client left": {req: gone, cause: errors.Join(relay.ErrBroken, context.Canceled)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := echo.New().NewContext(tc.req, httptest.NewRecorder())
			x := &exchange{cause: tc.cause, apiErr: tc.apiErr}
			if got := x.cut(c); got != tc.want {
				t.Fatalf("cut = %v, want %v", got, tc.want)
			}
		})
	}
}

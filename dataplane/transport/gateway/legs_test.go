package gateway

import (
	"io"
	"net/http"
	"testing"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/bodybuf"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

func TestLegCarriesTheRequestAndHoldsItsBuffer(t *testing.T) {
	raw := []byte(`{"model":"m","messages":[]}`)
	obj, err := body.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	buf := bodybuf.Of(raw)
	rc := &request.Context{ID: "rid", Forwarded: http.Header{"X-Tenant": {"t"}}, Body: obj, Buffer: buf, Log: logr.Discard()}
	leg := NewLeg(rc, "prefill", "/v1/chat/completions", obj)
	if leg.Profile != "prefill" || leg.Phase != "prefill" || leg.Path != "/v1/chat/completions" || leg.RequestID != "rid-prefill" || leg.ParentID != "rid" ||
		leg.Header.Get("X-Tenant") != "t" || leg.Size != int64(len(raw)) {
		t.Fatalf("leg %+v", leg)
	}
	replay, err := leg.GetBody()
	if err != nil {
		t.Fatal(err)
	}
	buf.Release() // the request is done: the leg bodies still read the bytes
	for _, r := range []io.Reader{leg.Body, replay} {
		if got, err := io.ReadAll(r); err != nil || string(got) != string(raw) {
			t.Fatalf("leg body %q, %v", got, err)
		}
	}
	if _, err := leg.GetBody(); err != nil {
		t.Fatal(err)
	}
}

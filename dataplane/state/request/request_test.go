package request

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/bodybuf"
)

func TestAPIForPathAndFormat(t *testing.T) {
	tests := map[string]struct {
		api             API
		openAI, tokenIn API
	}{
		PathChat:        {APIChat, APIChat, APIGenerate},
		PathCompletions: {APICompletions, APICompletions, APICompletions},
		PathGenerate:    {APIGenerate, APIGenerate, APIGenerate},
	}
	for path, tc := range tests {
		api := APIForPath(path)
		if api != tc.api || api.Format(true) != tc.openAI || api.Format(false) != tc.tokenIn || api.Path() != path {
			t.Errorf("%s: %v, formats %v/%v, path %s", path, api, api.Format(true), api.Format(false), api.Path())
		}
	}
}

func TestLegCarriesTheRequestAndHoldsItsBuffer(t *testing.T) {
	raw := []byte(`{"model":"m","messages":[]}`)
	obj, err := body.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	buf := bodybuf.Of(raw)
	rc := &Context{ID: "rid", Forwarded: http.Header{"X-Tenant": {"t"}}, Body: obj, Buffer: buf, Log: logr.Discard()}
	leg := rc.Leg("prefill", PathChat, obj)
	if leg.Profile != "prefill" || leg.Phase != "prefill" || leg.Path != PathChat || leg.RequestID != "rid" ||
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

func TestTimings(t *testing.T) {
	rc := &Context{}
	rc.StartStep("render")
	if got := rc.EndStep("ok"); got.Step != "render" || got.Outcome != "ok" {
		t.Fatalf("EndStep = %+v", got)
	}
	rc.StartStep("conditional-decode")
	st := rc.ServerTiming()
	if !strings.HasPrefix(st, "render;dur=") || !strings.Contains(st, ", conditional_decode;dur=") {
		t.Fatalf("Server-Timing %q", st)
	}
	if kv := rc.TimingSummary(); len(kv) != 2 || kv[0] != "render" {
		t.Fatalf("summary %v", kv)
	}
}

func TestTokenIDsJSON(t *testing.T) {
	rc := &Context{}
	rc.SetTokenIDs([]int{1, -2, 30})
	if got := string(rc.TokenIDsJSON()); got != "[1,-2,30]" {
		t.Fatalf("TokenIDsJSON = %s", got)
	}
	rc.SetTokenIDs(nil)
	if got := string(rc.TokenIDsJSON()); got != "[]" {
		t.Fatalf("TokenIDsJSON = %s", got)
	}
}

package steps

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
)

// With hints, a conditional decode's 412 steers the prefill leg; without, it is ignored.
func TestConditionalDecodeHints(t *testing.T) {
	for _, on := range []bool{true, false} {
		gw := newFakeGateway(t, func(w http.ResponseWriter, c captured) {
			if c.Header.Get("Prefer") == "if-available" {
				w.Header().Set("X-Prefill-Host-Port", "10.0.0.2:8000,10.0.0.1:8000")
				w.WriteHeader(http.StatusPreconditionFailed)
				return
			}
			okJSON(`{"kv_transfer_params":{}}`)(w, c)
		})
		cd := newStep(t, ConditionalDecodeStep, gw, map[string]any{"hints": on})
		pre := newStep(t, PrefillStep, gw, nil)
		rc, _ := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, http.Header{gateway.PinHeader: {"10.6.6.6:1"}})
		if err := cd.Execute(context.Background(), rc); err != nil || errors.Is(err, pipeline.ErrDone) {
			t.Fatal(err)
		}
		if err := pre.Execute(context.Background(), rc); err != nil {
			t.Fatal(err)
		}
		reqs := gw.requests()
		want := ""
		if on {
			want = "10.0.0.2:8000"
		}
		if got := reqs[1].Header.Get(gateway.PinHeader); got != want {
			t.Fatalf("hints %v: prefill pinned to %q, want %q", on, got, want)
		}
	}
}

// A pair whose prefill endpoint was hinted skips the reservation; its retry reserves.
func TestPrefillDecodeUsesTheHint(t *testing.T) {
	g := newSGLangGateway(t)
	var prefills atomic.Int32
	inner := g.prefill
	g.prefill = func(w http.ResponseWriter, c captured, r *http.Request) {
		if prefills.Add(1) == 1 {
			if c.Header.Get(gateway.PinHeader) != "10.0.0.9:8000" || c.Body["bootstrap_host"] != "10.0.0.9" {
				t.Errorf("hinted prefill %v %s", c.Header, c.Raw)
			}
			w.WriteHeader(http.StatusServiceUnavailable) // the hinted pod is gone
			return
		}
		inner(w, c, r)
	}
	s := newStep(t, PrefillDecodeStep, g.fakeGateway, sglangParams)
	rc, rec := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true}`, nil)
	rc.Hints = map[string][]string{"prefill": {"10.0.0.9:8000"}}
	if err := s.Execute(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	if text, _ := contentOf(t, rec.Body.String()); text != "a b c" || g.count("reserve") != 1 || g.count("prefill") != 2 {
		t.Fatalf("client got %q; legs %v", text, g.legs)
	}
}

// A 412 hinting addresses no pod has (the metadata service, loopback) pins nothing: the prefill
// leg goes wherever the picker chooses, and a prefill-decode pair reserves rather than sending
// the decode worker there for the KV. gateway.allowed_hint_networks admits loopback.
func TestConditionalDecodeRefusesHintedAddresses(t *testing.T) {
	for _, tc := range []struct {
		allowed []string
		pin     string
	}{
		{pin: ""},
		{allowed: []string{"127.0.0.0/8"}, pin: "127.0.0.1:8000"},
	} {
		gw := newFakeGateway(t, func(w http.ResponseWriter, c captured) {
			if c.Header.Get("Prefer") == "if-available" {
				w.Header().Set("X-Prefill-Host-Port", "169.254.169.254:8000,[::ffff:169.254.169.254]:8000,127.0.0.1:8000")
				w.WriteHeader(http.StatusPreconditionFailed)
				return
			}
			okJSON(`{"kv_transfer_params":{}}`)(w, c)
		})
		gw.tune = func(c *config.Gateway) { c.AllowedHintNetworks = tc.allowed }
		cd := newStep(t, ConditionalDecodeStep, gw, map[string]any{"hints": true})
		pre := newStep(t, PrefillStep, gw, nil)
		rc, _ := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, nil)
		if err := cd.Execute(context.Background(), rc); err != nil {
			t.Fatal(err)
		}
		if err := pre.Execute(context.Background(), rc); err != nil {
			t.Fatal(err)
		}
		if got := gw.requests()[1].Header.Get(gateway.PinHeader); got != tc.pin {
			t.Fatalf("allowed %v: prefill pinned to %q, want %q (hints %v)", tc.allowed, got, tc.pin, rc.Hints)
		}
	}

	g := newSGLangGateway(t)
	s := newStep(t, PrefillDecodeStep, g.fakeGateway, sglangParams)
	rc, _ := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true}`, nil)
	rc.Hints, _ = gateway.ReadHints(http.Header{"X-Prefill-Host-Port": {"169.254.169.254:8000"}}, nil)
	if err := s.Execute(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	for _, r := range g.requests() {
		if r.Header.Get(gateway.PinHeader) == "169.254.169.254:8000" || r.Body["bootstrap_host"] == "169.254.169.254" {
			t.Fatalf("leg %v %s", r.Header, r.Raw)
		}
	}
	if g.count("reserve") != 1 {
		t.Fatalf("legs %v: the pair did not reserve", g.legs)
	}
}

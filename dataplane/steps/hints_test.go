package steps

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
)

func TestReadHints(t *testing.T) {
	many := strings.Repeat("10.0.0.1:80,", 20) + "10.0.0.1:80"
	tests := map[string]struct {
		header  http.Header
		want    map[string][]string
		dropped int
	}{
		"none": {header: http.Header{}},
		"RFC 2178 names": {
			header: http.Header{"X-Prefill-Host-Port": {"10.0.0.1:8000,10.0.0.2:8000"}, "X-Encode-Host-Port": {"10.0.1.1:8000"}},
			want:   map[string][]string{"prefill": {"10.0.0.1:8000", "10.0.0.2:8000"}, "encode": {"10.0.1.1:8000"}},
		},
		"llm-d disaggregation names": {
			header: http.Header{"X-Llm-D-Prefiller-Host-Port": {"10.0.0.3:8000"}, "X-Encoder-Hosts-Ports": {"10.0.1.2:8000, 10.0.1.3:8000"}},
			want:   map[string][]string{"prefill": {"10.0.0.3:8000"}, "encode": {"10.0.1.2:8000", "10.0.1.3:8000"}},
		},
		"the RFC name wins": {
			header: http.Header{"X-Prefill-Host-Port": {"10.0.0.1:1"}, "X-Prefiller-Host-Port": {"10.0.0.9:9"}},
			want:   map[string][]string{"prefill": {"10.0.0.1:1"}},
		},
		"ipv6": {header: http.Header{"X-Prefill-Host-Port": {"[fd00::1]:8000"}}, want: map[string][]string{"prefill": {"[fd00::1]:8000"}}},
		"bad items dropped": {
			header:  http.Header{"X-Prefill-Host-Port": {"prefill-0:8000,10.0.0.1,10.0.0.1:0,,10.0.0.2:8000,http://10.0.0.3:1,0.0.0.0:80,[fe80::1%eth0]:80,224.0.0.1:80"}},
			want:    map[string][]string{"prefill": {"10.0.0.2:8000"}},
			dropped: 8,
		},
		"at most 16":           {header: http.Header{"X-Prefill-Host-Port": {many}}, want: map[string][]string{"prefill": strings.Split(many, ",")[:16]}, dropped: 5},
		"too long":             {header: http.Header{"X-Encode-Host-Port": {strings.Repeat("1", 2000)}}, dropped: 1},
		"decode is not hinted": {header: http.Header{"X-Decode-Host-Port": {"10.0.0.1:80"}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, dropped := readHints(tc.header)
			if !reflect.DeepEqual(got, tc.want) || dropped != tc.dropped {
				t.Fatalf("readHints = %v (%d dropped), want %v (%d)", got, dropped, tc.want, tc.dropped)
			}
		})
	}
}

// The first attempt goes to the hint (item i to hint i modulo their number), the rest wherever
// the picker chooses.
func TestHinted(t *testing.T) {
	rc := &request.Context{Hints: map[string][]string{"encode": {"10.0.0.1:1", "10.0.0.2:2"}}}
	base := func() (gateway.Leg, error) { return gateway.Leg{}, nil }
	for i, want := range []string{"10.0.0.1:1", "10.0.0.2:2", "10.0.0.1:1"} {
		build := hinted(rc, "encode", i, base)
		first, _ := build()
		again, _ := build()
		if first.Header.Get(gateway.PinHeader) != want || again.Header.Get(gateway.PinHeader) != "" {
			t.Fatalf("item %d: first %v, retry %v", i, first.Header, again.Header)
		}
	}
	if leg, _ := hinted(rc, "prefill", 0, base)(); leg.Header != nil {
		t.Fatalf("prefill leg without hints carries %v", leg.Header)
	}
	failing := func() (gateway.Leg, error) { return gateway.Leg{}, errors.New("no body") }
	if _, err := hinted(rc, "encode", 0, failing)(); err == nil {
		t.Fatal("the build's error was lost")
	}
}

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

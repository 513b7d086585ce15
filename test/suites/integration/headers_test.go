package integration

import (
	"context"
	"net/http"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/harness/stack"
)

// gateway.profile_headers decides the spelling of the profile header every leg carries; the
// gateway double (as the EPP of either llm-d release) routes on either.
func TestProfileHeaders(t *testing.T) {
	tests := map[string]struct {
		names      []string
		want, none []string
	}{
		"default: both spellings": {want: []string{"X-Llm-D-Epp-Profile", "Epp-Profile"}},
		"current llm-d only":      {names: []string{"x-llm-d-epp-profile"}, want: []string{"X-Llm-D-Epp-Profile"}, none: []string{"Epp-Profile"}},
		"earlier releases only":   {names: []string{"EPP-Profile"}, want: []string{"Epp-Profile"}, none: []string{"X-Llm-D-Epp-Profile"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := startWith(t, stack.Options{}, "kv-nixl", "ec-nixl", true, steps("prefill", "decode"), func(c *config.Config) {
				if tc.names != nil {
					c.Gateway.ProfileHeaders = tc.names
				}
			})
			if _, err := s.client.Chat.Completions.New(context.Background(), chatParams("hello there", 3)); err != nil {
				t.Fatal(err)
			}
			for role, worker := range map[string]*simworker.Worker{"prefill": s.stack.Prefill[0], "decode": s.stack.Decode[0]} {
				var reqs []simworker.Request
				for _, r := range worker.Requests() {
					if r.Method == http.MethodPost { // not the KV side channel
						reqs = append(reqs, r)
					}
				}
				if len(reqs) != 1 {
					t.Fatalf("%s got %d requests", role, len(reqs))
				}
				for _, h := range tc.want {
					if got := reqs[0].Header.Values(h); len(got) != 1 || got[0] != role {
						t.Errorf("%s leg %s = %q, want %q", role, h, got, role)
					}
				}
				for _, h := range tc.none {
					if got := reqs[0].Header.Values(h); len(got) != 0 {
						t.Errorf("%s leg carries %s = %q", role, h, got)
					}
				}
			}
		})
	}
}

// pipeline.forward_response_headers: the revision the prefill pod's answer carries goes on the
// decode leg; the client's own value reaches no leg.
func TestRevisionFollowsThePhases(t *testing.T) {
	s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", true, steps("prefill", "decode"))
	s.stack.Gateway.SetRevision(s.stack.Prefill[0].URL(), "rev-2")
	resp, b := s.post("/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"x"}],"max_tokens":2}`,
		map[string]string{"X-Llm-D-Disagg-Revision": "client-chosen"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTP %d %s", resp.StatusCode, b)
	}
	legs := s.stack.Gateway.SettledLegs(context.Background(), resp.Header.Get("X-Request-Id"))
	got := map[string]string{}
	for _, l := range legs {
		got[l.Profile] = l.Revision
	}
	if len(legs) != 2 || got["prefill"] != "" || got["decode"] != "rev-2" {
		t.Fatalf("revisions by leg %v (%d legs): want none on prefill (the client's dropped), rev-2 on decode", got, len(legs))
	}
}

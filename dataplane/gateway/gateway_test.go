package gateway

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/dataplane/config"
	"github.com/epd-dev/coordinator/dataplane/observe"
	"github.com/epd-dev/coordinator/dataplane/upstream"
)

func TestLegHeaders(t *testing.T) {
	seen := make(chan http.Header, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		_, _ = io.WriteString(w, "{}")
	}))
	defer srv.Close()
	c, err := New(config.Gateway{Address: srv.URL, Timeout: config.Duration(5 * time.Second)}, observe.Telemetry{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	client := http.Header{"Epp-Profile": {"decode"}, "X-Llm-D-Epp-Profile": {"decode"}, "Prefer": {"if-available"}, "Authorization": {"Bearer k"}}
	tests := map[string]struct {
		leg     Leg
		profile string
		prefer  string
	}{
		"prefill":            {leg: Leg{Profile: ProfilePrefill}, profile: "prefill"},
		"conditional decode": {leg: Leg{Profile: ProfileDecode, Prefer: PreferIfAvailable}, profile: "decode", prefer: "if-available"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.leg.Request = upstream.Request{Path: "/v1/chat/completions", Header: Forwarded(client), RequestID: "rid",
				Body: strings.NewReader("{}"), Size: 2}
			if _, err := c.Call(context.Background(), tc.leg); err != nil {
				t.Fatal(err)
			}
			h := <-seen
			if h.Get(ProfileHeader) != tc.profile || h.Get(PreferHeader) != tc.prefer || h.Get(ProfileHeaderNew) != "" ||
				h.Get("Authorization") != "Bearer k" || h.Get(upstream.RequestIDHeader) != "rid" {
				t.Fatalf("headers %v", h)
			}
		})
	}
}

func TestNewNeedsAnAddress(t *testing.T) {
	for _, addr := range []string{"", "gateway:80", "ftp://gateway"} {
		if _, err := New(config.Gateway{Address: addr}, observe.Telemetry{}); err == nil {
			t.Errorf("New(%q) succeeded", addr)
		}
	}
}

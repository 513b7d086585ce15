package server_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
)

// rawResponse is a response read off a raw connection.
type rawResponse struct {
	*http.Response
	body []byte
}

// exchange writes raw on a fresh connection to addr and reads the responses until the server
// closes the connection; closed reports that it did (rather than idling for a second).
func exchange(t *testing.T, addr, raw string) (resps []rawResponse, closed bool) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	for {
		_ = conn.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := r.Peek(1); err != nil {
			var ne net.Error
			return resps, !(errors.As(err, &ne) && ne.Timeout())
		}
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatalf("after %d responses: %v", len(resps), err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		resps = append(resps, rawResponse{resp, b})
	}
}

// TestPathsStayInV1: the path is routed and forwarded in its canonical form, and one that climbs
// out of /v1/ (however it is spelt) or is encoded twice is refused without reaching the gateway.
func TestPathsStayInV1(t *testing.T) {
	h := start(t, jsonAnswer, nil)
	tests := map[string]struct {
		method, target string
		status         int
		forwarded      string // the leg's request URI, "" when nothing may be forwarded
	}{
		"dot segments":            {target: "/v1/../healthz", status: 404},
		"to the root":             {target: "/v1/..", status: 404},
		"encoded dots":            {target: "/v1/%2e%2e/healthz", status: 404},
		"mixed-case encoded dots": {target: "/v1/%2E%2e/%2e%2E/metrics", status: 404},
		"encoded slashes":         {target: "/v1/models/..%2f..%2fhealthz", status: 404},
		"encoded backslashes":     {target: "/v1/models/..%5c..%5creadyz", status: 404},
		"backslashes":             {target: `/v1/..\..\healthz`, status: 404},
		"double-encoded dots":     {target: "/v1/%252e%252e/healthz", status: 400},
		"encoded NUL":             {target: "/v1/models%00", status: 400},
		"merged slashes":          {target: "/v1//models?x=1", status: 200, forwarded: "/v1/models?x=1"},
		"dot segment inside /v1":  {target: "/v1/./files/../models", status: 200, forwarded: "/v1/models"},
		"into /v1 from outside":   {target: "/x/../v1/models", status: 200, forwarded: "/v1/models"},
		"backslash inside /v1":    {target: `/v1\models`, status: 200, forwarded: "/v1/models"},
		"trailing slash kept":     {target: "/v1/models/", status: 200, forwarded: "/v1/models/"},
		"encoded slash decoded":   {target: "/v1/models/org%2Fname", status: 200, forwarded: "/v1/models/org/name"},
		"inference path, respelt": {method: "POST", target: "/v1/chat//completions", status: 200, forwarded: "/v1/chat/completions"},
		"debug not on this port":  {target: "/debug/pipeline", status: 404},
		"no such route":           {target: "/admin", status: 404},
		"the probes, respelt":     {target: "//healthz", status: 200},
		"HEAD on a probe":         {method: "HEAD", target: "/readyz", status: 200},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := h.up.count()
			method, body := tc.method, ""
			if method == "" {
				method = http.MethodGet
			}
			if method == http.MethodPost {
				body = `{"messages":[]}`
			}
			resps, _ := exchange(t, h.addr, method+" "+tc.target+" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"+
				"Content-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
			if len(resps) != 1 || resps[0].StatusCode != tc.status {
				t.Fatalf("%d responses, first %+v, want one HTTP %d", len(resps), resps, tc.status)
			}
			if tc.status >= 400 {
				decodeError(t, resps[0].Response, resps[0].body)
			}
			switch {
			case tc.forwarded == "" && h.up.count() != before:
				leg, _ := h.up.last(t)
				t.Fatalf("forwarded to the gateway as %s", leg.URL.RequestURI())
			case tc.forwarded != "":
				leg, _ := h.up.last(t)
				if leg.URL.RequestURI() != tc.forwarded || leg.Header.Get("Epp-Profile") != gateway.ProfileDecode {
					t.Fatalf("forwarded as %s (%s), want %s", leg.URL.RequestURI(), leg.Header.Get("Epp-Profile"), tc.forwarded)
				}
			}
		})
	}
}

// TestMethods: an inference path takes POST only, other /v1 paths the methods of the OpenAI API
// (and HEAD); anything else is a JSON 405 naming the allowed methods, never forwarded.
func TestMethods(t *testing.T) {
	h := start(t, jsonAnswer, nil)
	tests := map[string]struct {
		method, path string
		status       int
		allow        string
	}{
		"GET on chat":         {method: "GET", path: "/v1/chat/completions", status: 405, allow: "POST"},
		"DELETE on generate":  {method: "DELETE", path: "/inference/v1/generate", status: 405, allow: "POST"},
		"BREW on completions": {method: "BREW", path: "/v1/completions", status: 405, allow: "POST"},
		"TRACE":               {method: "TRACE", path: "/v1/models", status: 405, allow: "GET, HEAD, POST, DELETE"},
		"PROPFIND":            {method: "PROPFIND", path: "/v1/files", status: 405, allow: "GET, HEAD, POST, DELETE"},
		"BREW":                {method: "BREW", path: "/v1/models", status: 405, allow: "GET, HEAD, POST, DELETE"},
		"PUT":                 {method: "PUT", path: "/v1/models", status: 405, allow: "GET, HEAD, POST, DELETE"},
		"PATCH":               {method: "PATCH", path: "/v1/models", status: 405, allow: "GET, HEAD, POST, DELETE"},
		"OPTIONS":             {method: "OPTIONS", path: "/v1/models", status: 405, allow: "GET, HEAD, POST, DELETE"},
		"GET":                 {method: "GET", path: "/v1/models", status: 200},
		"HEAD":                {method: "HEAD", path: "/v1/models", status: 200},
		"POST":                {method: "POST", path: "/v1/embeddings", status: 200},
		"DELETE":              {method: "DELETE", path: "/v1/files/f-1", status: 200},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := h.up.count()
			resp, b := do(t, tc.method, h.url+tc.path, "", nil)
			if resp.StatusCode != tc.status {
				t.Fatalf("HTTP %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if tc.status == 405 {
				decodeError(t, resp, b)
				if got := resp.Header.Get("Allow"); got != tc.allow {
					t.Fatalf("Allow %q, want %q", got, tc.allow)
				}
				if h.up.count() != before {
					t.Fatal("forwarded to the gateway")
				}
				return
			}
			if leg, _ := h.up.last(t); leg.Method != tc.method {
				t.Fatalf("forwarded as %s", leg.Method)
			}
		})
	}
}

// TestRoutingHeaders: the client's endpoint-pinning and scheduling headers reach no leg unless
// server.trusted_routing_headers, and the async broker still labels its passthrough requests.
func TestRoutingHeaders(t *testing.T) {
	client := map[string]string{"Authorization": "Bearer k", "EPP-Profile": "prefill", "X-Llm-D-Epp-Profile": "prefill", "Prefer": "if-available"}
	for _, name := range gateway.RoutingHeaders {
		client[name] = "client-value"
	}
	broker := config.Step{Type: "async-broker", Params: map[string]any{
		"redis_url":  "redis://127.0.0.1:1/0", // passthrough mode without quotas never calls Redis
		"objectives": map[string]any{"default": map[string]any{"reserved": "interactive"}},
	}}
	tests := map[string]struct {
		trusted  bool
		steps    []config.Step
		mode     string
		path     string
		want     map[string]string // on the leg; a RoutingHeaders name not listed must be absent
		allRoute bool              // every RoutingHeaders value is the client's
	}{
		"inference, untrusted":   {path: "/v1/chat/completions"},
		"passthrough, untrusted": {path: "/v1/models"},
		"inference, trusted":     {trusted: true, path: "/v1/chat/completions", allRoute: true},
		"passthrough, trusted":   {trusted: true, path: "/v1/models", allRoute: true},
		"prefill and decode legs, untrusted": {path: "/v1/completions",
			steps: []config.Step{{Type: "prefill"}, {Type: "decode"}}},
		"async broker passthrough sets its own": {path: "/v1/chat/completions", mode: "passthrough",
			steps: []config.Step{broker, {Type: "decode"}},
			want:  map[string]string{"X-Gateway-Inference-Objective": "interactive", "X-Gateway-Inference-Fairness-Id": "default"}},
		"async broker without its mode header": {path: "/v1/chat/completions", steps: []config.Step{broker, {Type: "decode"}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := start(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"id":"x","choices":[],"kv_transfer_params":{"do_remote_prefill":true}}`)
			}, func(c *config.Config) {
				c.Server.TrustedRoutingHeaders = tc.trusted
				if tc.steps != nil {
					c.Pipeline.Steps = tc.steps
				}
			})
			hdr := map[string]string{}
			for k, v := range client {
				hdr[k] = v
			}
			if tc.mode != "" {
				hdr["X-AP-Mode"] = tc.mode
			}
			method, body := http.MethodPost, `{"model":"m","messages":[],"prompt":"p"}`
			if tc.path == "/v1/models" {
				method, body = http.MethodGet, ""
			}
			if resp, b := do(t, method, h.url+tc.path, body, hdr); resp.StatusCode != http.StatusOK {
				t.Fatalf("HTTP %d %s", resp.StatusCode, b)
			}
			h.up.mu.Lock()
			legs := append([]*http.Request(nil), h.up.legs...)
			h.up.mu.Unlock()
			for _, leg := range legs {
				for _, name := range gateway.RoutingHeaders {
					want := tc.want[name]
					if tc.allRoute {
						want = "client-value"
					}
					if got := leg.Header.Get(name); got != want {
						t.Errorf("%s leg: %s = %q, want %q", leg.Header.Get("Epp-Profile"), name, got, want)
					}
				}
				if leg.Header.Get("Authorization") != "Bearer k" || leg.Header.Values("X-Llm-D-Epp-Profile")[0] != leg.Header.Get("Epp-Profile") ||
					len(leg.Header.Values("X-Llm-D-Epp-Profile")) != 1 || leg.Header.Get("Prefer") != "" {
					t.Errorf("leg headers %v", leg.Header)
				}
			}
		})
	}
}

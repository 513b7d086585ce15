//go:build linux

package hostile

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/test/harness/stack"
)

// picker stands between the coordinator and the gateway double as an endpoint picker that names
// addresses no pod has: it answers every conditional decode (Prefer: if-available) 412 with hint,
// and, when reserve is set, every reservation (Prefer: reserve-endpoint) 204 naming reserve. It
// proxies the rest to the gateway double and records every request the coordinator sent.
type picker struct {
	url           string
	hint, reserve string
	mu            sync.Mutex
	legs          []recordedLeg
}

func startPicker(t *testing.T, gateway, hint, reserve string) *picker {
	t.Helper()
	target, err := url.Parse(gateway)
	if err != nil {
		t.Fatal(err)
	}
	p := &picker{hint: hint, reserve: reserve}
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		p.mu.Lock()
		p.legs = append(p.legs, recordedLeg{method: r.Method, uri: r.RequestURI, header: r.Header.Clone(), body: body})
		p.mu.Unlock()
		prefer := strings.ToLower(r.Header.Get("Prefer"))
		switch {
		case strings.Contains(prefer, "if-available"):
			w.Header().Set("X-Prefill-Host-Port", p.hint)
			w.Header().Set("X-Encode-Host-Port", p.hint)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusPreconditionFailed)
			_, _ = io.WriteString(w, `{"error":{"message":"decode needs a prefill","type":"precondition_failed"}}`)
		case strings.Contains(prefer, "reserve-endpoint") && p.reserve != "":
			w.Header().Set("X-Llm-D-Reserved-Host-Port", p.reserve)
			w.WriteHeader(http.StatusNoContent)
		default:
			r.Body = io.NopCloser(bytes.NewReader(body))
			proxy.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}

// taken returns the legs recorded so far and forgets them.
func (p *picker) taken() []recordedLeg {
	p.mu.Lock()
	defer p.mu.Unlock()
	legs := p.legs
	p.legs = nil
	return legs
}

// profileOf names a recorded leg: its EPP profile, or "reserve" for a reservation.
func profileOf(l recordedLeg) string {
	if strings.Contains(strings.ToLower(l.header.Get("Prefer")), "reserve-endpoint") {
		return "reserve"
	}
	return l.header.Get("X-Llm-D-Epp-Profile")
}

// The metadata service and loopback are no pod's endpoints: a picker (or a worker answering the
// conditional decode) that names them in a 412's hints or a reservation does not get a leg
// pinned there, nor a decode worker sent there for the KV (SGLang's bootstrap_host).
func TestPickerAddresses(t *testing.T) {
	hint := metadata + ":8000, [::ffff:127.0.0.1]:8000, [fe80::1]:8000, 127.0.0.1:8000"

	t.Run("412 hints do not pin the prefill leg", func(t *testing.T) {
		st := startStack(t)
		p := startPicker(t, st.Gateway.URL(), hint, "")
		co := startCoordinator(t, p.url, config{
			pipeline: "kv_connector: kv-nixl, ec_connector: ec-nixl",
			steps:    "{type: conditional-decode, params: {hints: true}}, {type: prefill}, {type: decode}",
		})
		r := do(t, http.MethodPost, co.url+"/v1/chat/completions", chat("sim-model"), nil)
		if r.status != http.StatusOK || !strings.Contains(string(r.body), `"content":"hello hello hello hello"`) {
			t.Fatalf("HTTP %d: %s", r.status, r.body)
		}
		var got []string
		for _, l := range p.taken() {
			got = append(got, profileOf(l))
			if pin := l.header.Get("X-Llm-D-Pin-Host-Port"); pin != "" {
				t.Errorf("%s leg pinned to %s", profileOf(l), pin)
			}
		}
		if strings.Join(got, ",") != "decode,prefill,decode" {
			t.Fatalf("legs %v", got)
		}
	})

	t.Run("a link-local reservation fails the request", func(t *testing.T) {
		st := startStack(t)
		p := startPicker(t, st.Gateway.URL(), hint, metadata+":8000")
		co := startCoordinator(t, p.url, config{pipeline: "kv_connector: kv-sglang", steps: "{type: prefill-decode}"})
		r := do(t, http.MethodPost, co.url+"/v1/chat/completions", chat("sim-model"), nil)
		if r.status != http.StatusBadGateway {
			t.Fatalf("HTTP %d, want 502: %s", r.status, r.body)
		}
		e := r.jsonError(t)
		if !strings.HasPrefix(e.Error.Message, "reserve failed: HTTP 204 (request_id: ") || e.Error.Type != "api_error" || string(e.Error.Code) != `"upstream_error"` {
			t.Errorf("error %+v", e.Error)
		}
		if strings.Contains(string(r.body), metadata) {
			t.Errorf("the client is told the address: %s", r.body)
		}
		// One reservation, nothing else: no prefill pinned there, no decode told to join it.
		if legs := p.taken(); len(legs) != 1 || profileOf(legs[0]) != "reserve" {
			t.Fatalf("%d legs: %v", len(legs), legs)
		}
		// The request's error is logged once its answer is written: the client may read the answer
		// first.
		want := "names " + metadata + ":8000 in x-llm-d-reserved-host-port, a link-local address"
		for deadline := time.Now().Add(5 * time.Second); !strings.Contains(co.logs.String(), want); {
			if time.Now().After(deadline) {
				t.Fatalf("the log does not say %q:\n%s", want, co.logs.Tail(2000))
			}
			time.Sleep(10 * time.Millisecond) // polling another process's log: there is no event to wait on
		}
	})

	// The finding itself: with prefill-decode, the 412's prefill hint was the decode leg's
	// bootstrap_host. Now the hint is dropped and the pair reserves; the reservation names a
	// worker's loopback address, which gateway.allowed_hint_networks admits (so does the binary).
	t.Run("a hinted prefill-decode pair does not use the hint", func(t *testing.T) {
		st, err := stack.Start(stack.Options{KVConnector: "kv-sglang"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		p := startPicker(t, st.Gateway.URL(), metadata+":8000", "")
		co := startCoordinator(t, p.url, config{
			gateway:  "allowed_hint_networks: [" + stack.HintNetworks + "]",
			pipeline: "kv_connector: kv-sglang",
			steps:    "{type: conditional-decode, params: {hints: true}}, {type: prefill-decode}",
			env:      []string{"SGLANG_BOOTSTRAP_PORT=" + strconv.Itoa(st.BootstrapPort)},
		})
		r := do(t, http.MethodPost, co.url+"/v1/chat/completions", chat("sim-model"), nil)
		if r.status != http.StatusOK || !strings.Contains(string(r.body), `"content":"hello hello hello hello"`) {
			t.Fatalf("HTTP %d: %s", r.status, r.body)
		}
		legs := p.taken()
		var got []string
		for _, l := range legs {
			got = append(got, profileOf(l))
		}
		if len(got) != 4 || got[0] != "decode" || got[1] != "reserve" {
			t.Fatalf("legs %v, want the 412, a reservation, then the pair", got)
		}
		for _, l := range legs[2:] { // the pair: pinned to the reserved worker, bootstrapping there
			var body struct {
				BootstrapHost string `json:"bootstrap_host"`
			}
			if err := json.Unmarshal(l.body, &body); err != nil {
				t.Fatal(err)
			}
			pin := l.header.Get("X-Llm-D-Pin-Host-Port")
			if !strings.HasPrefix(body.BootstrapHost, "127.") || profileOf(l) == "prefill" && !strings.HasPrefix(pin, body.BootstrapHost+":") ||
				profileOf(l) == "decode" && pin != "" {
				t.Errorf("%s leg pinned to %q with bootstrap_host %q", profileOf(l), pin, body.BootstrapHost)
			}
		}
	})
}

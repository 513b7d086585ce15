package steps

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
)

// sglangGateway stands in for a gateway in front of SGLang workers: a reservation is answered
// with endpoint (reserve decides, when set), and a prefill and its decode only answer once both
// arrived (prefill and decode decide how), as SGLang's bootstrap rendezvous does; a leg whose
// peer never comes fails after wait. Legs are counted by profile.
type sglangGateway struct {
	*fakeGateway
	reserve func(w http.ResponseWriter) bool // true: answered
	prefill func(w http.ResponseWriter, c captured, r *http.Request)
	decode  func(w http.ResponseWriter, c captured, r *http.Request)

	mu    sync.Mutex
	rooms map[any]chan struct{} // closed when the second leg of a room arrives
	legs  map[string]int
	// cancelled counts legs whose request context ended before they answered.
	cancelled   atomic.Int32
	prefillDone chan struct{}
}

const reservedEndpointValue = "10.0.0.7:8000"

func newSGLangGateway(t *testing.T) *sglangGateway {
	g := &sglangGateway{rooms: map[any]chan struct{}{}, legs: map[string]int{}}
	g.prefill = func(w http.ResponseWriter, c captured, r *http.Request) {
		if g.meet(w, c, r) {
			okJSON(`{"choices":[{"text":"x"}],"kv_transfer_params":null}`)(w, c)
		}
	}
	g.decode = func(w http.ResponseWriter, c captured, r *http.Request) {
		if g.meet(w, c, r) {
			streamWords(w, []string{"a", "b", "c"}, 0, 0)
		}
	}
	g.fakeGateway = newFakeGatewayReq(t, func(w http.ResponseWriter, c captured, r *http.Request) {
		profile := c.Header.Get(gateway.ProfileHeaderNew)
		if strings.Contains(c.Header.Get("Prefer"), gateway.PreferReserveEndpoint) {
			profile = "reserve"
		}
		g.mu.Lock()
		g.legs[profile]++
		g.mu.Unlock()
		switch profile {
		case "reserve":
			if g.reserve == nil || !g.reserve(w) {
				w.Header().Set(gateway.ReservedHeader, reservedEndpointValue)
				w.WriteHeader(http.StatusNoContent)
			}
		case gateway.ProfilePrefill:
			g.prefill(w, c, r)
		case gateway.ProfileDecode:
			g.decode(w, c, r)
		}
	})
	return g
}

// meet waits for the other leg of c's bootstrap room; false when it did not come (answered 500)
// or the leg was cancelled.
func (g *sglangGateway) meet(w http.ResponseWriter, c captured, r *http.Request) bool {
	room := c.Body["bootstrap_room"]
	g.mu.Lock()
	ch, ok := g.rooms[room]
	if ok {
		close(ch)
		delete(g.rooms, room)
	} else {
		ch = make(chan struct{})
		g.rooms[room] = ch
	}
	g.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-r.Context().Done():
		g.cancelled.Add(1)
		return false
	case <-time.After(10 * time.Second):
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"error":{"message":"bootstrap timed out"}}`)
		return false
	}
}

func (g *sglangGateway) count(profile string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.legs[profile]
}

var sglangParams = map[string]any{"kv_connector": "kv-sglang"}

func TestPrefillDecodeSendsBothTogether(t *testing.T) {
	for _, stream := range []bool{true, false} {
		g := newSGLangGateway(t)
		if !stream {
			g.decode = func(w http.ResponseWriter, c captured, r *http.Request) {
				if g.meet(w, c, r) {
					okJSON(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"a b c"},"finish_reason":"length"}]}`)(w, c)
				}
			}
		}
		s := newStep(t, PrefillDecodeStep, g.fakeGateway, sglangParams)
		rc, rec := newRC(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"routed_dp_rank":1,"stream":`+
			map[bool]string{true: "true", false: "false"}[stream]+`}`, http.Header{"Prefer": {"reserve-endpoint"}, gateway.PinHeader: {"10.9.9.9:1"}})
		if err := s.Execute(context.Background(), rc); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(rec.Body.String(), "a") {
			t.Fatalf("client got %q", rec.Body.String())
		}
		reqs := g.requests()
		if len(reqs) != 3 {
			t.Fatalf("%d legs, want reserve, prefill, decode", len(reqs))
		}
		var reserve, pre, dec captured
		for _, r := range reqs {
			switch {
			case r.Header.Get("Prefer") != "":
				reserve = r
			case r.Header.Get(gateway.ProfileHeaderNew) == gateway.ProfilePrefill:
				pre = r
			default:
				dec = r
			}
		}
		// The reservation: the prefill body with the preference, nothing of SGLang's yet, and
		// none of the client's routing headers.
		if reserve.Header.Get("Prefer") != "reserve-endpoint" || reserve.Header.Get(gateway.ProfileHeaderNew) != "prefill" ||
			reserve.Header.Get(gateway.PinHeader) != "" || reserve.Body["bootstrap_room"] != nil || reserve.Body["max_tokens"] != 1.0 {
			t.Fatalf("reservation %v %s", reserve.Header, reserve.Raw)
		}
		if pre.Header.Get(gateway.PinHeader) != reservedEndpointValue || pre.Header.Get("Prefer") != "" || pre.Body["max_tokens"] != 1.0 || pre.Body["stream"] != false {
			t.Fatalf("prefill %v %s", pre.Header, pre.Raw)
		}
		for name, leg := range map[string]captured{"prefill": pre, "decode": dec} {
			if leg.Body["bootstrap_host"] != "10.0.0.7" || leg.Body["bootstrap_port"] != 8998.0 || leg.Body["bootstrap_room"] == nil ||
				leg.Body["kv_transfer_params"] != nil || leg.Body["routed_dp_rank"] != nil {
				t.Fatalf("%s leg %s", name, leg.Raw)
			}
		}
		if pre.Body["bootstrap_room"] != dec.Body["bootstrap_room"] || dec.Body["max_tokens"] != 3.0 || dec.Body["stream"] != stream ||
			dec.Header.Get(gateway.PinHeader) != "" {
			t.Fatalf("decode leg %s", dec.Raw)
		}
	}
}

// Every way a reservation fails ends the request before a prefill or decode is sent; unserved
// answers (503) are retried first.
func TestPrefillDecodeReservationFailures(t *testing.T) {
	tests := map[string]struct {
		status int
		header string
		want   int    // client status
		msg    string // in the error's message, "" to skip
		tries  int
	}{
		"500":                 {status: 500, want: 502, msg: "reserve failed", tries: 1},
		"503 retried":         {status: 503, want: 503, tries: 3},
		"412 with an address": {status: 412, header: "10.0.0.7:8000", want: 412, tries: 1},
		"204 without header":  {status: 204, want: 502, msg: "has no X-Llm-D-Reserved-Host-Port header", tries: 1},
		"204 without port":    {status: 204, header: "10.0.0.7", want: 502, msg: `names "10.0.0.7"`, tries: 1},
		"204 host name":       {status: 204, header: "prefill-0:8000", want: 502, msg: "not an ip:port", tries: 1},
		"204 port 0":          {status: 204, header: "10.0.0.7:0", want: 502, msg: "not an ip:port", tries: 1},
		"204 unspecified":     {status: 204, header: "0.0.0.0:8000", want: 502, msg: "names 0.0.0.0:8000 in x-llm-d-reserved-host-port, an unspecified address", tries: 1},
		"204 ipv6 zone":       {status: 204, header: "[fe80::1%eth0]:8000", want: 502, msg: "not an ip:port", tries: 1},
		"204 header too long": {status: 204, header: strings.Repeat("1", 100) + ":80", want: 502, msg: "of 103 bytes", tries: 1},
	}
	// An address no pod has: the prefill leg would be pinned there and the decode worker sent
	// there for the KV (bootstrap_host), so the request fails instead.
	for name, tc := range map[string]struct{ header, msg string }{
		"metadata service": {"169.254.169.254:8000", "names 169.254.169.254:8000 in x-llm-d-reserved-host-port, a link-local address"},
		"loopback":         {"127.0.0.1:8000", "names 127.0.0.1:8000 in x-llm-d-reserved-host-port, a loopback address"},
		"loopback v6":      {"[::1]:8000", "names [::1]:8000 in x-llm-d-reserved-host-port, a loopback address"},
		"mapped loopback":  {"[::ffff:127.0.0.1]:8000", "names [::ffff:127.0.0.1]:8000 in x-llm-d-reserved-host-port, a loopback address (IPv4-mapped 127.0.0.1)"},
		"link-local v6":    {"[fe80::1]:8000", "a link-local address"},
		"multicast":        {"224.0.0.1:8000", "a link-local multicast address"},
	} {
		tests["204 "+name] = struct {
			status int
			header string
			want   int
			msg    string
			tries  int
		}{status: 204, header: tc.header, want: 502, msg: tc.msg, tries: 1}
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := newSGLangGateway(t)
			g.reserve = func(w http.ResponseWriter) bool {
				if tc.header != "" {
					w.Header().Set(gateway.ReservedHeader, tc.header)
				}
				w.WriteHeader(tc.status)
				return true
			}
			s := newStep(t, PrefillDecodeStep, g.fakeGateway, sglangParams)
			rc, _ := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true}`, nil)
			err := s.Execute(context.Background(), rc)
			e := apierror.From(err)
			if e.Status != tc.want || !strings.Contains(e.Message+err.Error(), tc.msg) {
				t.Fatalf("err = %v (%d %q), want %d %q", err, e.Status, e.Message, tc.want, tc.msg)
			}
			if g.count("reserve") != tc.tries || g.count("prefill") != 0 || g.count("decode") != 0 {
				t.Fatalf("legs %v", g.legs)
			}
		})
	}
}

// gateway.allowed_hint_networks admits a loopback reservation (workers on 127.0.0.1 in tests),
// not a link-local one outside it; the legacy 200's header is judged the same way.
func TestPrefillDecodeAllowedHintNetworks(t *testing.T) {
	for _, tc := range []struct {
		status  int
		header  string
		allowed []string
		err     string // "" when served
		pin     string // the prefill leg's pin when served (its IP is the bootstrap_host)
	}{
		{status: 204, header: "127.0.0.1:8000", allowed: []string{"127.0.0.0/8"}, pin: "127.0.0.1:8000"},
		{status: 204, header: "[::ffff:127.0.0.1]:8000", allowed: []string{"127.0.0.0/8"}, pin: "127.0.0.1:8000"},
		{status: 204, header: "169.254.169.254:8000", allowed: []string{"127.0.0.0/8"}, err: "a link-local address"},
		{status: 204, header: "169.254.169.254:8000", allowed: []string{"169.254.0.0/16"}, pin: "169.254.169.254:8000"},
		{status: 200, header: "127.0.0.1:8000", err: "names 127.0.0.1:8000 in x-prefill-host-port, a loopback address"},
		{status: 200, header: "127.0.0.1:8000", allowed: []string{"127.0.0.0/8"}, pin: "127.0.0.1:8000"},
	} {
		g := newSGLangGateway(t)
		g.tune = func(c *config.Gateway) { c.AllowedHintNetworks = tc.allowed }
		g.reserve = func(w http.ResponseWriter) bool {
			name := gateway.ReservedHeader
			if tc.status == http.StatusOK {
				name = gateway.LegacyReservedHeader
			}
			w.Header().Set(name, tc.header)
			w.WriteHeader(tc.status)
			return true
		}
		s := newStep(t, PrefillDecodeStep, g.fakeGateway, sglangParams)
		rc, rec := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true}`, nil)
		err := s.Execute(context.Background(), rc)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || apierror.From(err).Status != http.StatusBadGateway || g.count("prefill") != 0 {
				t.Fatalf("%d %s with %v: %v, want %q; legs %v", tc.status, tc.header, tc.allowed, err, tc.err, g.legs)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%d %s with %v: %v", tc.status, tc.header, tc.allowed, err)
		}
		if text, _ := contentOf(t, rec.Body.String()); text != "a b c" {
			t.Fatalf("client got %q", rec.Body.String())
		}
		host, _, _ := strings.Cut(tc.pin, ":")
		for _, r := range g.requests() {
			if r.Header.Get("Prefer") == "" && (r.Header.Get(gateway.ProfileHeaderNew) == "prefill" && r.Header.Get(gateway.PinHeader) != tc.pin ||
				r.Body["bootstrap_host"] != host) {
				t.Fatalf("%s: leg %v %s", tc.header, r.Header, r.Raw)
			}
		}
	}
}

// The first reserve-endpoint plugin answered 200 with x-prefill-host-port.
func TestPrefillDecodeLegacyReservation(t *testing.T) {
	g := newSGLangGateway(t)
	g.reserve = func(w http.ResponseWriter) bool {
		w.Header().Set(gateway.LegacyReservedHeader, "[fd00::7]:8000")
		w.WriteHeader(http.StatusOK)
		return true
	}
	s := newStep(t, PrefillDecodeStep, g.fakeGateway, sglangParams)
	rc, rec := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true}`, nil)
	if err := s.Execute(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	if text, _ := contentOf(t, rec.Body.String()); text != "a b c" {
		t.Fatalf("client got %q", rec.Body.String())
	}
	for _, r := range g.requests() {
		if r.Header.Get(gateway.ProfileHeaderNew) == "prefill" && r.Header.Get("Prefer") == "" &&
			(r.Header.Get(gateway.PinHeader) != "[fd00::7]:8000" || r.Body["bootstrap_host"] != "fd00::7") {
			t.Fatalf("prefill %v %s", r.Header, r.Raw)
		}
	}
}

// A prefill that fails ends its decode at once (which would otherwise wait for the KV) and the
// client gets the prefill's error; a decode that fails ends its prefill (which would wait for
// the decode), and the client gets the decode's.
func TestPrefillDecodeCancelsTheOtherLeg(t *testing.T) {
	tests := map[string]struct {
		failPrefill bool
		status      int
		want        int
		msg         string
		pairs       int
	}{
		"prefill refuses":          {failPrefill: true, status: 400, want: 400, msg: "leg failed on purpose", pairs: 1},
		"prefill fails":            {failPrefill: true, status: 500, want: 502, msg: "prefill failed", pairs: 1},
		"prefill pin rejected 503": {failPrefill: true, status: 503, want: 503, msg: "prefill: no endpoint served the request", pairs: 3},
		"decode refuses":           {status: 400, want: 400, msg: "leg failed on purpose", pairs: 1},
		"decode unavailable":       {status: 503, want: 503, msg: "decode: no endpoint served the request", pairs: 3},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := newSGLangGateway(t)
			fail := func(w http.ResponseWriter, c captured, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, `{"error":{"message":"leg failed on purpose","type":"x"}}`)
			}
			waitCancelled := func(w http.ResponseWriter, c captured, r *http.Request) {
				select {
				case <-r.Context().Done():
					g.cancelled.Add(1)
				case <-time.After(10 * time.Second):
					t.Errorf("%s leg was not cancelled", c.Header.Get(gateway.ProfileHeaderNew))
				}
			}
			if tc.failPrefill {
				g.prefill, g.decode = fail, waitCancelled
			} else {
				g.prefill, g.decode = waitCancelled, fail
			}
			s := newStep(t, PrefillDecodeStep, g.fakeGateway, sglangParams)
			rc, rec := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true}`, nil)
			err := s.Execute(context.Background(), rc)
			e := apierror.From(err)
			if e.Status != tc.want || !strings.Contains(e.Message, tc.msg) || rec.Body.Len() != 0 {
				t.Fatalf("err = %v (%d %q), body %q", err, e.Status, e.Message, rec.Body.String())
			}
			g.srv.Close() // waits for the legs' handlers: a cancelled one has seen it
			failing, waiting := "decode", "prefill"
			if tc.failPrefill {
				failing, waiting = waiting, failing
			}
			// The waiting leg of a pair may not even have reached the gateway when its peer failed.
			if g.count("reserve") != tc.pairs || g.count(failing) != tc.pairs || g.count(waiting) > tc.pairs {
				t.Fatalf("legs %v, want %d pairs", g.legs, tc.pairs)
			}
			if int(g.cancelled.Load()) != g.count(waiting) {
				t.Fatalf("%d of %d %s legs cancelled", g.cancelled.Load(), g.count(waiting), waiting)
			}
		})
	}
}

// Once decode has streamed, the KV has arrived: the prefill's answer failing then changes
// nothing for the client.
func TestPrefillDecodePrefillFailsAfterDecodeStarted(t *testing.T) {
	g := newSGLangGateway(t)
	relayed := make(chan struct{}) // the client got decode's first event
	g.decode = func(w http.ResponseWriter, c captured, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"a"},"finish_reason":null}]}`+"\n\n")
		w.(http.Flusher).Flush()
		<-g.prefillDone
		_, _ = io.WriteString(w, `data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" b"},"finish_reason":"length"}]}`+"\n\ndata: [DONE]\n\n")
	}
	g.prefillDone = make(chan struct{})
	g.prefill = func(w http.ResponseWriter, c captured, r *http.Request) {
		defer close(g.prefillDone)
		<-relayed // the coordinator read decode's first event: now the prefill breaks
		conn, _, _ := http.NewResponseController(w).Hijack()
		_ = conn.Close()
	}
	s := newStep(t, PrefillDecodeStep, g.fakeGateway, sglangParams)
	rc, rec := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true}`, nil)
	rc.Writer = &firstWrite{ResponseWriter: rec, done: relayed}
	if err := s.Execute(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	if text, done := contentOf(t, rec.Body.String()); text != "a b" || done != 1 || g.count("reserve") != 1 {
		t.Fatalf("client got %q (%d [DONE]), %d reservations", text, done, g.count("reserve"))
	}
}

// A stream whose decode dies is continued by a new pair: a reservation, a prefill of the
// continuation and its decode.
func TestPrefillDecodeResumesWithANewPair(t *testing.T) {
	g := newSGLangGateway(t)
	words := strings.Fields("one two three four five")
	var decodes atomic.Int32
	g.decode = func(w http.ResponseWriter, c captured, r *http.Request) {
		if !g.meet(w, c, r) {
			return
		}
		if decodes.Add(1) == 1 {
			streamWords(w, words, 0, 2)
			return
		}
		msgs := c.Body["messages"].([]any)
		if last := msgs[len(msgs)-1].(map[string]any); last["content"] != "one two" || c.Body["bootstrap_room"] == nil {
			t.Errorf("continuation %s", c.Raw)
		}
		streamWords(w, words, 2, 0)
	}
	var prefills atomic.Int32
	inner := g.prefill
	g.prefill = func(w http.ResponseWriter, c captured, r *http.Request) {
		if prefills.Add(1) == 2 {
			// The continuation's prefill computes the longer prompt, the one its decode continues.
			msgs := c.Body["messages"].([]any)
			if last := msgs[len(msgs)-1].(map[string]any); last["content"] != "one two" || c.Body["continue_final_message"] != true ||
				c.Body["max_tokens"] != 1.0 || c.Body["stream"] != false {
				t.Errorf("continuation prefill %s", c.Raw)
			}
		}
		inner(w, c, r)
	}
	s := newStep(t, PrefillDecodeStep, g.fakeGateway, sglangParams)
	rc, rec := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":5}`, nil)
	if err := s.Execute(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	if text, done := contentOf(t, rec.Body.String()); text != strings.Join(words, " ") || done != 1 {
		t.Fatalf("client got %q (%d [DONE])", text, done)
	}
	if g.count("reserve") != 2 || g.count("prefill") != 2 || g.count("decode") != 2 {
		t.Fatalf("legs %v", g.legs)
	}
}

func TestPrefillDecodeParams(t *testing.T) {
	tests := map[string]struct {
		typ  string
		own  map[string]any
		want string
	}{
		"prefill-decode with kv-nixl": {typ: PrefillDecodeStep, own: map[string]any{"kv_connector": "kv-nixl"},
			want: `params.kv_connector: the prefill-decode step runs SGLang's transfer and needs kv-sglang, got "kv-nixl"`},
		"prefill-decode inherits shared storage": {typ: PrefillDecodeStep, own: nil, want: `needs kv-sglang, got "kv-shared-storage"`},
		"prefill with kv-sglang": {typ: PrefillStep, own: map[string]any{"kv_connector": "kv-sglang"},
			want: "params.kv_connector: kv-sglang needs prefill and decode in flight together: use the prefill-decode step in place of prefill and decode"},
		"prefill-decode with kv-sglang": {typ: PrefillDecodeStep, own: map[string]any{"kv_connector": "kv-sglang", "max_resumes": 1}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := buildErr(t, tc.typ, tc.own)
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// firstWrite closes done on the first write to the client.
type firstWrite struct {
	http.ResponseWriter
	done chan struct{}
	once sync.Once
}

func (w *firstWrite) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	w.once.Do(func() { close(w.done) })
	return n, err
}

func (w *firstWrite) Flush() { w.ResponseWriter.(http.Flusher).Flush() }

// A pair whose legs both hang (a prefill waiting for a transfer that never starts, a decode that
// sent its headers and waits for the KV) costs gateway.idle_timeout per attempt: the client gets
// a 502 saying so once the retries are spent, and no leg is left behind.
func TestPrefillDecodeBothHang(t *testing.T) {
	g := newSGLangGateway(t)
	hang := func(w http.ResponseWriter, c captured, r *http.Request) {
		if c.Header.Get(gateway.ProfileHeaderNew) == gateway.ProfileDecode {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
		}
		<-r.Context().Done()
		g.cancelled.Add(1)
	}
	g.prefill, g.decode = hang, hang
	g.tune = func(c *config.Gateway) { c.IdleTimeout = config.Duration(50 * time.Millisecond) }
	s := newStep(t, PrefillDecodeStep, g.fakeGateway, sglangParams)
	rc, rec := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true}`, nil)
	err := s.Execute(context.Background(), rc)
	if e := apierror.From(err); e.Status != http.StatusBadGateway || !strings.Contains(err.Error(), "idle timeout") || rec.Body.Len() != 0 {
		t.Fatalf("err = %v (%d), body %q", err, e.Status, rec.Body.String())
	}
	g.srv.Close() // waits for the legs' handlers
	if pairs := g.count("reserve"); pairs != 3 || g.count("decode") != 3 || int(g.cancelled.Load()) != g.count("prefill")+g.count("decode") {
		t.Fatalf("legs %v, %d cancelled", g.legs, g.cancelled.Load())
	}
}

// A continuation's pair that fails unserved (its reserved prefill pod died) is retried: the
// client still gets the whole answer.
func TestPrefillDecodeResumeRetriesThePair(t *testing.T) {
	g := newSGLangGateway(t)
	words := strings.Fields("one two three four")
	var prefills, decodes atomic.Int32
	inner := g.prefill
	g.prefill = func(w http.ResponseWriter, c captured, r *http.Request) {
		if prefills.Add(1) == 2 {
			w.WriteHeader(http.StatusServiceUnavailable) // the pin finds the pod gone
			return
		}
		inner(w, c, r)
	}
	g.decode = func(w http.ResponseWriter, c captured, r *http.Request) {
		if !g.meet(w, c, r) {
			return
		}
		if decodes.Add(1) == 1 {
			streamWords(w, words, 0, 2)
			return
		}
		streamWords(w, words, 2, 0)
	}
	s := newStep(t, PrefillDecodeStep, g.fakeGateway, sglangParams)
	rc, rec := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":4}`, nil)
	if err := s.Execute(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	if text, done := contentOf(t, rec.Body.String()); text != strings.Join(words, " ") || done != 1 {
		t.Fatalf("client got %q (%d [DONE])", text, done)
	}
	if g.count("reserve") != 3 || g.count("prefill") != 3 {
		t.Fatalf("legs %v", g.legs)
	}
}

// A prefill whose answer comes after decode's (the two race) never holds the client's answer
// back: it is written first, and the prefill gets its grace afterwards.
func TestPrefillDecodeLatePrefillDoesNotDelayTheAnswer(t *testing.T) {
	g := newSGLangGateway(t)
	written := make(chan struct{})
	g.prefill = func(w http.ResponseWriter, c captured, r *http.Request) {
		select {
		case <-written:
		case <-time.After(time.Second):
			t.Error("the client's answer waited for the prefill's")
		}
		okJSON(`{"choices":[{"text":"x"}]}`)(w, c)
	}
	g.decode = func(w http.ResponseWriter, c captured, r *http.Request) {
		okJSON(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"stop"}]}`)(w, c)
	}
	s := newStep(t, PrefillDecodeStep, g.fakeGateway, sglangParams)
	rc, rec := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, nil)
	rc.Writer = &firstWrite{ResponseWriter: rec, done: written}
	if err := s.Execute(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rec.Body.String(), `"content":"a"`) || g.cancelled.Load() != 0 {
		t.Fatalf("client got %q; %d legs cancelled", rec.Body.String(), g.cancelled.Load())
	}
}

// TestPrefillDecodeWithoutTheReservePlugin: a picker without llm-d's reserve-endpoint plugin
// schedules the reservation as a plain prefill and a worker answers it. The step says which
// plugin is missing (501) and, for pluginRecheck, refuses the next requests without sending a
// reservation a worker would serve; the x-request-id of the reservation is its own.
func TestPrefillDecodeWithoutTheReservePlugin(t *testing.T) {
	g := newSGLangGateway(t)
	g.reserve = func(w http.ResponseWriter) bool {
		okJSON(`{"id":"cmpl-1","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"length"}]}`)(w, captured{})
		return true
	}
	s := newStep(t, PrefillDecodeStep, g.fakeGateway, sglangParams)
	for i := range 3 {
		rc, _ := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true}`, nil)
		e := apierror.From(s.Execute(context.Background(), rc))
		if e.Status != http.StatusNotImplemented || !strings.Contains(e.Message, "reserve-endpoint plugin") || e.Code != "reserve_endpoint_unsupported" {
			t.Fatalf("request %d: %d %s %q, want 501 naming the plugin", i, e.Status, e.Code, e.Message)
		}
	}
	if g.count("reserve") != 1 || g.count("prefill") != 0 || g.count("decode") != 0 {
		t.Fatalf("legs %v: want one reservation, for the first request only", g.legs)
	}
	if reqs := g.requests(); len(reqs) != 1 || reqs[0].Header.Get("X-Request-Id") != "req-1-reserve" || reqs[0].Header.Get("X-Coordinator-Request-Id") != "req-1" {
		t.Fatalf("legs %v, want the reservation with its own x-request-id", reqs)
	}
	// Once the picker reserves again (a new rollout), the step uses it after pluginRecheck.
	s.(*prefillDecode).unsupported.Store(time.Now().Add(-pluginRecheck).UnixNano())
	g.reserve = nil
	rc, _ := newRC(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true}`, nil)
	if err := s.Execute(context.Background(), rc); err != nil {
		t.Fatalf("after the recheck: %v", err)
	}
}

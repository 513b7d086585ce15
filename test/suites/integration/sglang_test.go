package integration

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/test/doubles/gateway"
	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/harness/stack"
)

// sglangStack runs kv-sglang workers (two of each role, every prefill on a loopback address of
// its own with its bootstrap server on the stack's port) and a coordinator whose pipeline is
// steps.
func sglangStack(t *testing.T, wait time.Duration, stepsYAML string) *system {
	t.Helper()
	return start(t, stack.Options{KVConnector: "kv-sglang", Prefillers: 2, Decoders: 2, BootstrapTimeout: wait}, "kv-sglang", "ec-shared-storage", true, stepsYAML)
}

// host returns the ip:port of a backend URL.
func host(t *testing.T, backend string) string {
	t.Helper()
	u, err := url.Parse(backend)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// With prefill-decode, SGLang's transfer completes: the picker reserves a prefill endpoint, the
// prefill pinned to it and the decode meet in one bootstrap room, the client gets its answer.
func TestPrefillDecodeSGLang(t *testing.T) {
	s := sglangStack(t, time.Minute, steps("prefill-decode"))
	prefillBackends := map[string]bool{}
	for i, stream := range []bool{false, true, false, true} {
		var httpResp *http.Response
		var text string
		p := chatParams("red green blue", 4)
		if stream {
			text, _ = streamChat(t, s.client, p, option.WithResponseInto(&httpResp))
		} else {
			resp, err := s.client.Chat.Completions.New(context.Background(), p, option.WithResponseInto(&httpResp))
			if err != nil {
				t.Fatal(err)
			}
			text = resp.Choices[0].Message.Content
		}
		if text != "red green blue red" {
			t.Fatalf("answer %d %q", i, text)
		}
		legs := s.legsFor(httpResp.Header.Get("X-Request-Id"))
		if len(legs) != 3 {
			t.Fatalf("legs %s", profiles(legs))
		}
		reserve, rest := legs[0], legs[1:]
		if !reserve.Reserved || reserve.Profile != "prefill" || reserve.Status != http.StatusNoContent {
			t.Fatalf("first leg %+v", reserve)
		}
		var pre, dec gateway.Leg
		for _, l := range rest {
			if l.Profile == "prefill" {
				pre = l
			} else {
				dec = l
			}
		}
		// The prefill went to the reserved endpoint, pinned.
		if pre.Pin != host(t, reserve.Backend) || pre.Backend != reserve.Backend || pre.Status != 200 || dec.Profile != "decode" || dec.Status != 200 {
			t.Fatalf("legs %+v / %+v / %+v", reserve, pre, dec)
		}
		prefillBackends[pre.Backend] = true
	}
	if len(prefillBackends) != 2 {
		t.Fatalf("prefill legs went to %v, want both pods", prefillBackends)
	}
	// What the workers got: SGLang's own fields on both legs, the reserved pod's address as
	// bootstrap_host and the stack's bootstrap port; no kv_transfer_params.
	prefillHosts := map[any]bool{}
	for _, w := range s.stack.Prefill {
		h, _, _ := strings.Cut(host(t, w.URL()), ":")
		prefillHosts[h] = true
	}
	for _, w := range append(s.stack.Prefill, s.stack.Decode...) {
		own, _, _ := strings.Cut(host(t, w.URL()), ":")
		for _, b := range received(t, w) {
			if w.Role() == simworker.RolePrefill && b["bootstrap_host"] != own || !prefillHosts[b["bootstrap_host"]] || b["bootstrap_port"] != float64(s.stack.BootstrapPort) || b["bootstrap_room"] == nil || b["kv_transfer_params"] != nil {
				t.Fatalf("%s got %s", w.Name(), mustJSON(t, b))
			}
		}
	}
	for _, w := range s.stack.Prefill {
		if n := w.OpenBootstrapRooms(); n != 0 {
			t.Fatalf("%s has %d rooms open", w.Name(), n)
		}
	}
}

// A dead prefill pod costs nothing: the pair pinned to it fails before decode got anywhere (its
// decode is cancelled) and a new pair goes to the live pod.
func TestPrefillDecodeSGLangPrefillPodDies(t *testing.T) {
	s := sglangStack(t, time.Minute, steps("prefill-decode"))
	s.stack.Prefill[0].Kill()
	for i := range 6 {
		text, _ := streamChat(t, s.client, chatParams("cyan magenta", 3))
		if text != "cyan magenta cyan" {
			t.Fatalf("answer %d %q", i, text)
		}
	}
	if picks := s.stack.Gateway.Picks("prefill"); picks[s.stack.Prefill[1].URL()] < 6 {
		t.Fatalf("prefill picks %v", picks)
	}
	for _, w := range s.stack.Decode {
		if n := len(w.Requests()); n == 0 {
			t.Fatalf("%s got no decode", w.Name())
		}
	}
}

// With the whole prefill pool down, the client gets a 503 as soon as the retries are spent; no
// decode waits out its bootstrap timeout (a minute here) for a prefill that never comes.
func TestPrefillDecodeSGLangPrefillPoolDown(t *testing.T) {
	s := sglangStack(t, time.Minute, steps("prefill-decode"))
	for _, w := range s.stack.Prefill {
		w.Kill()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, err := s.client.Chat.Completions.New(ctx, chatParams("nobody home", 3))
	var apiErr *openai.Error
	if !asAPIError(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("err = %v", err)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("the request outlived the test's deadline")
	}
	// Every decode leg sent was cancelled with its pair: none is in flight, none answered.
	for _, w := range s.stack.Decode {
		reqs, err := w.AwaitRequests(ctx, func(r []simworker.Request) bool {
			for _, q := range r {
				if q.Status == 0 {
					return false
				}
			}
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range reqs {
			if q.Status == http.StatusOK {
				t.Fatalf("%s answered a decode without its prefill", w.Name())
			}
		}
	}
}

// The sequential pipeline cannot be configured with kv-sglang (SGLang's prefill would wait for
// a decode that is only sent after it): the error says what to use instead.
func TestSequentialSGLangRefused(t *testing.T) {
	_, err := stack.StartCoordinator(sglangConfig(t, "[{\"type\":\"prefill\"},{\"type\":\"decode\"}]"), testLogger(t), builder.Overrides{})
	if err == nil || !strings.Contains(err.Error(), "pipeline.steps[0].params.kv_connector: kv-sglang needs prefill and decode in flight together: use the prefill-decode step") {
		t.Fatalf("err = %v", err)
	}
}

func sglangConfig(t *testing.T, stepsJSON string) config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(`{"gateway":{"address":"http://127.0.0.1:1"},"pipeline":{"kv_connector":"kv-sglang","steps":`+stepsJSON+`}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

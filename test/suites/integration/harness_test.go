// Package integration runs the real coordinator server (in-process, on loopback) against
// simworkers behind the gateway double, driven by the official OpenAI Go SDK.
package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.uber.org/goleak"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/test/doubles/gateway"
	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/harness/stack"
	"github.com/epd-dev/coordinator/test/internal/loopback"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"), goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

// system is a coordinator with its worker pool.
type system struct {
	t      *testing.T
	stack  *stack.Stack
	coord  *stack.Coordinator
	client openai.Client
}

// start runs a stack and a coordinator whose config is pipelineYAML (the pipeline section's
// steps, with {{render}} replaced by the render service's address).
func start(t *testing.T, o stack.Options, kv, ec string, openaiFormat bool, stepsYAML string) *system {
	t.Helper()
	return startWith(t, o, kv, ec, openaiFormat, stepsYAML, nil)
}

// startWith is start with mutate applied to the parsed configuration.
func startWith(t *testing.T, o stack.Options, kv, ec string, openaiFormat bool, stepsYAML string, mutate func(*config.Config)) *system {
	t.Helper()
	st, err := stack.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	// The gateway double's hints and reservations name the workers' loopback addresses.
	doc := fmt.Sprintf("gateway:\n  address: %s\n  allowed_hint_networks: [%s]\npipeline:\n  kv_connector: %s\n  ec_connector: %s\n  use_openai_format: %v\n  steps:\n%s",
		st.Gateway.URL(), stack.HintNetworks, kv, ec, openaiFormat, strings.ReplaceAll(stepsYAML, "{{render}}", st.Render.URL()))
	cfg, err := config.Parse([]byte(doc), nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	if mutate != nil {
		mutate(&cfg)
	}
	coord, err := stack.StartCoordinatorWith(cfg, stack.CoordinatorOptions{Log: testLogger(t), Overrides: stack.LoopbackMedia, Getenv: st.Getenv})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coord.Close)
	return &system{t: t, stack: st, coord: coord, client: clientFor(coord.URL())}
}

// clientFor is the official OpenAI SDK pointed at a coordinator.
func clientFor(url string) openai.Client {
	return openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0),
		option.WithRequestTimeout(20*time.Second))
}

// steps renders a YAML step list.
func steps(types ...string) string {
	var b strings.Builder
	for _, s := range types {
		switch s {
		case "render":
			b.WriteString("    - type: render\n      params: {address: \"{{render}}\"}\n")
		default:
			b.WriteString("    - type: " + s + "\n")
		}
	}
	return b.String()
}

// received decodes the JSON bodies a worker got, in order.
func received(t *testing.T, w *simworker.Worker) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, r := range w.Requests() {
		if r.Method != http.MethodPost {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(r.Body, &m); err != nil {
			t.Fatalf("%s got a non-JSON body: %s", w.Name(), r.Body)
		}
		out = append(out, m)
	}
	return out
}

// profiles lists the profiles of the gateway legs, in order.
func profiles(legs []gateway.Leg) string {
	var p []string
	for _, l := range legs {
		p = append(p, fmt.Sprintf("%s:%d", l.Profile, l.Status))
	}
	return strings.Join(p, ",")
}

// post sends a raw JSON request to the coordinator (for the generate format, which the SDK lacks).
func (s *system) post(path, body string, hdr map[string]string) (*http.Response, []byte) {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.coord.URL()+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return loopback.Fetch(s.t, http.DefaultClient, req)
}

// legsFor returns the gateway legs of one request id once they are recorded (gateway.SettledLegs).
func (s *system) legsFor(id string) []gateway.Leg {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return s.stack.Gateway.SettledLegs(ctx, id)
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// testLogger shows the coordinator's trace logs when COORDINATOR_TEST_LOG is set.
func testLogger(t *testing.T) logr.Logger {
	if os.Getenv("COORDINATOR_TEST_LOG") == "" {
		return logr.Discard()
	}
	return logging.New(logging.Trace, os.Stderr)
}

func asAPIError(err error, target **openai.Error) bool { return errors.As(err, target) }

package integration

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	dpsteps "github.com/epd-dev/coordinator/dataplane/steps"
	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/harness/stack"
)

// pdCounts are coordinator_pd_requests_total by outcome.
type pdCounts map[string]float64

func pdCountsOf(t *testing.T, reg *prometheus.Registry) pdCounts {
	t.Helper()
	out := pdCounts{}
	for _, o := range []string{observe.PDDisaggregated, observe.PDRecomputed, observe.PDUnverified, observe.PDAggregated} {
		out[o] = counter(t, reg, "coordinator_pd_requests_total", map[string]string{"outcome": o})
	}
	return out
}

// P/D truth: whether the prompt's KV reached the decode worker, from the decode answer's usage
// (the simworker reports every prompt token cached after a transfer it loaded, cached_tokens 0
// when it recomputed: simworker.FaultRecompute), counted exactly per request; and what a client
// sees with strict_kv_transfer when the decode worker recomputes, refuses the transfer or dies.
func TestPDTruth(t *testing.T) {
	recompute := func(n int) *simworker.Fault { return &simworker.Fault{Kind: simworker.FaultRecompute, Count: n} }
	tests := []struct {
		name     string
		steps    string // the pipeline's steps: prefill then decode unless set
		strict   bool
		stream   bool
		decoders int              // decode workers (default 1; a dead one is ejected by the gateway)
		timeout  string           // gateway.timeout (a hung decode worker's headers), default 60s
		fault    *simworker.Fault // injected into the first decode worker (the first pick) before the requests
		requests int              // default 1
		status   int              // every request's status (default 200)
		code     string           // the error code of a failed request
		want     pdCounts
	}{
		{name: "the KV moved", want: pdCounts{observe.PDDisaggregated: 1}},
		{name: "two of five decodes recompute", requests: 5, fault: recompute(2),
			want: pdCounts{observe.PDDisaggregated: 3, observe.PDRecomputed: 2}},
		{name: "two of five streamed decodes recompute", stream: true, requests: 5, fault: recompute(2),
			want: pdCounts{observe.PDDisaggregated: 3, observe.PDRecomputed: 2}},
		{name: "no prefill step: aggregated by policy", steps: "    - type: decode\n", requests: 2,
			want: pdCounts{observe.PDAggregated: 2}},
		{name: "decode refuses the transfer: retried without it, recomputed", fault: &simworker.Fault{Kind: simworker.FaultStatus, Status: 400},
			want: pdCounts{observe.PDRecomputed: 1}},
		{name: "decode dies before answering: retried without the transfer, recomputed", decoders: 2, fault: &simworker.Fault{Kind: simworker.FaultResetBeforeHeaders},
			want: pdCounts{observe.PDRecomputed: 1}},
		{name: "decode hangs before answering: retried without the transfer, recomputed", decoders: 2, timeout: "1s",
			fault: &simworker.Fault{Kind: simworker.FaultHangBeforeHeaders}, want: pdCounts{observe.PDRecomputed: 1}},
		{name: "strict: the KV moved", strict: true, requests: 2, want: pdCounts{observe.PDDisaggregated: 2}},
		{name: "strict: a recomputed answer fails the request", strict: true, requests: 2, fault: recompute(2),
			status: http.StatusBadGateway, code: dpsteps.ErrCodeKVRecomputed, want: pdCounts{observe.PDRecomputed: 2}},
		{name: "strict: a recomputed stream cannot be taken back: served and counted", strict: true, stream: true, fault: recompute(1),
			want: pdCounts{observe.PDRecomputed: 1}},
		{name: "strict: decode refuses the transfer: the client gets its answer", strict: true, fault: &simworker.Fault{Kind: simworker.FaultStatus, Status: 400},
			status: http.StatusBadRequest, want: pdCounts{}},
		{name: "strict: decode dies before answering: retried with the transfer", strict: true, decoders: 2, fault: &simworker.Fault{Kind: simworker.FaultResetBeforeHeaders},
			want: pdCounts{observe.PDDisaggregated: 1}},
		{name: "strict: decode hangs before answering: retried with the transfer", strict: true, decoders: 2, timeout: "1s",
			fault: &simworker.Fault{Kind: simworker.FaultHangBeforeHeaders}, want: pdCounts{observe.PDDisaggregated: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stepsYAML := tc.steps
			if stepsYAML == "" {
				stepsYAML = fmt.Sprintf("    - type: prefill\n    - type: decode\n      params: {strict_kv_transfer: %v}\n", tc.strict)
			}
			s, reg := startPDTruth(t, stepsYAML, tc.decoders, cmp.Or(tc.timeout, "60s"))
			if tc.fault != nil {
				if err := s.stack.Decode[0].InjectFault(*tc.fault); err != nil {
					t.Fatal(err)
				}
			}
			want := pdCounts{observe.PDDisaggregated: 0, observe.PDRecomputed: 0, observe.PDUnverified: 0, observe.PDAggregated: 0}
			total := 0.0
			for o, n := range tc.want {
				want[o] = n
				total += n
			}
			ctx := context.Background()
			for i := range max(tc.requests, 1) {
				p := chatParams(fmt.Sprintf("is the cache warm %d", i), 3)
				var err error
				if tc.stream {
					_, _, err = readStream(s.client, p, nil)
				} else {
					_, err = s.client.Chat.Completions.New(ctx, p)
				}
				wantStatus := max(tc.status, http.StatusOK)
				var apiErr *openai.Error
				switch {
				case wantStatus == http.StatusOK && err != nil:
					t.Fatalf("request %d: %v", i, err)
				case wantStatus != http.StatusOK && (!asAPIError(err, &apiErr) || apiErr.StatusCode != wantStatus || tc.code != "" && apiErr.Code != tc.code):
					t.Fatalf("request %d: got %v, want HTTP %d %s", i, err, wantStatus, tc.code)
				}
			}
			if total > 0 {
				awaitValue(func() float64 {
					sum := 0.0
					for _, n := range pdCountsOf(t, reg) {
						sum += n
					}
					return sum
				}, total)
			}
			got := pdCountsOf(t, reg)
			for o, n := range want {
				if got[o] != n {
					t.Fatalf("coordinator_pd_requests_total %v, want %v", got, want)
				}
			}
			if left := s.stack.Decode[0].Faults(); len(left) != 0 {
				t.Fatalf("faults not drawn: %+v", left)
			}
		})
	}
}

// startPDTruth runs one prefill worker and decoders decode workers (kv-nixl) and a coordinator
// with metrics whose pipeline's steps are stepsYAML and whose gateway.timeout is timeout.
func startPDTruth(t *testing.T, stepsYAML string, decoders int, timeout string) (*system, *prometheus.Registry) {
	t.Helper()
	st, err := stack.Start(stack.Options{KVConnector: "kv-nixl", Decoders: decoders})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	doc := fmt.Sprintf("gateway: {address: %s, timeout: %s}\npipeline:\n  kv_connector: kv-nixl\n  steps:\n%s", st.Gateway.URL(), timeout, stepsYAML)
	cfg, err := config.Parse([]byte(doc), nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	reg := prometheus.NewRegistry()
	coord, err := stack.StartCoordinatorWith(cfg, stack.CoordinatorOptions{Log: testLogger(t), Telemetry: observe.Telemetry{Metrics: observe.NewMetrics(reg)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coord.Close)
	return &system{t: t, stack: st, coord: coord, client: clientFor(coord.URL())}, reg
}

package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/harness/stack"
)

const (
	workerTTFT = 40 * time.Millisecond
	workerITL  = 10 * time.Millisecond
)

// startTokenMetrics runs prefill and decode (decoders decode workers) with the workers' time to
// first token and inter-token latency set, and the coordinator's metrics on.
func startTokenMetrics(t *testing.T, decoders int) (*system, *prometheus.Registry) {
	t.Helper()
	st, err := stack.Start(stack.Options{KVConnector: "kv-nixl", Decoders: decoders, TTFT: workerTTFT, ITL: workerITL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	cfg, err := config.Parse(fmt.Appendf(nil, "gateway: {address: %s}\npipeline: {kv_connector: kv-nixl, steps: [{type: prefill}, {type: decode}]}\n", st.Gateway.URL()), nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	coord, err := stack.StartCoordinatorWith(cfg, stack.CoordinatorOptions{Log: testLogger(t), Telemetry: observe.Telemetry{Metrics: observe.NewMetrics(reg)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coord.Close)
	return &system{t: t, stack: st, coord: coord, client: clientFor(coord.URL())}, reg
}

// family returns the series of name in reg whose labels include want.
func family(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) []*dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []*dto.Metric
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue next
				}
			}
			out = append(out, m)
		}
	}
	return out
}

func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	sum := 0.0
	for _, m := range family(t, reg, name, labels) {
		sum += m.GetCounter().GetValue()
	}
	return sum
}

func histogram(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (count uint64, sum float64) {
	t.Helper()
	for _, m := range family(t, reg, name, labels) {
		count += m.GetHistogram().GetSampleCount()
		sum += m.GetHistogram().GetSampleSum()
	}
	return count, sum
}

// awaitValue returns what get returns once it is want, or after 5 s what it last returned. A
// request's metrics are recorded when the server settles it, as its handler returns: a client
// that stops at a stream's last event ([DONE]) can read them before that.
func awaitValue(get func() float64, want float64) float64 {
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := get()
		if got == want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(time.Millisecond)
	}
}

// awaitTokens is tokens once it is want (awaitValue).
func awaitTokens(t *testing.T, reg *prometheus.Registry, kind string, want float64) float64 {
	t.Helper()
	return awaitValue(func() float64 { return tokens(t, reg, kind) }, want)
}

func tokens(t *testing.T, reg *prometheus.Registry, kind string) float64 {
	// target_model_name is empty: the workers serve the model asked for.
	return counter(t, reg, "coordinator_tokens_total", map[string]string{"route": "chat", "model": simworker.DefaultModelName,
		"target_model_name": "", "kind": kind})
}

// The numbers disaggregation is about, from what the client got: time to first token, the
// inter-token latency of the relayed events, the prefill-to-first-token gap, and the tokens the
// answers' usage reports (asked of the decode worker for a stream whose client did not ask, and
// kept from that client). The workers' latencies are lower bounds of what is measured.
func TestTokenMetrics(t *testing.T) {
	s, reg := startTokenMetrics(t, 1)
	ctx := context.Background()
	const maxTokens = 5

	// A non-streamed answer: its usage is the client's and the metrics'.
	resp, err := s.client.Chat.Completions.New(ctx, chatParams("count my tokens", maxTokens))
	if err != nil {
		t.Fatal(err)
	}
	prompt := float64(resp.Usage.PromptTokens)
	if prompt == 0 || resp.Usage.CompletionTokens != maxTokens {
		t.Fatalf("usage %+v", resp.Usage)
	}
	if got := awaitTokens(t, reg, observe.TokensPrompt, prompt); got != prompt {
		t.Fatalf("prompt tokens %v, want %v", got, prompt)
	}
	if got := awaitTokens(t, reg, observe.TokensCompletion, maxTokens); got != maxTokens {
		t.Fatalf("completion tokens %v, want %d", got, maxTokens)
	}
	// The decode worker loaded the prompt's KV from the prefill: its usage, as vLLM's, counts
	// those tokens cached.
	if got := awaitTokens(t, reg, observe.TokensCached, prompt); got != prompt {
		t.Fatalf("cached tokens %v, want the transferred prompt's %v", got, prompt)
	}

	// The same prompt streamed, without include_usage: the usage the coordinator asked for reports
	// the prompt cached again (the decode worker loaded the KV and served it before); the client
	// sees no usage.
	stream := s.client.Chat.Completions.NewStreaming(ctx, chatParams("count my tokens", maxTokens))
	events, withUsage := 0, 0
	for stream.Next() {
		events++
		if c := stream.Current(); c.JSON.Usage.Valid() && c.Usage.TotalTokens > 0 {
			withUsage++
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if withUsage != 0 {
		t.Fatalf("the client got %d usage chunks it did not ask for", withUsage)
	}
	if got := awaitTokens(t, reg, observe.TokensPrompt, 2*prompt); got != 2*prompt {
		t.Fatalf("prompt tokens %v after the stream, want %v", got, 2*prompt)
	}
	if got := awaitTokens(t, reg, observe.TokensCompletion, 2*maxTokens); got != 2*maxTokens {
		t.Fatalf("completion tokens %v after the stream, want %d", got, 2*maxTokens)
	}
	if got := awaitTokens(t, reg, observe.TokensCached, 2*prompt); got != 2*prompt {
		t.Fatalf("cached tokens %v, want twice the prompt's %v", got, prompt)
	}

	// A client that asks for usage gets it, counted once.
	if text, _ := streamChat(t, s.client, chatParams("another prompt", maxTokens)); text == "" {
		t.Fatal("empty answer")
	}
	if got := awaitTokens(t, reg, observe.TokensCompletion, 3*maxTokens); got != 3*maxTokens {
		t.Fatalf("completion tokens %v, want %d", got, 3*maxTokens)
	}

	route := map[string]string{"route": "chat", "model": simworker.DefaultModelName}
	awaitValue(func() float64 {
		n, _ := histogram(t, reg, "coordinator_time_to_first_token_seconds", route)
		return float64(n)
	}, 3)
	if n, sum := histogram(t, reg, "coordinator_time_to_first_token_seconds", route); n != 3 || sum < 3*workerTTFT.Seconds() {
		t.Fatalf("time to first token: %d samples, %.3fs in all; want 3 of at least %s each", n, sum, workerTTFT)
	}
	// Two streams of maxTokens content events (and a role event each): every event but the first
	// of a stream is a sample; the gaps add up to at least the worker's ITL between the tokens.
	n, sum := histogram(t, reg, "coordinator_inter_token_latency_seconds", route)
	if n < 2*(maxTokens-1) || sum < 2*(maxTokens-1)*workerITL.Seconds() {
		t.Fatalf("inter-token latency: %d samples, %.3fs in all; want at least %d adding to %s", n, sum, 2*(maxTokens-1), 2*(maxTokens-1)*workerITL)
	}
	if n, sum := histogram(t, reg, "coordinator_prefill_to_first_token_seconds", map[string]string{"route": "chat"}); n != 3 || sum < 3*workerTTFT.Seconds() {
		t.Fatalf("prefill to first token: %d samples, %.3fs; want 3 of at least the decode worker's %s", n, sum, workerTTFT)
	}
}

// Decode workers dying mid-stream (each once, after two tokens): the stream is resumed on another
// pick, once or twice depending on the picks, and the tokens counted are those of the
// uninterrupted answer (each continuation's usage is fixed up), not the sum of the attempts.
func TestTokenMetricsAcrossAResumedStream(t *testing.T) {
	s, reg := startTokenMetrics(t, 2)
	for _, w := range s.stack.Decode {
		if err := w.InjectFault(simworker.Fault{Kind: simworker.FaultDieMidStream, AfterTokens: 2, Count: 1}); err != nil {
			t.Fatal(err)
		}
	}
	const maxTokens = 6
	text, _ := streamChat(t, s.client, chatParams("resume and count", maxTokens))
	if text == "" {
		t.Fatal("empty answer")
	}
	if got := awaitTokens(t, reg, observe.TokensCompletion, maxTokens); got != maxTokens {
		t.Fatalf("completion tokens %v across the resume, want the uninterrupted answer's %d", got, maxTokens)
	}
	if got := counter(t, reg, "coordinator_stream_resumes_total", map[string]string{"outcome": "resumed"}); got < 1 {
		t.Fatalf("%v resumes, want at least 1", got)
	}
	if got := tokens(t, reg, observe.TokensPrompt); got == 0 {
		t.Fatal("no prompt tokens counted")
	}
}

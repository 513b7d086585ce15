package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/reload"
	"github.com/epd-dev/coordinator/dataplane/server"
	"github.com/epd-dev/coordinator/test/harness/atomicdir"
	"github.com/epd-dev/coordinator/test/harness/stack"
)

// TestHotReloadUnderLoad swaps between three pipelines (and invalid configs) 50 times while
// streaming and non-streaming requests run continuously; no request may fail or be truncated, and
// each must have been served entirely by one valid pipeline.
func TestHotReloadUnderLoad(t *testing.T) {
	st, err := stack.Start(stack.Options{ITL: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	gw := st.Gateway.URL()
	docs := []string{
		"gateway: {address: " + gw + "}\npipeline: {steps: [{type: decode}]}\n",
		"gateway: {address: " + gw + "}\npipeline: {kv_connector: kv-nixl, steps: [{type: prefill}, {type: decode}]}\n",
		"gateway: {address: " + gw + "}\npipeline: {kv_connector: kv-nixl, steps: [{type: conditional-decode}, {type: prefill}, {type: decode}]}\n",
		// A canary: half the requests prefill, each request wholly on one of the two pipelines.
		"gateway: {address: " + gw + "}\npipeline: {steps: [{type: decode}]}\ncanary: {weight_percent: 50, pipeline: {kv_connector: kv-nixl, steps: [{type: prefill}, {type: decode}]}}\n",
	}
	invalid := []string{
		"gateway: {address: " + gw + "}\npipeline: {steps: [{type: prefil}, {type: decode}]}\n",
		"pipeline: [\n",
		"gateway: {address: " + gw + "}\npipeline: {use_openai_format: false, steps: [{type: decode}]}\n",
		"gateway: {address: " + gw + "}\npipeline: {steps: [{type: decode}]}\ncanary: {weight_percent: 50, pipeline: {steps: [{type: prefil}, {type: decode}]}}\n",
		// A bad rate_limit block (not a Redis URL) keeps the last good configuration, its limits included.
		"gateway: {address: " + gw + "}\npipeline: {steps: [{type: decode}]}\nrate_limit: {redis_url: 'http://redis:6379', tenant_header: x-tenant}\n",
	}
	validLegs := map[string]bool{"decode:200": true, "prefill:200,decode:200": true, "decode:412,prefill:200,decode:200": true}

	dir := t.TempDir()
	path := filepath.Join(dir, "coordinator.yaml")
	if err := atomicdir.Write(dir, map[string][]byte{"coordinator.yaml": []byte(docs[0])}); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	cfg, err := config.Parse(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	build := func(c config.Config, rev string) (*pipeline.Pipeline, error) {
		return builder.Build(c, builder.Options{Revision: rev})
	}
	coord, err := stack.StartCoordinator(cfg, testLogger(t), builder.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	w := reload.New(reload.Options{Path: path, Holder: coord.Holder, Startup: cfg, Loaded: data, Build: build,
		LookupEnv: func(string) (string, bool) { return "", false }, Debounce: 10 * time.Millisecond, Poll: -1})
	ctx, cancel := context.WithCancel(context.Background())
	watchDone := make(chan struct{})
	go func() { _ = w.Run(ctx); close(watchDone) }()
	defer func() { cancel(); <-watchDone }()
	// The watcher watches once it has seen a write: rewrite the file (a comment changes its
	// content, not its pipeline) until a reload counts it. Those reloads are not the test's.
	for probe := 1; w.Status().Succeeded == 0; probe++ {
		if probe > 10 {
			t.Fatal("the watcher saw none of 10 config writes")
		}
		if err := atomicdir.Write(dir, map[string][]byte{"coordinator.yaml": fmt.Appendf(nil, "%s# probe %d\n", docs[0], probe)}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(time.Second); w.Status().Succeeded == 0 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		}
	}
	probes := w.Status().Succeeded

	client := openai.NewClient(option.WithBaseURL(coord.URL()+"/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	var (
		stop           atomic.Bool
		served, failed atomic.Int64
		firstErr       atomic.Value
		wg             sync.WaitGroup
		idsMu          sync.Mutex
		ids            []string
		seq            atomic.Int64
	)
	fail := func(err error) {
		failed.Add(1)
		firstErr.CompareAndSwap(nil, err)
	}
	defer func() { stop.Store(true); wg.Wait() }() // also when the test fails early
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				n := seq.Add(1)
				id := fmt.Sprintf("load-%d", n)
				words := fmt.Sprintf("w%d x%d", g, i%7) // repeated prompts exercise conditional-decode hits
				want := strings.Join(strings.Fields(strings.Repeat(words+" ", 4))[:6], " ")
				p := chatParams(words, 6)
				var got string
				if n%2 == 0 {
					s := client.Chat.Completions.NewStreaming(context.Background(), p, option.WithHeader("X-Request-Id", id))
					var acc openai.ChatCompletionAccumulator
					done := false
					for s.Next() {
						acc.AddChunk(s.Current())
						done = done || len(s.Current().Choices) > 0 && s.Current().Choices[0].FinishReason != ""
					}
					if err := s.Err(); err != nil {
						fail(fmt.Errorf("%s stream: %w", id, err))
						continue
					}
					if !done || len(acc.Choices) == 0 {
						fail(fmt.Errorf("%s: stream truncated", id))
						continue
					}
					got = acc.Choices[0].Message.Content
				} else {
					resp, err := client.Chat.Completions.New(context.Background(), p, option.WithHeader("X-Request-Id", id))
					if err != nil {
						fail(fmt.Errorf("%s: %w", id, err))
						continue
					}
					got = resp.Choices[0].Message.Content
				}
				if got != want {
					fail(fmt.Errorf("%s: answer %q, want %q", id, got, want))
					continue
				}
				served.Add(1)
				idsMu.Lock()
				ids = append(ids, id)
				idsMu.Unlock()
			}
		}(g)
	}

	admin := httptest.NewServer(server.AdminHandler(prometheus.NewRegistry(), coord.Holder, w))
	defer admin.Close()
	debug := func() server.PipelineStatus {
		resp, err := http.Get(admin.URL + "/debug/pipeline")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var s server.PipelineStatus
		_ = json.NewDecoder(resp.Body).Decode(&s)
		return s
	}
	waitFor := func(what string, cond func() bool) {
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	current := docs[0]
	invalidCount := 0
	for i := 1; i <= 50; i++ {
		doc := docs[i%len(docs)]
		if i%4 == 0 {
			doc = invalid[i%len(invalid)]
		}
		if doc == current {
			doc = docs[(i+1)%len(docs)]
		}
		before := w.Status()
		if err := atomicdir.Write(dir, map[string][]byte{"coordinator.yaml": []byte(doc)}); err != nil {
			t.Fatal(err)
		}
		if i%4 == 0 {
			invalidCount++
			waitFor("a rejection", func() bool { return w.Status().Failed == before.Failed+1 })
			continue
		}
		c, err := config.Parse([]byte(doc), nil)
		if err != nil {
			t.Fatal(err)
		}
		waitFor("revision "+c.Revision(), func() bool { return debug().Revision == c.Revision() })
		current = doc
		// Let requests run under this pipeline before the next swap.
		ran := served.Load() + failed.Load()
		waitFor("requests under revision "+c.Revision(), func() bool { return served.Load()+failed.Load() >= ran+3 })
	}
	stop.Store(true)
	wg.Wait()

	if failed.Load() != 0 {
		for _, l := range st.Gateway.Legs() {
			if e, ok := firstErr.Load().(error); ok && strings.HasPrefix(e.Error(), l.ClientRequestID+":") || strings.HasPrefix(fmt.Sprint(firstErr.Load()), l.ClientRequestID+" ") {
				t.Logf("leg of the first failure: %+v", l)
			}
		}
		t.Fatalf("%d of %d requests failed; first: %v", failed.Load(), failed.Load()+served.Load(), firstErr.Load())
	}
	if served.Load() < 100 {
		t.Fatalf("only %d requests ran during the swaps", served.Load())
	}
	// A leg is recorded when the gateway's handler returns, a moment after the client has read
	// the whole answer.
	waitFor("the last legs to be recorded", func() bool {
		for _, l := range st.Gateway.Legs() {
			if l.Status == 0 {
				return false
			}
		}
		return true
	})
	legs := map[string][]string{}
	for _, l := range st.Gateway.Legs() {
		legs[l.ClientRequestID] = append(legs[l.ClientRequestID], fmt.Sprintf("%s:%d", l.Profile, l.Status))
	}
	for _, id := range ids {
		if got := strings.Join(legs[id], ","); !validLegs[got] {
			t.Fatalf("%s was served by no valid pipeline: %s", id, got)
		}
	}
	s := w.Status()
	if s.Failed != uint64(invalidCount) || s.Succeeded-probes != uint64(50-invalidCount) {
		t.Fatalf("reload status %+v (invalid %d, %d probe reloads)", s, invalidCount, probes)
	}
	t.Logf("%d requests (streaming and not) served across %d reloads and %d rejected configs, 0 failed", served.Load(), s.Succeeded-probes, s.Failed)
}

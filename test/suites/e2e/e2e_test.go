// Package e2e runs the whole system: a real kube-apiserver + etcd with our CRDs and GAIE's, the
// operator as a process, the ConfigMap it renders materialised on disk exactly as kubelet does,
// the real coordinator binary on it, and simworkers behind the gateway double — driven with the
// official OpenAI Go SDK.
package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
	"github.com/epd-dev/coordinator/dataplane/connectors/kv"
	"github.com/epd-dev/coordinator/dataplane/server"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/internal/controller"
	"github.com/epd-dev/coordinator/test/harness/cluster"
	"github.com/epd-dev/coordinator/test/harness/prereq"
	"github.com/epd-dev/coordinator/test/harness/stack"
)

const ns = "e2e"

// env is the running system.
type env struct {
	t       *testing.T
	ctx     context.Context
	cluster *cluster.Cluster
	stack   *stack.Stack
	// gateway records the coordinator's legs on their way to the stack's gateway.
	gateway *legRecorder
	coord   *cluster.Coordinator
	bin     string
}

func setUp(t *testing.T) *env {
	t.Helper()
	prereq.KubebuilderAssets(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	root, err := cluster.Root()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if err := cluster.Build(root, bin, nil); err != nil {
		t.Fatal(err)
	}
	// kv-auto workers follow whatever KV connector the coordinator speaks (vLLM MultiConnector).
	st, err := stack.Start(stack.Options{KVConnector: "kv-auto", ITL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	rec := newLegRecorder(t, st.Gateway.URL())
	// A canary's counts reach status.revisions within half a second (30 s in production).
	c, err := cluster.Start(ctx, cluster.Options{Root: root, Bin: bin, ManagerArgs: []string{"--canary-status-interval=500ms"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return &env{t: t, ctx: ctx, cluster: c, stack: st, gateway: rec, bin: bin}
}

// recordedLeg is one leg the coordinator sent.
type recordedLeg struct {
	// profile is the EPP-Profile header.
	profile string
	// kv is the leg body's top-level kv_transfer_params (nil when absent).
	kv map[string]json.RawMessage
	// revision is the pipeline revision the leg carries (x-coordinator-pipeline-revision).
	revision string
}

// legRecorder is a reverse proxy in front of the gateway double that records each leg's profile
// and kv_transfer_params by request id before forwarding it. A leg is recorded before it is
// answered, so once the client has the response every leg of its request is here.
type legRecorder struct {
	url   string
	proxy *httputil.ReverseProxy
	mu    sync.Mutex
	legs  map[string][]recordedLeg
}

func newLegRecorder(t *testing.T, gatewayURL string) *legRecorder {
	t.Helper()
	target, err := url.Parse(gatewayURL)
	if err != nil {
		t.Fatal(err)
	}
	r := &legRecorder{proxy: httputil.NewSingleHostReverseProxy(target), legs: map[string][]recordedLeg{}}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

func (r *legRecorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	var leg struct {
		KV map[string]json.RawMessage `json:"kv_transfer_params"`
	}
	_ = json.Unmarshal(body, &leg) // a body without the member (or not JSON) records nil
	r.mu.Lock()
	id := req.Header.Get("X-Coordinator-Request-Id") // the client request the leg is part of
	r.legs[id] = append(r.legs[id], recordedLeg{profile: req.Header.Get(gateway.ProfileHeaderName), kv: leg.KV,
		revision: req.Header.Get(gateway.PipelineRevisionHeader)})
	r.mu.Unlock()
	req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	r.proxy.ServeHTTP(w, req)
}

// lastDecodeKV is the kv_transfer_params of the last decode leg of request id.
func (r *legRecorder) lastDecodeKV(t *testing.T, id string) map[string]json.RawMessage {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	legs := r.legs[id]
	for i := len(legs) - 1; i >= 0; i-- {
		if legs[i].profile == gateway.ProfileDecode {
			return legs[i].kv
		}
	}
	t.Fatalf("request %s sent no decode leg: %+v", id, legs)
	return nil
}

// expectKV checks kv_transfer_params: every key of want is there, with the value want gives
// ("" for any non-null value); with exact, no other key is.
func expectKV(t *testing.T, what string, kv map[string]json.RawMessage, want map[string]string, exact bool) {
	t.Helper()
	for k, v := range want {
		got, ok := kv[k]
		if !ok || string(got) == "null" || (v != "" && string(got) != v) {
			t.Fatalf("%s: kv_transfer_params.%s = %s, want %s (all: %s)", what, k, got, cmp.Or(v, "a value"), kv)
		}
	}
	if keys, wantKeys := slices.Sorted(maps.Keys(kv)), slices.Sorted(maps.Keys(want)); exact && !slices.Equal(keys, wantKeys) {
		t.Fatalf("%s: kv_transfer_params keys %q, want exactly %q", what, keys, wantKeys)
	}
}

func params(t *testing.T, v map[string]any) *apiextensionsv1.JSON {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return &apiextensionsv1.JSON{Raw: b}
}

// waitFor polls cond until it holds or fails the test after timeout.
func (e *env) waitFor(what string, timeout time.Duration, cond func() (bool, error)) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after %s waiting for %s (last error: %v)\noperator logs:\n%s", timeout, what, last, tail(e.cluster.ManagerLogs()))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tail(s string) string {
	lines := strings.Split(s, "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

// get reads the CoordinatorPipeline of TestOperatorDrivesARunningCoordinator.
func (e *env) get() *coordinatorv1alpha1.CoordinatorPipeline {
	e.t.Helper()
	return e.pipeline(ns, "epd")
}

// update edits that CoordinatorPipeline's spec like `kubectl edit` (updatePipeline) and
// returns the new generation.
func (e *env) update(edit func(*coordinatorv1alpha1.CoordinatorPipelineSpec)) int64 {
	e.t.Helper()
	return e.updatePipeline(ns, "epd", edit)
}

func (e *env) debugPipeline() server.PipelineStatus {
	e.t.Helper()
	resp, err := http.Get(e.coord.AdminURL + "/debug/pipeline")
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var st server.PipelineStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		e.t.Fatal(err)
	}
	return st
}

func chat(text string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     "sim-model",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(text)},
		MaxTokens: openai.Int(4),
	}
}

// simPool creates namespace and the InferencePool sim-pool in it, selecting the simworkers.
func (e *env) simPool(namespace string) *infv1.InferencePool {
	e.t.Helper()
	if err := e.cluster.Client.Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		e.t.Fatal(err)
	}
	pool := &infv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "sim-pool"},
		Spec: infv1.InferencePoolSpec{
			Selector:          infv1.LabelSelector{MatchLabels: map[infv1.LabelKey]infv1.LabelValue{"app": "simworker"}},
			TargetPorts:       []infv1.Port{{Number: 8000}},
			EndpointPickerRef: &infv1.EndpointPickerRef{Name: "sim-epp", Port: &infv1.Port{Number: 9002}},
		},
	}
	if err := e.cluster.Client.Create(e.ctx, pool); err != nil {
		e.t.Fatal(err)
	}
	return pool
}

func TestOperatorDrivesARunningCoordinator(t *testing.T) {
	e := setUp(t)
	k := e.cluster.Client
	pool := e.simPool(ns)
	cp := &coordinatorv1alpha1.CoordinatorPipeline{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "epd"},
		Spec: coordinatorv1alpha1.CoordinatorPipelineSpec{
			InferencePoolRef: coordinatorv1alpha1.InferencePoolReference{Name: pool.Name},
			Gateway:          coordinatorv1alpha1.GatewaySpec{Address: e.gateway.url},
			Pipeline: coordinatorv1alpha1.PipelineSpec{
				KVConnector: "kv-nixl",
				Steps:       []coordinatorv1alpha1.PipelineStep{{Type: "prefill"}, {Type: "decode"}},
			},
		},
	}
	if err := k.Create(e.ctx, cp); err != nil {
		t.Fatal(err)
	}

	// The operator renders and validates the config; kubelet (our stand-in) mounts it.
	var revision string
	e.waitFor("a rendered, valid configuration", 30*time.Second, func() (bool, error) {
		cp := e.get()
		revision = cp.Status.ConfigRevision
		c := meta.FindStatusCondition(cp.Status.Conditions, string(coordinatorv1alpha1.ConditionPipelineValid))
		return revision != "" && c != nil && c.Status == metav1.ConditionTrue, nil
	})
	dir := filepath.Join(t.TempDir(), "etc-coordinator")
	mount, err := e.cluster.MountConfigMap(e.ctx, ns, "epd-config", dir, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer mount.Stop()
	// The prefill worker serves SGLang's bootstrap on its own listener (for the kv-sglang stage).
	prefillURL, err := url.Parse(e.stack.Prefill[0].URL())
	if err != nil {
		t.Fatal(err)
	}
	e.coord, err = cluster.StartCoordinator(e.ctx, e.bin, filepath.Join(dir, "coordinator.yaml"), "",
		[]string{kv.SGLangBootstrapPortEnv + "=" + prefillURL.Port()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.coord.Stop(10 * time.Second) }()
	pid := e.coord.PID()
	sdk := openai.NewClient(option.WithBaseURL(e.coord.URL+"/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0),
		option.WithRequestTimeout(20*time.Second))
	if got := e.debugPipeline().Revision; got != revision {
		t.Fatalf("coordinator runs revision %s, the CR says %s", got, revision)
	}
	// Its Pod stand-in: the operator asks it which revision it serves.
	e.podFor(ns, "epd", "epd-0", e.coord)
	e.deploymentReady(ns, "epd")
	if got := e.waitRollout(ns, "epd", 1, metav1.ConditionTrue, coordinatorv1alpha1.ReasonRolledOut, 1); got.Status.ReadyFraction != "1/1" ||
		got.Status.URL != "http://epd.e2e.svc:8080" {
		t.Fatalf("status: ready %q, url %q", got.Status.ReadyFraction, got.Status.URL)
	}

	// Text and streaming requests through prefill + decode.
	var httpResp *http.Response
	resp, err := sdk.Chat.Completions.New(e.ctx, chat("end to end"), option.WithResponseInto(&httpResp))
	if err != nil || resp.Choices[0].Message.Content != "end to end end" {
		t.Fatalf("chat: %v %+v", err, resp)
	}
	if got := legs(e.stack, httpResp.Header.Get("X-Request-Id")); got != "prefill:200,decode:200" {
		t.Fatalf("legs %s", got)
	}
	// kv-nixl: decode pulls the KV cache with what the prefill worker answered.
	expectKV(t, "kv-nixl decode leg", e.gateway.lastDecodeKV(t, httpResp.Header.Get("X-Request-Id")), map[string]string{
		"do_remote_decode": "false", "do_remote_prefill": "true",
		"remote_engine_id": "", "remote_block_ids": "", "remote_host": "", "remote_port": "",
	}, false)
	stream := sdk.Chat.Completions.NewStreaming(e.ctx, chat("streamed words"))
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if stream.Err() != nil || acc.Choices[0].Message.Content != "streamed words streamed words" {
		t.Fatalf("stream: %v %+v", stream.Err(), acc.Choices)
	}

	// Continuous load while the pipeline changes under it.
	var (
		stop           atomic.Bool
		served, failed atomic.Int64
		firstErr       atomic.Value
		wg             sync.WaitGroup
	)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				text := fmt.Sprintf("load %d %d", g, i%5)
				want := strings.Join(strings.Fields(strings.Repeat(text+" ", 2))[:4], " ")
				var got string
				if i%2 == 0 {
					s := sdk.Chat.Completions.NewStreaming(e.ctx, chat(text))
					var a openai.ChatCompletionAccumulator
					for s.Next() {
						a.AddChunk(s.Current())
					}
					if err := s.Err(); err != nil || len(a.Choices) == 0 {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, fmt.Errorf("stream: %w", err))
						continue
					}
					got = a.Choices[0].Message.Content
				} else {
					r, err := sdk.Chat.Completions.New(e.ctx, chat(text))
					if err != nil {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err)
						continue
					}
					got = r.Choices[0].Message.Content
				}
				if got != want {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Errorf("answer %q, want %q", got, want))
					continue
				}
				served.Add(1)
			}
		}(g)
	}
	stopLoad := func() {
		stop.Store(true)
		wg.Wait()
	}
	defer stopLoad()

	// kubectl-style update of the steps and the KV connector: it must reach the running
	// coordinator within seconds, without a restart.
	start := time.Now()
	gen := e.update(func(s *coordinatorv1alpha1.CoordinatorPipelineSpec) {
		s.Pipeline.KVConnector = "kv-shared-storage"
		s.Pipeline.Steps = []coordinatorv1alpha1.PipelineStep{{Type: "conditional-decode"}, {Type: "prefill"}, {Type: "decode"}}
	})
	var newRevision string
	e.waitFor("the new revision in the CR status", 20*time.Second, func() (bool, error) {
		cp := e.get()
		newRevision = cp.Status.ConfigRevision
		return cp.Status.ObservedGeneration >= gen && newRevision != revision, nil
	})
	e.waitFor("the coordinator to load the new revision", 20*time.Second, func() (bool, error) {
		return e.debugPipeline().Revision == newRevision, nil
	})
	t.Logf("CR update reached the running coordinator in %s", time.Since(start).Round(time.Millisecond))
	e.waitRollout(ns, "epd", gen, metav1.ConditionTrue, coordinatorv1alpha1.ReasonRolledOut, 1)
	dp := e.debugPipeline()
	if dp.KVConnector != "kv-shared-storage" || len(dp.Steps) != 3 || dp.Steps[0].Type != "conditional-decode" {
		t.Fatalf("debug pipeline %+v", dp)
	}
	if e.coord.PID() != pid || !e.coord.Running() {
		t.Fatal("the coordinator restarted")
	}
	if _, err := sdk.Chat.Completions.New(e.ctx, chat("after the change"), option.WithResponseInto(&httpResp)); err != nil {
		t.Fatal(err)
	}
	if got := legs(e.stack, httpResp.Header.Get("X-Request-Id")); got != "decode:412,prefill:200,decode:200" {
		t.Fatalf("legs after the change %s", got)
	}
	// kv-shared-storage: decode reads the KV cache from the store; only the two flags travel.
	expectKV(t, "kv-shared-storage decode leg", e.gateway.lastDecodeKV(t, httpResp.Header.Get("X-Request-Id")),
		map[string]string{"do_remote_decode": "false", "do_remote_prefill": "true"}, true)
	// The load keeps running on the new pipeline.
	servedBefore := served.Load()
	e.waitFor("requests of the load on the new pipeline", 20*time.Second, func() (bool, error) {
		return served.Load() >= servedBefore+8, nil
	})

	// An invalid update is rejected at the CR; the coordinator keeps serving the last good one.
	updates := mount.Updates()
	bad := e.update(func(s *coordinatorv1alpha1.CoordinatorPipelineSpec) {
		s.Pipeline.Steps = []coordinatorv1alpha1.PipelineStep{
			{Type: "render", Params: params(t, map[string]any{"address": e.stack.Render.URL()})},
			{Type: "encode", Params: params(t, map[string]any{"max_parallel": 0})},
			{Type: "prefill"}, {Type: "decode"},
		}
	})
	var message string
	e.waitFor("PipelineValid=False", 20*time.Second, func() (bool, error) {
		cp := e.get()
		c := meta.FindStatusCondition(cp.Status.Conditions, string(coordinatorv1alpha1.ConditionPipelineValid))
		if c == nil || cp.Status.ObservedGeneration < bad {
			return false, nil
		}
		message = c.Message
		return c.Status == metav1.ConditionFalse, nil
	})
	if !strings.Contains(message, "pipeline.steps[1].params.max_parallel") {
		t.Fatalf("condition message %q does not name the param", message)
	}
	if got := e.get().Status.ConfigRevision; got != newRevision {
		t.Fatalf("status.configRevision moved to %s on an invalid spec", got)
	}
	// The reconcile that reported PipelineValid=False has left the ConfigMap alone, and the
	// kubelet stand-in, having read it twice since, has not touched the mounted file.
	var cm corev1.ConfigMap
	if err := k.Get(e.ctx, client.ObjectKey{Namespace: ns, Name: "epd-config"}, &cm); err != nil {
		t.Fatal(err)
	}
	if got := cm.Annotations[controller.AnnotationConfigRevision]; got != newRevision {
		t.Fatalf("the ConfigMap moved to revision %s on an invalid spec", got)
	}
	syncs := mount.Syncs()
	e.waitFor("two kubelet syncs", 20*time.Second, func() (bool, error) { return mount.Syncs() >= syncs+2, nil })
	if got := mount.Updates(); got != updates {
		t.Fatalf("the mounted configuration was rewritten %d times on an invalid spec", got-updates)
	}
	if got := e.debugPipeline().Revision; got != newRevision {
		t.Fatalf("the coordinator left the last good revision: %s", got)
	}
	// The applied revision did not move: the coordinator still serves it.
	e.waitRollout(ns, "epd", bad, metav1.ConditionTrue, coordinatorv1alpha1.ReasonRolledOut, 1)
	// kv-sglang, whose transfer needs prefill and decode in flight together: the prefill-decode
	// step reserves a prefill endpoint through the picker, pins the prefill to it and sends both.
	sglang := e.update(func(s *coordinatorv1alpha1.CoordinatorPipelineSpec) {
		s.Pipeline.KVConnector = "kv-sglang"
		s.Pipeline.Steps = []coordinatorv1alpha1.PipelineStep{{Type: "prefill-decode"}}
	})
	e.waitFor("the kv-sglang revision to be loaded", 20*time.Second, func() (bool, error) {
		cp := e.get()
		return cp.Status.ObservedGeneration >= sglang && cp.Status.ConfigRevision != newRevision &&
			e.debugPipeline().Revision == cp.Status.ConfigRevision, nil
	})
	e.waitRollout(ns, "epd", sglang, metav1.ConditionTrue, coordinatorv1alpha1.ReasonRolledOut, 1)
	if resp, err := sdk.Chat.Completions.New(e.ctx, chat("sglang end to end"), option.WithResponseInto(&httpResp)); err != nil ||
		resp.Choices[0].Message.Content != "sglang end to end" {
		t.Fatalf("kv-sglang chat: %v %+v", err, resp)
	}
	id := httpResp.Header.Get("X-Request-Id")
	if got := sortedLegs(e.stack, id); got != "decode:200,prefill:200,prefill:204" {
		t.Fatalf("kv-sglang legs %s", got)
	}
	if kvp := e.gateway.lastDecodeKV(t, id); kvp != nil {
		t.Fatalf("kv-sglang decode leg carries kv_transfer_params %v", kvp)
	}
	stream = sdk.Chat.Completions.NewStreaming(e.ctx, chat("sglang streamed"))
	acc = openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if stream.Err() != nil || acc.Choices[0].Message.Content != "sglang streamed sglang streamed" {
		t.Fatalf("kv-sglang stream: %v %+v", stream.Err(), acc.Choices)
	}
	servedBefore = served.Load()
	e.waitFor("requests of the load on the kv-sglang pipeline", 20*time.Second, func() (bool, error) {
		return served.Load() >= servedBefore+8, nil
	})

	stopLoad()
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed during the updates; first: %v", failed.Load(), failed.Load()+served.Load(), firstErr.Load())
	}
	if served.Load() < 20 || e.coord.PID() != pid {
		t.Fatalf("served %d, pid %d -> %d", served.Load(), pid, e.coord.PID())
	}
	t.Logf("%d requests served during 3 CR updates (1 rejected), 0 failed; the coordinator never restarted", served.Load())
}

// legs lists a request's gateway legs as profile:status once they are recorded.
func legs(st *stack.Stack, id string) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var out []string
	for _, l := range st.Gateway.SettledLegs(ctx, id) {
		out = append(out, fmt.Sprintf("%s:%d", l.Profile, l.Status))
	}
	return strings.Join(out, ",")
}

// sortedLegs is legs in sorted order (the prefill and decode of a pair race to the gateway).
func sortedLegs(st *stack.Stack, id string) string {
	l := strings.Split(legs(st, id), ",")
	slices.Sort(l)
	return strings.Join(l, ",")
}

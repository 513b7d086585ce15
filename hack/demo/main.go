// Command demo runs the whole system on this machine (`make demo`): a real kube-apiserver and etcd,
// the operator, a worker pool (encode, prefill, decode simworkers and a render service) behind the
// gateway double, the CoordinatorPipeline of config/samples, and the coordinator started from the
// ConfigMap the operator rendered. It sends one multimodal chat request through the full pipeline,
// prints the answer and the path it took, stages a revision canary and shows its split, then
// serves http://127.0.0.1:8080/v1 until Ctrl-C. With -node (`make demo NODE=1`) it runs on a real
// single-node Kubernetes instead (node.go).
package main

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
	"github.com/epd-dev/coordinator/test/doubles/mediaserver"
	"github.com/epd-dev/coordinator/test/harness/cluster"
	"github.com/epd-dev/coordinator/test/harness/stack"
)

const namespace = "default"

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address the coordinator serves on")
	once := flag.Bool("once", false, "exit after the first request instead of serving until Ctrl-C")
	onNode := flag.Bool("node", false, "run on a real single-node Kubernetes on this machine (root; docs/node.md): `make demo NODE=1`")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var err error
	if *onNode {
		err = runNode(ctx, *once)
	} else {
		err = run(ctx, *addr, *once)
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

func run(ctx context.Context, addr string, once bool) error {
	root, err := cluster.Root()
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "epd-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin := filepath.Join(root, "bin")

	step("building the operator and the coordinator into %s", bin)
	if err := cluster.Build(root, bin, os.Stdout); err != nil {
		return err
	}
	step("preparing kube-apiserver, etcd and kubectl (the first run compiles them from the Go module proxy: several minutes)")
	assets, err := cluster.Assets(root, os.Stderr)
	if err != nil {
		return err
	}
	os.Setenv("KUBEBUILDER_ASSETS", assets)

	step("starting the worker pool: encode, prefill and decode simworkers, a render service, the gateway")
	st, err := stack.Start(stack.Options{KVConnector: "kv-auto", ECConnector: "ec-nixl", TTFT: 20 * time.Millisecond, ITL: 15 * time.Millisecond})
	if err != nil {
		return err
	}
	defer st.Close()
	for _, w := range st.Workers() {
		fmt.Printf("    %-10s %s\n", w.Name(), w.URL())
	}
	fmt.Printf("    %-10s %s\n    %-10s %s (routes by EPP-Profile)\n", "render", st.Render.URL(), "gateway", st.Gateway.URL())

	// status.revisions (the canary's counts) refreshes every 2 s here, every 30 s by default.
	c, err := cluster.Start(ctx, cluster.Options{Root: root, Bin: bin, Progress: os.Stdout, ManagerArgs: []string{"--canary-status-interval=2s"}})
	if err != nil {
		return err
	}
	defer c.Stop()

	step("creating the InferencePool qwen-vl and applying config/samples (gateway and render addresses pointed at the local pool)")
	pool := &infv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "qwen-vl"},
		Spec: infv1.InferencePoolSpec{
			Selector:          infv1.LabelSelector{MatchLabels: map[infv1.LabelKey]infv1.LabelValue{"app": "qwen-vl"}},
			TargetPorts:       []infv1.Port{{Number: 8000}},
			EndpointPickerRef: &infv1.EndpointPickerRef{Name: "qwen-vl-epp", Port: &infv1.Port{Number: 9002}},
		},
	}
	if err := c.Client.Create(ctx, pool); err != nil {
		return err
	}
	name, err := applySamples(ctx, c.Client, filepath.Join(root, "config", "samples"), st)
	if err != nil {
		return err
	}

	step("waiting for the operator to render and validate the pipeline")
	cp, err := waitValid(ctx, c.Client, name)
	if err != nil {
		return fmt.Errorf("%w\noperator logs:\n%s", err, c.ManagerLogs())
	}
	fmt.Printf("    status.configRevision = %s\n", cp.Status.ConfigRevision)

	mountDir := filepath.Join(work, "etc", "coordinator")
	mount, err := c.MountConfigMap(ctx, namespace, name+"-config", mountDir, time.Second)
	if err != nil {
		return err
	}
	defer mount.Stop()
	step("starting the coordinator on %s from the rendered ConfigMap (mounted like kubelet does at %s)", addr, mountDir)
	coord, err := cluster.StartCoordinator(ctx, bin, filepath.Join(mountDir, "coordinator.yaml"), addr, nil, nil)
	if err != nil {
		return err
	}
	defer func() { _ = coord.Stop(10 * time.Second) }()
	// Envtest runs no Deployment controller and no kubelet: play both for the coordinator
	// process, so that the operator's rollout probe asks it which revision it serves.
	if err := c.DeploymentReady(ctx, namespace, name); err != nil {
		return err
	}
	if err := c.StandInPod(ctx, namespace, name, name+"-0", coord); err != nil {
		return err
	}
	kubectl := filepath.Join(assets, "kubectl")
	step("waiting for the operator to see the pod serve revision %s (RolledOut), then kubectl get cpl", cp.Status.ConfigRevision)
	if err := waitRolledOut(ctx, c.Client, name, ""); err != nil {
		return fmt.Errorf("%w\noperator logs:\n%s", err, c.ManagerLogs())
	}
	get := func(args ...string) error {
		cmd := exec.CommandContext(ctx, kubectl, append([]string{"--kubeconfig", c.Kubeconfig, "get", "cpl", "-n", namespace}, args...)...)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("kubectl get cpl: %w", err)
		}
		return nil
	}
	if err := get(); err != nil {
		return err
	}

	step("sending one chat request with an image through the full pipeline")
	if err := firstRequest(ctx, coord.URL, st); err != nil {
		return fmt.Errorf("%w\ncoordinator logs:\n%s", err, coord.Logs())
	}
	if err := canarySplit(ctx, c, coord, st, name, get); err != nil {
		return fmt.Errorf("%w\noperator logs:\n%s\ncoordinator logs:\n%s", err, c.ManagerLogs(), coord.Logs())
	}
	if once {
		return nil
	}

	kubectl = fmt.Sprintf("KUBECONFIG=%s %s", c.Kubeconfig, kubectl)
	fmt.Printf(`
The system is up. Try it:

  curl -s %s/v1/chat/completions -H 'Content-Type: application/json' \
    -d '{"model":"sim-model","messages":[{"role":"user","content":"hello disaggregated world"}],"max_tokens":8}'

  %s get cpl -o wide
  %s edit cpl %s        # change the steps: the coordinator reloads without a restart
  curl -s %s/debug/pipeline

Press Ctrl-C to stop.
`, coord.URL, kubectl, kubectl, name, coord.AdminURL)
	<-ctx.Done()
	fmt.Println("\nstopping")
	return nil
}

// applySamples creates every object of config/samples, pointing the CoordinatorPipeline's gateway
// and render addresses at the local stack. It returns the CoordinatorPipeline's name.
func applySamples(ctx context.Context, k client.Client, dir string, st *stack.Stack) (string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return "", err
	}
	name := ""
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		dec := yaml.NewYAMLOrJSONDecoder(strings.NewReader(string(data)), 4096)
		for {
			var u unstructured.Unstructured
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return "", fmt.Errorf("%s: %w", f, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			if u.GetNamespace() == "" {
				u.SetNamespace(namespace)
			}
			if u.GetKind() == "CoordinatorPipeline" {
				localize(&u, st)
				name = u.GetName()
			}
			if err := k.Create(ctx, &u); err != nil {
				return "", fmt.Errorf("creating %s %s: %w", u.GetKind(), u.GetName(), err)
			}
			fmt.Printf("    created %s/%s\n", strings.ToLower(u.GetKind()), u.GetName())
		}
	}
	if name == "" {
		return "", fmt.Errorf("no CoordinatorPipeline in %s", dir)
	}
	return name, nil
}

// localize points a sample at the local gateway double and render service.
func localize(u *unstructured.Unstructured, st *stack.Stack) {
	_ = unstructured.SetNestedField(u.Object, st.Gateway.URL(), "spec", "gateway", "address")
	unstructured.RemoveNestedField(u.Object, "spec", "gateway", "gatewayRef")
	steps, _, _ := unstructured.NestedSlice(u.Object, "spec", "pipeline", "steps")
	for _, s := range steps {
		m, ok := s.(map[string]any)
		if ok && m["type"] == "render" {
			params, _ := m["params"].(map[string]any)
			if params == nil {
				params = map[string]any{}
			}
			params["address"] = st.Render.URL()
			m["params"] = params
		}
	}
	_ = unstructured.SetNestedSlice(u.Object, steps, "spec", "pipeline", "steps")
	_ = unstructured.SetNestedField(u.Object, int64(1), "spec", "replicas")
}

func waitValid(ctx context.Context, k client.Client, name string) (*coordinatorv1alpha1.CoordinatorPipeline, error) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		var cp coordinatorv1alpha1.CoordinatorPipeline
		if err := k.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &cp); err == nil {
			c := meta.FindStatusCondition(cp.Status.Conditions, string(coordinatorv1alpha1.ConditionPipelineValid))
			if c != nil && c.Status == metav1.ConditionFalse {
				return nil, fmt.Errorf("the sample pipeline is invalid: %s", c.Message)
			}
			if cp.Status.ConfigRevision != "" && c != nil && c.Status == metav1.ConditionTrue {
				return &cp, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("CoordinatorPipeline %s not rendered within a minute", name)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitRolledOut waits until the pipeline's RolledOut condition is True for a revision other
// than notRevision ("" for any).
func waitRolledOut(ctx context.Context, k client.Client, name, notRevision string) error {
	return waitFor(ctx, k, name, "rolled out", func(cp *coordinatorv1alpha1.CoordinatorPipeline) bool {
		return cp.Status.ConfigRevision != notRevision && cp.Status.ObservedGeneration == cp.Generation &&
			meta.IsStatusConditionTrue(cp.Status.Conditions, string(coordinatorv1alpha1.ConditionRolledOut))
	})
}

// waitFor waits up to a minute until the pipeline name passes ok.
func waitFor(ctx context.Context, k client.Client, name, what string, ok func(*coordinatorv1alpha1.CoordinatorPipeline) bool) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		var cp coordinatorv1alpha1.CoordinatorPipeline
		if err := k.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &cp); err == nil && ok(&cp) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("CoordinatorPipeline %s not %s within a minute: %+v", name, what, cp.Status)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// firstRequest sends a chat request with an inline image and prints the answer and its legs.
func firstRequest(ctx context.Context, url string, st *stack.Stack) error {
	sdk := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("demo"), option.WithMaxRetries(0))
	img := "data:image/png;base64," + base64.StdEncoding.EncodeToString(mediaserver.PNG("demo"))
	var httpResp *http.Response
	resp, err := sdk.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "sim-model",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage([]openai.ChatCompletionContentPartUnionParam{
			openai.TextContentPart("what is in this picture"),
			openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: img}),
		})},
		MaxTokens: openai.Int(8),
	}, option.WithResponseInto(&httpResp))
	if err != nil {
		return err
	}
	id := httpResp.Header.Get("X-Request-Id")
	fmt.Printf("    answer: %q\n    request %s took this path:\n", resp.Choices[0].Message.Content, id)
	names := map[string]string{}
	for _, w := range append(st.Workers(), st.Render) {
		names[w.URL()] = w.Name()
	}
	if n := len(st.Render.Requests()); n > 0 {
		fmt.Printf("      %-20s -> %-10s (tokenize once)\n", "render service", "render")
	}
	settle, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, l := range st.Gateway.SettledLegs(settle, id) {
		fmt.Printf("      EPP-Profile: %-7s -> %-10s HTTP %d in %s\n", l.Profile, names[l.Backend], l.Status, l.Duration.Round(time.Millisecond))
	}
	fmt.Printf("    usage: %d prompt tokens, %d completion tokens\n", resp.Usage.PromptTokens, resp.Usage.CompletionTokens)
	return nil
}

// canarySplit stages a revision canary on the pipeline name (20% of the requests on prefill and
// decode alone), waits for the coordinator to serve it, sends ten text requests, prints which
// pipeline each ran on and the operator's status.revisions.
func canarySplit(ctx context.Context, c *cluster.Cluster, coord *cluster.Coordinator, st *stack.Stack, name string,
	get func(...string) error) error {
	step("staging a revision canary: spec.canary runs 20%% of the requests on prefill and decode alone (no render, no decode-first probe)")
	var cp coordinatorv1alpha1.CoordinatorPipeline
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &cp); err != nil {
		return err
	}
	before := cp.Status.ConfigRevision
	cp.Spec.Canary = &coordinatorv1alpha1.CanarySpec{WeightPercent: 20, Pipeline: coordinatorv1alpha1.PipelineSpec{
		KVConnector: cp.Spec.Pipeline.KVConnector, ECConnector: cp.Spec.Pipeline.ECConnector,
		Steps: []coordinatorv1alpha1.PipelineStep{{Type: coordinatorv1alpha1.StepPrefill}, {Type: coordinatorv1alpha1.StepDecode}},
	}}
	if err := c.Client.Update(ctx, &cp); err != nil {
		return err
	}
	if err := waitRolledOut(ctx, c.Client, name, before); err != nil {
		return err
	}
	sdk := openai.NewClient(option.WithBaseURL(coord.URL+"/v1/"), option.WithAPIKey("demo"), option.WithMaxRetries(0))
	paths := map[string]int{}
	var order []string
	for i := range 10 {
		var httpResp *http.Response
		if _, err := sdk.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:     "sim-model",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("canary demo %d", i))},
			MaxTokens: openai.Int(4),
		}, option.WithResponseInto(&httpResp)); err != nil {
			return err
		}
		settle, cancel := context.WithTimeout(ctx, 10*time.Second)
		var legs []string
		for _, l := range st.Gateway.SettledLegs(settle, httpResp.Header.Get("X-Request-Id")) {
			legs = append(legs, fmt.Sprintf("%s(%d)", l.Profile, l.Status))
		}
		cancel()
		path := strings.Join(legs, " -> ")
		if paths[path] == 0 {
			order = append(order, path)
		}
		paths[path]++
	}
	fmt.Println("    10 text requests took these paths (each request wholly on one pipeline):")
	for _, p := range order {
		fmt.Printf("      %2d x %s\n", paths[p], p)
	}
	if err := waitFor(ctx, c.Client, name, "counting the canary's requests", func(cp *coordinatorv1alpha1.CoordinatorPipeline) bool {
		r := cp.Status.Revisions
		return len(r) == 2 && r[0].Requests+r[1].Requests >= 10 && r[1].Requests >= 2
	}); err != nil {
		return err
	}
	fmt.Println("    status.revisions, from the pod's counts:")
	return get("-o", `custom-columns=NAME:.metadata.name,TRACKS:.status.revisions[*].track,REVISIONS:.status.revisions[*].revision,`+
		`WEIGHTS:.status.revisions[*].weightPercent,REQUESTS:.status.revisions[*].requests,ERRORS:.status.revisions[*].errors`)
}

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/epd-dev/coordinator/test/harness/cluster"
	"github.com/epd-dev/coordinator/test/harness/node"
)

// nodeManifests are the demo's objects on the real node: a namespace under the restricted Pod
// Security profile, two llm-d simulator pods behind Service sim as the InferencePool's workers,
// and a CoordinatorPipeline (prefill, decode) whose gateway is the simulator Service by DNS name.
const nodeManifests = `apiVersion: v1
kind: Namespace
metadata:
  name: demo
  labels:
    pod-security.kubernetes.io/enforce: restricted
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: sim, namespace: demo}
spec:
  replicas: 2
  selector: {matchLabels: {app: sim}}
  template:
    metadata: {labels: {app: sim}}
    spec:
      containers:
      - name: sim
        image: ` + node.SimImage + `
        args: [--model, sim-model, --mode, echo, --force-dummy-tokenizer, --max-num-seqs, "64"]
        ports: [{name: http, containerPort: 8000}]
        readinessProbe: {httpGet: {path: /health, port: 8000}, periodSeconds: 1}
        securityContext:
          allowPrivilegeEscalation: false
          runAsNonRoot: true
          capabilities: {drop: [ALL]}
          seccompProfile: {type: RuntimeDefault}
---
apiVersion: v1
kind: Service
metadata: {name: sim, namespace: demo}
spec:
  selector: {app: sim}
  ports: [{name: http, port: 8000, targetPort: 8000}]
---
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: sim-pool, namespace: demo}
spec:
  selector: {matchLabels: {app: sim}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: sim-epp, port: {number: 9002}}
---
apiVersion: coordinator.epd.dev/v1alpha1
kind: CoordinatorPipeline
metadata: {name: epd, namespace: demo}
spec:
  inferencePoolRef: {name: sim-pool}
  gateway: {address: "http://sim.demo.svc.cluster.local:8000"}
  pipeline:
    kvConnector: kv-nixl
    steps: [{type: prefill}, {type: decode}]
  replicas: 2
`

// runNode is `make demo NODE=1`: the same system on a real single-node Kubernetes
// (test/harness/node, docs/node.md), as root. The operator is installed from `make
// build-installer`, the coordinator runs as the Deployment it renders, and the request goes
// through the coordinator Service's ClusterIP.
func runNode(ctx context.Context, once bool) error {
	if m := node.Prerequisites(); len(m) > 0 {
		return fmt.Errorf("the real node needs %s (docs/node.md)", strings.Join(m, ", "))
	}
	root, err := cluster.Root()
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "epd-demo-node-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	sim := os.Getenv("LLMD_SIM_BIN")
	if sim == "" {
		sim = filepath.Join(root, "..", "shared", "peers", "llm-d-inference-sim.xz")
	}
	step("building the images without Docker: operator, coordinator (as the Dockerfiles say) and llm-d's simulator")
	imgs, err := node.ProjectImages(root, work, sim)
	if err != nil {
		return err
	}
	step("starting a single-node Kubernetes on this machine (the first run builds the node binaries: minutes)")
	c, err := node.Start(ctx, node.Options{Root: root, Images: imgs, Progress: os.Stdout})
	if err != nil {
		return err
	}
	defer c.Stop()
	kubectl := func(stdin []byte, args ...string) (string, error) { return c.Kubectl(ctx, stdin, args...) }

	step("installing the CRDs the operator works with, then the operator from make build-installer")
	for _, mod := range [][2]string{
		{"sigs.k8s.io/gateway-api-inference-extension", "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml"},
		{"sigs.k8s.io/gateway-api", "config/crd/standard/gateway.networking.k8s.io_gateways.yaml"},
		{"sigs.k8s.io/gateway-api", "config/crd/standard/gateway.networking.k8s.io_httproutes.yaml"},
	} {
		out, err := exec.Command("go", "list", "-C", root, "-m", "-f", "{{.Dir}}", mod[0]).Output()
		if err != nil {
			return fmt.Errorf("go list -m %s: %w", mod[0], err)
		}
		if _, err := kubectl(nil, "apply", "--server-side", "-f", filepath.Join(strings.TrimSpace(string(out)), mod[1])); err != nil {
			return err
		}
	}
	installer := filepath.Join(work, "install.yaml")
	if out, err := exec.Command("make", "--no-print-directory", "-C", root, "build-installer", "INSTALLER="+installer,
		"IMG="+node.OperatorImage, "COORDINATOR_IMG="+node.CoordinatorImage).CombinedOutput(); err != nil {
		return fmt.Errorf("make build-installer: %w\n%s", err, out)
	}
	if _, err := kubectl(nil, "apply", "--server-side", "-f", installer); err != nil {
		return err
	}
	if _, err := kubectl(nil, "-n", "coordinator-system", "rollout", "status", "deployment/coordinator-controller-manager", "--timeout=180s"); err != nil {
		return err
	}
	step("applying the simulator pool and the CoordinatorPipeline demo/epd")
	if _, err := kubectl([]byte(nodeManifests), "apply", "-f", "-"); err != nil {
		return err
	}
	if _, err := kubectl(nil, "-n", "demo", "wait", "--for=condition=Ready", "coordinatorpipeline/epd", "--timeout=180s"); err != nil {
		return err
	}
	out, err := kubectl(nil, "-n", "demo", "get", "cpl", "epd")
	if err != nil {
		return err
	}
	fmt.Print(out)
	ip, err := kubectl(nil, "-n", "demo", "get", "service", "epd", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		return err
	}
	url := "http://" + ip + ":8080"
	step("sending one chat request through the coordinator Service %s", url)
	if err := nodeRequest(ctx, url, kubectl); err != nil {
		return err
	}
	if once {
		return nil
	}
	step("serving %s/v1 (the Service's ClusterIP, reachable from this machine) until Ctrl-C; try:", url)
	fmt.Printf("    curl -s %s/v1/chat/completions -H 'Content-Type: application/json' -d '{\"model\":\"sim-model\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}],\"max_tokens\":8}'\n", url)
	<-ctx.Done()
	step("stopping the node and cleaning the host")
	return nil
}

// nodeRequest sends a chat request, prints the answer, and the path it took: the coordinator pod
// that served it (its "pipeline step timings" log line for the request id, through kubectl logs).
func nodeRequest(ctx context.Context, url string, kubectl func([]byte, ...string) (string, error)) error {
	body := `{"model":"sim-model","max_tokens":8,"messages":[{"role":"user","content":"hello from a real node"}]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	// READY does not say kube-proxy has programmed the new Service yet: retry a refused
	// connection for a while.
	var resp *http.Response
	for deadline := time.Now().Add(30 * time.Second); ; {
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		if resp, err = http.DefaultClient.Do(req); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	var answer struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &answer); err != nil {
		return fmt.Errorf("answer %s: %w", b, err)
	}
	if len(answer.Choices) == 0 {
		return fmt.Errorf("answer without choices: %s", b)
	}
	id := resp.Header.Get("X-Request-Id")
	fmt.Printf("    answer: %q\n    request %s took this path:\n", answer.Choices[0].Message.Content, id)
	fmt.Printf("      client -> Service demo/epd (ClusterIP, kube-proxy) -> ")
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		pods, err := kubectl(nil, "-n", "demo", "get", "pods", "-l", "app.kubernetes.io/instance=epd", "-o", "jsonpath={.items[*].metadata.name}")
		if err != nil {
			return err
		}
		for _, pod := range strings.Fields(pods) {
			logs, err := kubectl(nil, "-n", "demo", "logs", pod)
			if err != nil {
				continue
			}
			sc := bufio.NewScanner(strings.NewReader(logs))
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				if line := sc.Text(); strings.Contains(line, id) && strings.Contains(line, "pipeline step timings") {
					fmt.Printf("coordinator pod %s -> legs to http://sim.demo.svc.cluster.local:8000 (CoreDNS, kube-proxy) -> a simulator pod\n      %s\n", pod, line)
					return nil
				}
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	fmt.Println("a coordinator pod (its log line for the request was not found)")
	return nil
}

package node

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/epd-dev/coordinator/test/harness/node"
)

// helmNamespace is the namespace of the Helm release.
const helmNamespace = "coordinator-helm"

// helmInstall installs the operator once from the Helm chart: the kustomize installation is
// removed first (kubectl delete -f the installer: the operator, the CRD and with it every
// CoordinatorPipeline and what the operator made of them), then charts/coordinator-operator is
// installed with Helm's own library (action.Install, what `helm install --wait` runs) and the
// node's images; the CoordinatorPipeline created again comes up READY 2/2 under that operator and
// serves through its new Service.
func (s *suite) helmInstall(t *testing.T) {
	start := time.Now()
	s.kubectl(nil, "delete", "--wait", "--timeout=180s", "-f", filepath.Join(s.bin, "install.yaml"))
	s.waitFor("the coordinator pods gone with their CoordinatorPipeline", 120*time.Second, func() error {
		if pods := s.coordinatorPods(); len(pods) != 0 {
			return fmt.Errorf("pods left: %v", pods)
		}
		return nil
	})
	t.Logf("FIGURE kustomize installation removed (operator, CRD, CoordinatorPipeline, its pods): %s", time.Since(start).Round(time.Millisecond))

	flags := genericclioptions.NewConfigFlags(false)
	kubeconfig, namespace := s.c.Kubeconfig, helmNamespace
	flags.KubeConfig, flags.Namespace = &kubeconfig, &namespace
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, helmNamespace, "secret", func(format string, v ...any) { t.Logf("helm: "+format, v...) }); err != nil {
		t.Fatal(err)
	}
	chart, err := loader.Load(filepath.Join(s.root, "charts", "coordinator-operator"))
	if err != nil {
		t.Fatal(err)
	}
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace, install.CreateNamespace = "coordinator", helmNamespace, true
	install.Wait, install.Timeout = true, 3*time.Minute
	opRepo, opTag := splitImage(t, node.OperatorImage)
	coRepo, coTag := splitImage(t, node.CoordinatorImage)
	vals := map[string]any{
		"image":       map[string]any{"repository": opRepo, "tag": opTag, "pullPolicy": "Never"},
		"coordinator": map[string]any{"image": map[string]any{"repository": coRepo, "tag": coTag}},
	}
	start = time.Now()
	rel, err := install.Run(chart, vals)
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	t.Logf("FIGURE helm install (chart %s %s, --wait): release %s revision %d %s in %s", chart.Metadata.Name, chart.Metadata.Version,
		rel.Name, rel.Version, rel.Info.Status, time.Since(start).Round(time.Millisecond))
	s.kubectl(nil, "wait", "--for=condition=Established", "crd/coordinatorpipelines.coordinator.epd.dev", "--timeout=60s")
	if out := s.kubectl(nil, "-n", helmNamespace, "get", "deployment", "-o", "jsonpath={.items[*].spec.template.spec.containers[0].image}"); out != node.OperatorImage {
		t.Fatalf("the chart's operator runs %q, want %q", out, node.OperatorImage)
	}

	s.createPipeline(t)
	s.served(t)
}

// splitImage splits a reference repository:tag.
func splitImage(t *testing.T, ref string) (string, string) {
	t.Helper()
	i := strings.LastIndexByte(ref, ':')
	if i < 0 || strings.Contains(ref[i:], "/") {
		t.Fatalf("image %q has no tag", ref)
	}
	return ref[:i], ref[i+1:]
}

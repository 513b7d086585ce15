package node

import (
	"context"
	"os"
	"testing"

	"github.com/epd-dev/coordinator/test/harness/prereq"
)

// Require stops the test when this machine cannot run the node (prereq.Missing: a failure under
// CI, a skip elsewhere) or NODE_ASSETS is not set (`make test` sets it from hack/node-assets.sh).
func Require(t testing.TB) {
	t.Helper()
	if m := Prerequisites(); len(m) > 0 {
		prereq.Missing(t, "the node tier needs %v (as root: apt-get install containerd runc containernetworking-plugins iptables; .ci/run installs them)", m)
	}
	if os.Getenv("NODE_ASSETS") == "" {
		prereq.Missing(t, "NODE_ASSETS is not set: run `make test`, or NODE_ASSETS=$(hack/node-assets.sh) KUBEBUILDER_ASSETS=$(hack/setup-envtest-assets.sh) go test ./test/...")
	}
	prereq.KubebuilderAssets(t)
}

// StartT starts a cluster for the test (Require first) and stops it in t.Cleanup.
func StartT(t testing.TB, o Options) *Cluster {
	t.Helper()
	Require(t)
	if o.Progress == nil {
		o.Progress = testWriter{t}
	}
	c, err := Start(context.Background(), o)
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", p)
	return len(p), nil
}

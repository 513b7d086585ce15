// Package prereq is the tests' one policy for a prerequisite the machine lacks (the envtest
// control plane, root for the image user check, a redis-server): under CI (the CI environment
// variable set, as .ci/run does) the test fails, because CI must run every test; elsewhere it is
// skipped, saying what is missing and how to get it.
package prereq

import (
	"fmt"
	"os"
	"testing"
)

// InCI reports whether the tests run in CI: the CI environment variable is set.
func InCI() bool { return os.Getenv("CI") != "" }

// Missing stops the test for the missing prerequisite described by format and args: it fails
// the test under CI and skips it otherwise.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("CI is set, but %s", msg)
		return
	}
	t.Skipf("skipped (CI is not set): %s", msg)
}

// KubebuilderAssets returns $KUBEBUILDER_ASSETS, the directory of the envtest control plane
// (kube-apiserver, etcd, kubectl), or stops the test with Missing when it is not set.
func KubebuilderAssets(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		Missing(t, "KUBEBUILDER_ASSETS is not set: this test needs a kube-apiserver and etcd. "+
			"Run `make test`, or `KUBEBUILDER_ASSETS=$(hack/setup-envtest-assets.sh) go test ./...` from the repository root.")
	}
	return dir
}

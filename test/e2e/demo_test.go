package e2e

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/test/cluster"
)

// TestDemo runs `make demo`'s program once (first request, then exit), so the README's first
// command keeps working.
func TestDemo(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test`")
	}
	root, err := cluster.Root()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", "./hack/demo", "--once", "--addr", "127.0.0.1:18080")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out)
	}
	for _, want := range []string{"status.configRevision = ", "answer: \"what is in this picture", "EPP-Profile: encode ", "EPP-Profile: prefill", "EPP-Profile: decode  -> decode-0   HTTP 200"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("demo output lacks %q:\n%s", want, out)
		}
	}
}

package e2e

import (
	"net"
	"os/exec"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/test/harness/cluster"
	"github.com/epd-dev/coordinator/test/harness/prereq"
)

// TestDemo runs `make demo`'s program once (first request, then exit), so the README's first
// command keeps working: the pipeline rolled out (kubectl get cpl's READY, UPDATED and URL), and
// a 20% canary took exactly 2 of 10 requests, which status.revisions counts. The coordinator
// serves on a free loopback port.
func TestDemo(t *testing.T) {
	prereq.KubebuilderAssets(t)
	root, err := cluster.Root()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command("go", "run", "./hack/demo", "--once", "--addr", addr)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out)
	}
	for _, want := range []string{"status.configRevision = ", "starting the coordinator on " + addr, "answer: \"what is in this picture", "EPP-Profile: encode ", "EPP-Profile: prefill", "EPP-Profile: decode  -> decode-0   HTTP 200",
		"READY   UPDATED   URL", "1/1     1         http://",
		"8 x decode(412) -> prefill(200) -> decode(200)", "2 x prefill(200) -> decode(200)", "stable,canary", "80,20     9,2        0,0"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("demo output lacks %q:\n%s", want, out)
		}
	}
}

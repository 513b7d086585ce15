package broker

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The operator validates pipelines through this package: neither links the Redis client. The
// coordinator links the runtime and hands it to its pipelines, without which their async-broker
// steps answer 500.
func TestLinking(t *testing.T) {
	const (
		module = "github.com/epd-dev/coordinator"
		redis  = "github.com/redis/go-redis/v9"
	)
	pkgs := []string{module + "/cmd/manager", module + "/dataplane/broker", module + "/cmd/coordinator"}
	cmd := exec.Command("go", append([]string{"list", "-f", `{{.ImportPath}} {{join .Deps " "}}`}, pkgs...)...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		deps[f[0]] = f[1:]
	}
	for _, tc := range []struct {
		pkg, dep string
		linked   bool
	}{
		{module + "/cmd/manager", redis, false},
		{module + "/cmd/manager", module + "/dataplane/broker", true}, // it validates async-broker params
		{module + "/dataplane/broker", redis, false},
		{module + "/cmd/coordinator", RuntimePackage, true},
	} {
		d, ok := deps[tc.pkg]
		if !ok {
			t.Fatalf("go list did not list %s:\n%s", tc.pkg, out)
		}
		if got := slices.Contains(d, tc.dep); got != tc.linked {
			t.Errorf("%s links %s: %v, want %v", tc.pkg, tc.dep, got, tc.linked)
		}
	}
}

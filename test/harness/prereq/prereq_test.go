package prereq

import (
	"fmt"
	"strings"
	"testing"
)

// recorder stands in for a test: it records Fatalf and Skipf instead of ending the goroutine.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Fatalf(format string, args ...any) { r.fatal = fmt.Sprintf(format, args...) }
func (r *recorder) Skipf(format string, args ...any)  { r.skip = fmt.Sprintf(format, args...) }

func TestMissingFailsOnlyInCI(t *testing.T) {
	tests := map[string]struct {
		ci       string
		wantFail bool
	}{
		"CI=true":  {ci: "true", wantFail: true},
		"CI=1":     {ci: "1", wantFail: true},
		"CI unset": {ci: "", wantFail: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			r := &recorder{TB: t}
			Missing(r, "no %s", "thing")
			if failed, skipped := r.fatal != "", r.skip != ""; failed != tc.wantFail || skipped == tc.wantFail || !strings.Contains(r.fatal+r.skip, "no thing") {
				t.Fatalf("fatal %q, skip %q; want a failure: %v", r.fatal, r.skip, tc.wantFail)
			}
		})
	}
}

func TestKubebuilderAssets(t *testing.T) {
	t.Setenv("CI", "true")
	t.Setenv("KUBEBUILDER_ASSETS", "/assets")
	r := &recorder{TB: t}
	if dir := KubebuilderAssets(r); dir != "/assets" || r.fatal != "" || r.skip != "" {
		t.Fatalf("KubebuilderAssets = %q (fatal %q, skip %q)", dir, r.fatal, r.skip)
	}
	t.Setenv("KUBEBUILDER_ASSETS", "")
	if KubebuilderAssets(r); !strings.Contains(r.fatal, "CI is set") {
		t.Fatalf("without assets under CI: fatal %q, skip %q", r.fatal, r.skip)
	}
}

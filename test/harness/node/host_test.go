package node

import (
	"slices"
	"testing"
)

func TestSplitQuoted(t *testing.T) {
	got := splitQuoted(`-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	want := []string{"-A", "OUTPUT", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"}
	if !slices.Equal(got, want) {
		t.Fatalf("%q", got)
	}
	if got := splitQuoted(`-A X --comment "a \"b\" c"`); !slices.Equal(got, []string{"-A", "X", "--comment", `a "b" c`}) {
		t.Fatalf("%q", got)
	}
}

// Package makefile reads the repository's Makefile for tests that check a packaging default
// (chart, bundle) against the one the Makefile builds with.
package makefile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Var returns the default of a `NAME ?= value` line of the Makefile in the repository at root.
func Var(t testing.TB, root, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if k, v, ok := strings.Cut(line, "?="); ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("Makefile: no %s ?= line", name)
	return ""
}

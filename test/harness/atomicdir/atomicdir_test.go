package atomicdir

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteSwapsAtomically(t *testing.T) {
	dir := t.TempDir()
	for _, v := range []string{"one", "two", "three"} {
		if err := Write(dir, map[string][]byte{"coordinator.yaml": []byte(v)}); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, "coordinator.yaml"))
		if err != nil || string(got) != v {
			t.Fatalf("read %q %v, want %q", got, err, v)
		}
		if target, _ := os.Readlink(filepath.Join(dir, "coordinator.yaml")); target != "..data/coordinator.yaml" {
			t.Fatalf("file link %q", target)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 3 { // ..<ts>, ..data, coordinator.yaml
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("old payloads left behind: %v", names)
	}
	if err := Write(dir, map[string][]byte{"../x": nil}); err == nil {
		t.Fatal("accepted a path")
	}
}

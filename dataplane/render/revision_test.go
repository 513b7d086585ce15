package render

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/test/harness/atomicdir"
)

// TestRevision: the fingerprint depends on names and contents only, and where one ends and the
// next begins; DirRevision reads what a ConfigMap volume presents (its keys, links into ..data).
func TestRevision(t *testing.T) {
	base := Revision(map[string][]byte{"a": []byte("1"), "b": []byte("22")})
	if !strings.HasPrefix(base, RevisionPrefix) || len(base) != len(RevisionPrefix)+revisionLen {
		t.Fatalf("revision %q", base)
	}
	for name, files := range map[string]map[string][]byte{
		"a content changed":  {"a": []byte("2"), "b": []byte("22")},
		"a name changed":     {"c": []byte("1"), "b": []byte("22")},
		"the boundary moved": {"a": []byte("12"), "b": []byte("2")},
		"a file added":       {"a": []byte("1"), "b": []byte("22"), "c": nil},
	} {
		if Revision(files) == base {
			t.Errorf("%s: same revision", name)
		}
	}
	dir := filepath.Join(t.TempDir(), "cm")
	if err := atomicdir.Write(dir, map[string][]byte{"a": []byte("1"), "b": []byte("22")}); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil { // not a key
		t.Fatal(err)
	}
	if got, err := DirRevision(dir); err != nil || got != base {
		t.Fatalf("DirRevision = %q, %v; want %q", got, err, base)
	}
	if _, err := DirRevision(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing directory has a revision")
	}
}

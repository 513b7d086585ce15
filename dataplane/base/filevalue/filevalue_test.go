package filevalue

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/test/harness/atomicdir"
)

// TestValue: a value is loaded on first use, kept while its files are unchanged, loaded again
// when one changes (rewritten in place, or swapped by symlink as kubelet does), and kept when the
// new files do not load, with one report per change.
func TestValue(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "secret")
	path := filepath.Join(dir, "v")
	loads := 0
	var stale []string
	v := New(func() (string, error) {
		loads++
		b, err := os.ReadFile(path)
		if err == nil && strings.HasPrefix(string(b), "bad") {
			err = errors.New("bad content")
		}
		return string(b), err
	}, path).WhenStale(func(err error) { stale = append(stale, err.Error()) })

	if _, err := v.Get(); err == nil {
		t.Fatal("a missing file loaded")
	}
	steps := []struct {
		name   string
		write  string // "" : leave the files
		remove bool
		want   string
		loads  int // loads so far
		stale  int // stale reports so far
	}{
		{name: "first", write: "one", want: "one", loads: 2},
		{name: "unchanged: not read again", want: "one", loads: 2},
		{name: "swapped", write: "two!", want: "two!", loads: 3},
		{name: "bad content keeps the last good", write: "bad1", want: "two!", loads: 4, stale: 1},
		{name: "still bad: not read again, not reported again", want: "two!", loads: 4, stale: 1},
		{name: "removed keeps the last good", remove: true, want: "two!", loads: 5, stale: 2},
		{name: "removed, used again: reported once", want: "two!", loads: 6, stale: 2},
		{name: "back", write: "three", want: "three", loads: 7, stale: 2},
	}
	for _, s := range steps {
		switch {
		case s.remove:
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
		case s.write != "":
			if err := atomicdir.Write(dir, map[string][]byte{"v": []byte(s.write)}); err != nil {
				t.Fatal(err)
			}
		}
		got, err := v.Get()
		if err != nil || got != s.want || loads != s.loads || len(stale) != s.stale {
			t.Fatalf("%s: got %q, %v; loads %d, stale reports %v; want %q, %d loads, %d reports", s.name, got, err, loads, stale, s.want, s.loads, s.stale)
		}
	}
}

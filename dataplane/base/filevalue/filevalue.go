// Package filevalue keeps a value read from files (a CA bundle, a certificate and its key) fresh:
// it is read on first use and again whenever one of its files changes, so that a renewed
// Secret or a rotated ConfigMap applies to the next use without a restart or a watcher.
package filevalue

import (
	"os"
	"sync"
)

// Value is a value loaded from files. A use stats the files (cheap next to what a value is used
// for: a TLS handshake, a dial) and loads again when any is another file than before (kubelet
// swaps a Secret volume's files by symlink), or has another size or modification time. Files that
// no longer load (a half-written update, a removal) keep the last good value. It is safe for
// concurrent use.
type Value[T any] struct {
	paths []string
	load  func() (T, error)

	stale func(error)

	mu     sync.Mutex
	stamps []os.FileInfo
	failed []os.FileInfo // the files as they were when a load last failed
	told   string        // the last error given to stale
	val    T
	loaded bool
}

// New returns the value loaded by load from paths.
func New[T any](load func() (T, error), paths ...string) *Value[T] {
	return &Value[T]{paths: paths, load: load}
}

// WhenStale makes the value call f when files that changed do not load and the last good value
// is kept (once per change of the files, not once per use). It returns v.
func (v *Value[T]) WhenStale(f func(error)) *Value[T] {
	v.stale = f
	return v
}

// Get returns the value, loading it first when it was never loaded or a file changed. Before the
// first good load it returns the load's (or the stat's) error.
func (v *Value[T]) Get() (T, error) {
	stamps := make([]os.FileInfo, len(v.paths))
	var statErr error
	for i, p := range v.paths {
		fi, err := os.Stat(p)
		stamps[i] = fi
		if statErr == nil {
			statErr = err
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if statErr == nil && v.loaded && same(stamps, v.stamps) {
		return v.val, nil
	}
	if statErr == nil && v.failed != nil && same(stamps, v.failed) {
		return v.val, nil // known not to load: keep the last good value without reading again
	}
	val, err := v.load()
	if err == nil {
		err = statErr // a file went away after it was read: the value is not trusted yet
	}
	if err != nil {
		if !v.loaded {
			return val, err
		}
		if statErr == nil {
			v.failed = stamps
		}
		if v.stale != nil && err.Error() != v.told {
			v.told = err.Error()
			v.stale(err)
		}
		return v.val, nil
	}
	v.failed, v.told = nil, ""
	v.val, v.stamps, v.loaded = val, stamps, true
	return val, nil
}

// same reports whether every file is the one stamped before, unchanged.
func same(now, before []os.FileInfo) bool {
	for i := range now {
		if !os.SameFile(now[i], before[i]) || now[i].Size() != before[i].Size() || !now[i].ModTime().Equal(before[i].ModTime()) {
			return false
		}
	}
	return true
}

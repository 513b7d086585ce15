package controller

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
	"github.com/epd-dev/coordinator/dataplane/render"
)

// The files of ConfigMap tokenizers, copied into a private directory so that the operator builds
// the pipeline with them the way a coordinator pod would read its mount. A copy is made once per
// ConfigMap version (UID and resourceVersion) and shared by the reconciles that need it; at most
// maxTokenizerCopies unused copies are kept (a ConfigMap holds at most 1 MiB, so a few MiB of
// disk), the least recently used removed first, and all of them when the manager stops.

// maxTokenizerCopies bounds the copies kept when no reconcile uses them.
const maxTokenizerCopies = 16

// tokenizerCopy is the files of one ConfigMap version.
type tokenizerCopy struct {
	key types.UID // uid/resourceVersion
	// dir holds one file per key; revision is tokenizerRevision of the ConfigMap.
	dir, revision string
	refs          int    // reconciles using it; guarded by tokenizerCopies.mu
	used          uint64 // when it was last acquired (tokenizerCopies.clock)
}

// tokenizerCopies is the cache of copies. Its zero value is ready to use; the directory is
// created on first use, under the process's temporary directory ($TMPDIR, else /tmp: the
// manager's Deployment mounts an emptyDir there, its root file system is read-only).
type tokenizerCopies struct {
	mu      sync.Mutex
	root    string
	clock   uint64
	entries map[types.UID]*tokenizerCopy
	// closing: the manager stops; copies are removed as soon as no reconcile uses them.
	closing bool
}

func copyKey(uid types.UID, resourceVersion string) types.UID {
	return uid + "/" + types.UID(resourceVersion)
}

// lookup acquires the copy of the ConfigMap version uid/resourceVersion, nil when there is none.
// Release it when done.
func (c *tokenizerCopies) lookup(uid types.UID, resourceVersion string) *tokenizerCopy {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[copyKey(uid, resourceVersion)]
	if e != nil {
		c.clock++
		e.refs++
		e.used = c.clock
	}
	return e
}

// add acquires the copy of cm, writing it when there is none. Release it when done.
func (c *tokenizerCopies) add(cm *corev1.ConfigMap) (*tokenizerCopy, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := copyKey(cm.UID, cm.ResourceVersion)
	if e := c.entries[key]; e != nil {
		c.clock++
		e.refs++
		e.used = c.clock
		return e, nil
	}
	if c.root == "" {
		root, err := os.MkdirTemp("", "coordinator-tokenizers-")
		if err != nil {
			return nil, fmt.Errorf("copying the tokenizer files of ConfigMap %s: %w", cm.Name, err)
		}
		c.root = root
		c.entries = map[types.UID]*tokenizerCopy{}
	}
	files := configMapFiles(cm)
	dir, err := writeFiles(c.root, files)
	if err != nil {
		return nil, fmt.Errorf("copying the tokenizer files of ConfigMap %s: %w", cm.Name, err)
	}
	c.clock++
	e := &tokenizerCopy{key: key, dir: dir, revision: render.Revision(files), refs: 1, used: c.clock}
	c.entries[key] = e
	c.evictLocked()
	return e, nil
}

// release gives back a copy acquired with lookup or add.
func (c *tokenizerCopies) release(e *tokenizerCopy) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.refs--
	c.evictLocked()
}

// evictLocked removes the least recently used unused copies beyond maxTokenizerCopies (every
// unused copy, and then the directory, once closing).
func (c *tokenizerCopies) evictLocked() {
	keep := maxTokenizerCopies
	if c.closing {
		keep = 0
	}
	if len(c.entries) > keep {
		var idle []*tokenizerCopy
		for _, e := range c.entries {
			if e.refs == 0 {
				idle = append(idle, e)
			}
		}
		slices.SortFunc(idle, func(a, b *tokenizerCopy) int { return cmp.Compare(a.used, b.used) })
		for _, e := range idle {
			if len(c.entries) <= keep {
				break
			}
			delete(c.entries, e.key)
			_ = os.RemoveAll(e.dir)
		}
	}
	if c.closing && len(c.entries) == 0 && c.root != "" {
		_ = os.RemoveAll(c.root)
		c.root = ""
	}
}

// close removes every copy: the unused ones now, the others when the reconciles using them
// release them (a reconcile still running while the manager stops finishes with its files). A
// copy added after close is removed on release.
func (c *tokenizerCopies) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closing = true
	c.evictLocked()
	return nil
}

// writeFiles writes files (a ConfigMap's, configMapFiles) into a new directory under root,
// readable by the operator only, the way the kubelet's ConfigMap volume does.
func writeFiles(root string, files map[string][]byte) (string, error) {
	dir, err := os.MkdirTemp(root, "cm-")
	if err != nil {
		return "", err
	}
	for name, data := range files {
		// The API server allows only [-._a-zA-Z0-9]+ keys, never . or ..: a key is one file name.
		if name == "" || name == "." || name == ".." || filepath.Base(name) != name {
			err = fmt.Errorf("key %q is not a file name", name)
		} else {
			err = os.WriteFile(filepath.Join(dir, name), data, 0o400)
		}
		if err != nil {
			_ = os.RemoveAll(dir)
			return "", err
		}
	}
	return dir, nil
}

// loadedTokenizers are the ConfigMap tokenizers of one reconcile.
type loadedTokenizers struct {
	// dirs maps each ConfigMap tokenizer's directory in the pods to its local copy.
	dirs localDirs
	// revisions are tokenizerRevision of each ConfigMap tokenizer, by tokenizer name.
	revisions map[string]string
	// missing is the first ConfigMap tokenizer whose ConfigMap does not exist (nil when all do).
	missing *tokenizerNotFoundError
	copies  []*tokenizerCopy
	cache   *tokenizerCopies
}

// release gives back the copies.
func (l *loadedTokenizers) release() {
	for _, e := range l.copies {
		l.cache.release(e)
	}
	l.copies = nil
}

// loadTokenizers reads the ConfigMap of every ConfigMap tokenizer of cp and acquires a copy of its
// files. A ConfigMap that does not exist is recorded in missing (steps, the configuration's render
// steps with a tokenizer, name what uses it); the error is an API failure. Release the result when
// done.
func (r *CoordinatorPipelineReconciler) loadTokenizers(ctx context.Context, cp *coordinatorv1alpha1.CoordinatorPipeline, steps []tokenizerStep) (*loadedTokenizers, error) {
	out := &loadedTokenizers{dirs: localDirs{}, revisions: map[string]string{}, cache: &r.tokenizerCopies}
	for i, t := range cp.Spec.Tokenizers {
		if t.ConfigMap == nil {
			continue
		}
		e, err := r.tokenizerConfigMap(ctx, cp.Namespace, t.ConfigMap.Name)
		if err != nil {
			out.release()
			return nil, err
		}
		if e == nil {
			// Nothing is validated or deployed until it exists: the other copies are not needed.
			out.release()
			return &loadedTokenizers{missing: missingTokenizer(cp, i, steps)}, nil
		}
		out.copies = append(out.copies, e)
		out.dirs[tokenizerDir(t.Name)] = e.dir
		out.revisions[t.Name] = e.revision
	}
	return out, nil
}

// tokenizerConfigMap acquires the copy of the files of ConfigMap namespace/name (nil when it does
// not exist). The ConfigMap's version comes from the metadata cache of referenced ConfigMaps
// (referencedConfigMaps), so that an unchanged ConfigMap is not read again; a version without a
// copy, or a ConfigMap the cache does not have (yet), is read from the API server.
func (r *CoordinatorPipelineReconciler) tokenizerConfigMap(ctx context.Context, namespace, name string) (*tokenizerCopy, error) {
	key := client.ObjectKey{Namespace: namespace, Name: name}
	if r.referencedConfigMaps != nil {
		meta := configMapMetadata()
		switch err := r.referencedConfigMaps.Get(ctx, key, meta); {
		case err == nil:
			if e := r.tokenizerCopies.lookup(meta.UID, meta.ResourceVersion); e != nil {
				return e, nil
			}
		case !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("reading ConfigMap %s: %w", name, err)
		}
	}
	cm := &corev1.ConfigMap{}
	switch err := r.APIReader.Get(ctx, key, cm); {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading ConfigMap %s: %w", name, err)
	}
	return r.tokenizerCopies.add(cm)
}

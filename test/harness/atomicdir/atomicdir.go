// Package atomicdir writes files into a directory the way kubelet updates a ConfigMap volume
// (its AtomicWriter): the payload goes into a fresh hidden, timestamped directory, a "..data_tmp"
// symlink to it is renamed over "..data" (one atomic step), each visible file is a symlink
// "name -> ..data/name", and the previous payload directory is removed. Tests and the demo use it to
// deliver the operator's rendered config to a coordinator exactly as a pod would see it.
package atomicdir

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

const (
	dataLink    = "..data"
	dataLinkTmp = "..data_tmp"
)

// Write replaces the payload of dir with files (name -> content).
func Write(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old, _ := os.Readlink(filepath.Join(dir, dataLink))
	ts, err := os.MkdirTemp(dir, ".."+time.Now().UTC().Format("2006_01_02_15_04_05."))
	if err != nil {
		return err
	}
	for name, content := range files {
		if strings.ContainsAny(name, "/") || strings.HasPrefix(name, "..") {
			return fmt.Errorf("atomicdir: invalid file name %q", name)
		}
		if err := os.WriteFile(filepath.Join(ts, name), content, 0o644); err != nil {
			return err
		}
	}
	tmp := filepath.Join(dir, dataLinkTmp)
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, dataLink)); err != nil {
		return err
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if target, err := os.Readlink(link); err == nil && target == filepath.Join(dataLink, name) {
			continue
		}
		_ = os.Remove(link)
		if err := os.Symlink(filepath.Join(dataLink, name), link); err != nil {
			return err
		}
	}
	if old != "" && old != filepath.Base(ts) {
		return os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}

package render

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// RevisionPrefix marks a tokenizer_revision that is a fingerprint of the files (Revision), which
// the render step checks against the directory; any other value is an opaque mark.
const RevisionPrefix = "sha256:"

// revisionLen is how many hex digits of the digest a revision keeps.
const revisionLen = 16

// Revision fingerprints a directory's files by name and content (a ConfigMap's keys, as a
// ConfigMap volume presents them): RevisionPrefix and 16 hex digits of a SHA-256 over the names,
// sorted, each name and content length-prefixed.
func Revision(files map[string][]byte) string {
	h := sha256.New()
	var n [8]byte
	for _, name := range slices.Sorted(maps.Keys(files)) {
		binary.BigEndian.PutUint64(n[:], uint64(len(name)))
		h.Write(n[:])
		h.Write([]byte(name))
		binary.BigEndian.PutUint64(n[:], uint64(len(files[name])))
		h.Write(n[:])
		h.Write(files[name])
	}
	return RevisionPrefix + hex.EncodeToString(h.Sum(nil))[:revisionLen]
}

// maxRevisionBytes bounds what DirRevision reads: a tokenizer directory the operator fingerprints
// is a ConfigMap's (at most 1 MiB); a larger one is not a ConfigMap's.
const maxRevisionBytes = 64 << 20

// DirRevision is the Revision of dir's regular files (names not starting with '.': a ConfigMap
// volume's ..data links are not keys; symbolic links followed, as the keys are links into ..data).
func DirRevision(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	files := map[string][]byte{}
	total := 0
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		fi, err := os.Stat(path)
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if total += int(fi.Size()); total > maxRevisionBytes {
			return "", fmt.Errorf("%s holds more than %d MiB of files", dir, maxRevisionBytes>>20)
		}
		if files[e.Name()], err = os.ReadFile(path); err != nil {
			return "", err
		}
	}
	return Revision(files), nil
}

package node

import (
	"archive/tar"
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// NonRootUID is the user distroless/static:nonroot runs as, and so the project's images.
const NonRootUID = 65532

// File is one regular file of an image: its content comes from Src (a path on the host) or Data.
type File struct {
	Src  string
	Data []byte
	Mode int64
}

// Image describes a single-layer image as a Dockerfile's final stage would make it on
// distroless/static:nonroot: the files, the user, entrypoint, cmd, labels and exposed ports. The
// base's own content that a static binary needs (/etc/passwd and /etc/group with root and nonroot,
// /tmp, /home/nonroot) is added by WriteTarball.
type Image struct {
	// Ref is the image reference it is imported as (e.g. ghcr.io/epd-dev/coordinator:v0.1.0).
	Ref        string
	Files      map[string]File
	User       string
	Entrypoint []string
	Cmd        []string
	Labels     map[string]string
	Ports      []string
	WorkingDir string
}

// baseFiles is what the project's images get from distroless/static:nonroot that matters here.
var baseFiles = map[string]File{
	"etc/passwd": {Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"), Mode: 0o644},
	"etc/group":  {Data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"), Mode: 0o644},
}

// WriteTarball writes img as a docker-save tarball (what `ctr images import` reads) to path.
func (img Image) WriteTarball(path string) error {
	layerBytes, err := img.layer()
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	})
	if err != nil {
		return err
	}
	i, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cfg, err := i.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cfg.Config.User = img.User
	cfg.Config.Entrypoint = img.Entrypoint
	cfg.Config.Cmd = img.Cmd
	cfg.Config.Labels = img.Labels
	cfg.Config.WorkingDir = img.WorkingDir
	cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if len(img.Ports) > 0 {
		cfg.Config.ExposedPorts = map[string]struct{}{}
		for _, p := range img.Ports {
			if !strings.Contains(p, "/") {
				p += "/tcp"
			}
			cfg.Config.ExposedPorts[p] = struct{}{}
		}
	}
	if i, err = mutate.ConfigFile(i, cfg); err != nil {
		return err
	}
	ref, err := name.ParseReference(img.Ref)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(path, ref, i)
}

// layer is the image's one layer: directories root-owned 0755 (/tmp 1777, /home/nonroot owned by
// nonroot), files root-owned with their mode, in a fixed order and with a fixed time, so the same
// inputs give the same digest.
func (img Image) layer() ([]byte, error) {
	files := map[string]File{}
	for k, v := range baseFiles {
		files[k] = v
	}
	for k, v := range img.Files {
		files[strings.TrimPrefix(k, "/")] = v
	}
	dirs := map[string]bool{"tmp": true, "home": true, "home/nonroot": true}
	for p := range files {
		for d := filepath.Dir(p); d != "." && d != "/"; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dirNames := sortedKeys(dirs)
	for _, d := range dirNames {
		h := &tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch}
		switch d {
		case "tmp":
			h.Mode = 0o1777
		case "home/nonroot":
			h.Mode, h.Uid, h.Gid = 0o700, NonRootUID, NonRootUID
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
	}
	for _, p := range sortedKeys(files) {
		f := files[p]
		data := f.Data
		if f.Src != "" {
			var err error
			if data, err = os.ReadFile(f.Src); err != nil {
				return nil, err
			}
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: mode, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// DockerfileLabels reads the LABEL key="value" pairs of a Dockerfile's final stage, so that an
// image built here carries what the Dockerfile says (the configuration schema label included).
func DockerfileLabels(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{}
	var instr string
	sc := bufio.NewScanner(bytes.NewReader(data))
	flush := func() error {
		op, rest, _ := strings.Cut(strings.TrimSpace(instr), " ")
		instr = ""
		switch strings.ToUpper(op) {
		case "FROM":
			clear(labels) // only the final stage's labels count
		case "LABEL":
			for _, kv := range splitLabelPairs(rest) {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return fmt.Errorf("%s: LABEL %q is not key=value", path, kv)
				}
				labels[k] = strings.Trim(v, `"`)
			}
		}
		return nil
	}
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && instr == "") {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			instr += strings.TrimSuffix(line, `\`) + " "
			continue
		}
		instr += line
		if err := flush(); err != nil {
			return nil, err
		}
	}
	return labels, sc.Err()
}

// splitLabelPairs splits `a="x y" b="z"` on the spaces outside quotes.
func splitLabelPairs(s string) []string {
	var out []string
	var cur strings.Builder
	quoted := false
	for _, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
			cur.WriteRune(r)
		case (r == ' ' || r == '\t') && !quoted:
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

// GoBuildStatic builds pkg (a package path or ./dir relative to dir) as a static binary the way the
// Dockerfiles do: CGO_ENABLED=0, -trimpath, -ldflags "-s -w ...".
func GoBuildStatic(dir, pkg, out, ldflags string) error {
	if ldflags == "" {
		ldflags = "-s -w"
	}
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", ldflags, "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

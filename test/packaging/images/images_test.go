package images_test

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"debug/elf"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/internal/controller"
	"github.com/epd-dev/coordinator/test/harness/prereq"
)

// images are the two images and what they contain.
var images = []struct {
	dockerfile, binary, pkg string
}{
	{"Dockerfile", "manager", "./cmd/manager"},
	{"Dockerfile.coordinator", "coordinator", "./cmd/coordinator"},
}

const (
	// Build arguments the test passes, as `docker build --build-arg` would.
	testVersion = "v0.0.0-imagetest"
	testCommit  = "0123abc"
	// nonroot is the UID and GID of gcr.io/distroless/static:nonroot.
	nonroot = 65532
)

// The Dockerfiles build static binaries of the right packages and ship them on distroless as the
// nonroot user.
func TestDockerfiles(t *testing.T) {
	for _, img := range images {
		t.Run(img.dockerfile, func(t *testing.T) {
			df := parseDockerfile(t, img.dockerfile)
			if df.buildEnv["CGO_ENABLED"] != "0" {
				t.Errorf("%s: CGO_ENABLED=%q, want 0 (a static binary for distroless/static)", df, df.buildEnv["CGO_ENABLED"])
			}
			if df.buildEnv["GOOS"] != "${TARGETOS}" || df.buildEnv["GOARCH"] != "${TARGETARCH}" {
				t.Errorf("%s: GOOS/GOARCH = %q/%q, want ${TARGETOS}/${TARGETARCH} (cross-compiled for the target platform)", df, df.buildEnv["GOOS"], df.buildEnv["GOARCH"])
			}
			if !hasFlag(df.buildArgs, "-trimpath") {
				t.Errorf("%s: no -trimpath", df)
			}
			ldflags, _ := flagValue(df.buildArgs, "-ldflags")
			for _, want := range []string{"-X main.version=${VERSION}", "-X main.commit=${COMMIT}"} {
				if !strings.Contains(ldflags, want) {
					t.Errorf("%s: -ldflags %q lacks %q", df, ldflags, want)
				}
			}
			if out, _ := flagValue(df.buildArgs, "-o"); out != "/out/"+img.binary {
				t.Errorf("%s: -o %q, want /out/%s", df, out, img.binary)
			}
			if pkg := df.buildArgs[len(df.buildArgs)-1]; pkg != img.pkg {
				t.Errorf("%s builds %s, want %s", df, pkg, img.pkg)
			}

			if df.base != "gcr.io/distroless/static:nonroot" {
				t.Errorf("%s: final image FROM %s, want gcr.io/distroless/static:nonroot", df.path, df.base)
			}
			if df.user != "65532:65532" {
				t.Errorf("%s: USER %q, want 65532:65532 (distroless nonroot)", df.path, df.user)
			}
			if !slices.Contains(df.finalCopies, "--from=builder /out/"+img.binary+" /"+img.binary) {
				t.Errorf("%s: the final stage does not COPY /out/%s to /%s: %q", df.path, img.binary, img.binary, df.finalCopies)
			}
			if df.entrypoint != `["/`+img.binary+`"]` {
				t.Errorf("%s: ENTRYPOINT %s, want [\"/%s\"]", df.path, df.entrypoint, img.binary)
			}

			// The builder COPYs every directory the binary's packages live in.
			for _, dir := range moduleDirs(t, img.pkg) {
				covered := slices.ContainsFunc(df.copies, func(src string) bool {
					src = strings.TrimSuffix(src, "/")
					return dir == src || strings.HasPrefix(dir, src+"/")
				})
				if !covered {
					t.Errorf("%s: %s needs %s, which no COPY brings into the build", df.path, img.pkg, dir)
				}
			}
			for _, f := range []string{"go.mod", "go.sum"} {
				if !slices.Contains(df.copies, f) {
					t.Errorf("%s: %s is not copied", df.path, f)
				}
			}
		})
	}

	// The coordinator image runs its baked-in configuration where the operator mounts the
	// rendered one.
	df := parseDockerfile(t, "Dockerfile.coordinator")
	if want := `["--config", "` + controller.ConfigPath + `"]`; df.cmd != want {
		t.Errorf("Dockerfile.coordinator: CMD %s, want %s", df.cmd, want)
	}
	if !slices.Contains(df.finalCopies, "config/coordinator/coordinator.yaml "+controller.ConfigPath) {
		t.Errorf("Dockerfile.coordinator does not ship config/coordinator/coordinator.yaml at %s", controller.ConfigPath)
	}
}

// moduleDirs lists the repository directories (relative) of the module's packages pkg is built
// from.
func moduleDirs(t *testing.T, pkg string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", `{{if .Module}}{{if eq .Module.Path "github.com/epd-dev/coordinator"}}{{.Dir}}{{end}}{{end}}`, pkg)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, d := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(abs, d)
		if err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, filepath.ToSlash(rel))
	}
	if len(dirs) == 0 {
		t.Fatalf("go list -deps %s: no packages of the module", pkg)
	}
	return dirs
}

var (
	builds   sync.Map // binary -> *buildResult
	binDirMu sync.Mutex
	binDir   string
)

type buildResult struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

// build compiles img's binary with its Dockerfile's `go build` line (ARGs set like
// `docker build --build-arg VERSION=... --build-arg COMMIT=...` for this machine's platform) into
// a directory every user can read, once per test binary.
func build(t *testing.T, dockerfile, binary string) string {
	t.Helper()
	v, _ := builds.LoadOrStore(binary, &buildResult{})
	r := v.(*buildResult)
	r.once.Do(func() {
		df := parseDockerfile(t, dockerfile)
		vars := map[string]string{}
		for k, v := range df.args {
			vars[k] = v
		}
		vars["TARGETOS"], vars["TARGETARCH"] = runtime.GOOS, runtime.GOARCH
		vars["VERSION"], vars["COMMIT"] = testVersion, testCommit
		r.path = filepath.Join(sharedBinDir(t), binary)

		args := make([]string, len(df.buildArgs))
		for i, a := range df.buildArgs {
			args[i] = expand(t, a, vars)
		}
		for i := range args {
			if args[i] == "-o" {
				args[i+1] = r.path
			}
		}
		cmd := exec.Command("go", append([]string{"build"}, args...)...)
		cmd.Dir = root
		cmd.Env = os.Environ()
		for k, v := range df.buildEnv {
			cmd.Env = append(cmd.Env, k+"="+expand(t, v, vars))
		}
		r.out, r.err = cmd.CombinedOutput()
	})
	if r.err != nil {
		t.Fatalf("building %s as %s does: %v\n%s", binary, dockerfile, r.err, r.out)
	}
	return r.path
}

// sharedBinDir is a world-readable directory for the binaries (the nonroot user runs them).
func sharedBinDir(t *testing.T) string {
	binDirMu.Lock()
	defer binDirMu.Unlock()
	if binDir == "" {
		d, err := os.MkdirTemp("", "images-test-")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
		binDir = d
	}
	return binDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// Each binary carries the Dockerfile's build settings, is statically linked, and answers --help.
func TestBinaries(t *testing.T) {
	for _, img := range images {
		t.Run(img.binary, func(t *testing.T) {
			bin := build(t, img.dockerfile, img.binary)

			info, err := buildinfo.ReadFile(bin)
			if err != nil {
				t.Fatal(err)
			}
			settings := map[string]string{}
			for _, s := range info.Settings {
				settings[s.Key] = s.Value
			}
			if settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" {
				t.Errorf("build settings CGO_ENABLED=%q -trimpath=%q, want 0 and true", settings["CGO_ENABLED"], settings["-trimpath"])
			}
			// With -trimpath the build info omits -ldflags: look for the -X values themselves.
			data, err := os.ReadFile(bin)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range []string{testVersion, testCommit} {
				if !bytes.Contains(data, []byte(v)) {
					t.Errorf("%s does not contain %q: the Dockerfile's -ldflags -X did not apply", img.binary, v)
				}
			}
			if info.Path != "github.com/epd-dev/coordinator/"+strings.TrimPrefix(img.pkg, "./") {
				t.Errorf("main package %s, want %s", info.Path, img.pkg)
			}

			if runtime.GOOS == "linux" {
				f, err := elf.Open(bin)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				for _, p := range f.Progs {
					if p.Type == elf.PT_INTERP {
						t.Errorf("%s has a dynamic loader (PT_INTERP): not static", img.binary)
					}
				}
				if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
					t.Errorf("%s links shared libraries %v", img.binary, libs)
				}
			}

			out, err := runAsImageUser(t, bin, nil, "--help").CombinedOutput()
			if err != nil {
				t.Fatalf("%s --help: %v\n%s", img.binary, err, out)
			}
			want := map[string]string{"manager": "-coordinator-image", "coordinator": "--config"}[img.binary]
			if !strings.Contains(string(out), want) {
				t.Errorf("%s --help does not mention %s:\n%s", img.binary, want, out)
			}
		})
	}
}

// The coordinator binary, started the way its image starts it (the annotated
// config/coordinator/coordinator.yaml, as the nonroot user, with no HOME or writable working
// directory), becomes ready and shuts down cleanly on SIGTERM.
func TestCoordinatorServesWithTheAnnotatedConfig(t *testing.T) {
	bin := build(t, "Dockerfile.coordinator", "coordinator")

	// The image's /etc/coordinator/coordinator.yaml, in a directory the nonroot user can read.
	etc := filepath.Join(sharedBinDir(t), "etc", "coordinator")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(root, "config/coordinator/coordinator.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(etc, "coordinator.yaml")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		t.Fatal(err)
	}

	apiPort, metricsPort := freePort(t), freePort(t)
	var logs bytes.Buffer
	cmd := runAsImageUser(t, bin, []string{
		"COORDINATOR_SERVER_LISTEN_ADDR=127.0.0.1:" + strconv.Itoa(apiPort),
		"COORDINATOR_SERVER_METRICS_PORT=" + strconv.Itoa(metricsPort),
	}, "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-done //nolint:errcheck // the kill's exit error
		}
	}()

	base := "http://127.0.0.1:" + strconv.Itoa(apiPort)
	deadline := time.Now().Add(30 * time.Second)
	for {
		status, err := get(base + "/readyz")
		if err == nil && status == http.StatusOK {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the coordinator exited before it was ready: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz not 200 within 30s (last: %d, %v)\n%s", status, err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Run("as UID 65532", func(t *testing.T) {
		if os.Geteuid() != 0 || runtime.GOOS != "linux" {
			prereq.Missing(t, "checking the image user needs root on Linux (to switch to UID %d); running as UID %d on %s", nonroot, os.Geteuid(), runtime.GOOS)
		}
		status, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/status")
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^Uid:\s+65532\s`).Match(status) {
			t.Errorf("the coordinator does not run as UID 65532:\n%s", status)
		}
	})
	if status, err := get("http://127.0.0.1:" + strconv.Itoa(metricsPort) + "/metrics"); err != nil || status != http.StatusOK {
		t.Errorf("GET /metrics on the metrics port: %d, %v", status, err)
	}
	if !strings.Contains(logs.String(), testVersion) {
		t.Errorf("the start-up log does not show the -ldflags version %s:\n%s", testVersion, logs.String())
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("still running 30s after SIGTERM\n%s", logs.String())
	}
}

// runAsImageUser prepares bin to run like in its image: as UID/GID 65532 when the test can switch
// users (it runs as root), in /, with a minimal environment plus extraEnv.
func runAsImageUser(t *testing.T, bin string, extraEnv []string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(context.Background(), bin, args...)
	cmd.Dir = "/"
	cmd.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, extraEnv...)
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nonroot, Gid: nonroot}}
	} else {
		t.Logf("not root: running %s as UID %d instead of %d", filepath.Base(bin), os.Geteuid(), nonroot)
	}
	return cmd
}

func get(url string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// The packaging libraries (Helm, operator-framework, kustomize) stay in the test and generator
// packages: neither image's binary links them.
func TestBinariesDoNotLinkPackagingLibraries(t *testing.T) {
	for _, img := range images {
		cmd := exec.Command("go", "list", "-deps", img.pkg)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", img.pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, banned := range []string{"helm.sh/", "github.com/operator-framework/", "sigs.k8s.io/kustomize/", "github.com/epd-dev/coordinator/hack/"} {
				if strings.HasPrefix(dep, banned) {
					t.Errorf("%s links %s", img.pkg, dep)
				}
			}
		}
	}
}

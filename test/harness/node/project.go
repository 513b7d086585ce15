package node

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The project's images as the node imports them. Their tags are not "latest", so a pod without
// an imagePullPolicy uses the imported image (IfNotPresent) and never tries a registry.
const (
	OperatorImage    = "ghcr.io/epd-dev/coordinator-operator:node"
	CoordinatorImage = "ghcr.io/epd-dev/coordinator:node"
	// SimImage is llm-d's vLLM simulator behind tcpfront (cmd/tcpfront): the simulator listens on
	// 127.0.0.1:8001 in the pod, tcpfront on :8000. Pod args are the simulator's flags.
	SimImage = "ghcr.io/llm-d/llm-d-inference-sim:node"
	// SimPort is the simulator pods' port (tcpfront's).
	SimPort = 8000
)

// ProjectImages builds the operator and coordinator images as Dockerfile and
// Dockerfile.coordinator describe them (static binaries built with their go build line, user
// 65532:65532, the final stage's labels, entrypoint, cmd, exposed ports and the coordinator's
// default configuration) and the simulator image from simXZ (the xz-compressed simulator binary of
// ../shared/peers, or the binary itself when the name does not end in .xz), writing the binaries
// under dir.
func ProjectImages(root, dir, simXZ string) ([]Image, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	commit := "unknown"
	if out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output(); err == nil {
		commit = strings.TrimSpace(string(out))
	}
	ldflags := fmt.Sprintf("-s -w -X main.version=node -X main.commit=%s", commit)
	bins := map[string]string{"coordinator": "./cmd/coordinator", "manager": "./cmd/manager", "tcpfront": "./test/harness/node/cmd/tcpfront"}
	for name, pkg := range bins {
		if err := GoBuildStatic(root, pkg, filepath.Join(dir, name), ldflags); err != nil {
			return nil, err
		}
	}
	sim := filepath.Join(dir, "llm-d-inference-sim")
	if strings.HasSuffix(simXZ, ".xz") {
		if err := xzDecompress(simXZ, sim); err != nil {
			return nil, err
		}
	} else {
		sim = simXZ
	}
	coordLabels, err := DockerfileLabels(filepath.Join(root, "Dockerfile.coordinator"))
	if err != nil {
		return nil, err
	}
	opLabels, err := DockerfileLabels(filepath.Join(root, "Dockerfile"))
	if err != nil {
		return nil, err
	}
	user := fmt.Sprintf("%d:%d", NonRootUID, NonRootUID)
	return []Image{
		{Ref: CoordinatorImage, User: user, WorkingDir: "/", Labels: coordLabels, Ports: []string{"8080", "9090"},
			Entrypoint: []string{"/coordinator"}, Cmd: []string{"--config", "/etc/coordinator/coordinator.yaml"},
			Files: map[string]File{
				"coordinator":                      {Src: filepath.Join(dir, "coordinator"), Mode: 0o755},
				"etc/coordinator/coordinator.yaml": {Src: filepath.Join(root, "config", "coordinator", "coordinator.yaml"), Mode: 0o644},
			}},
		{Ref: OperatorImage, User: user, WorkingDir: "/", Labels: opLabels, Entrypoint: []string{"/manager"},
			Files: map[string]File{"manager": {Src: filepath.Join(dir, "manager"), Mode: 0o755}}},
		{Ref: SimImage, User: user, WorkingDir: "/",
			Entrypoint: []string{"/tcpfront", "--listen", fmt.Sprintf(":%d", SimPort), "--to", "127.0.0.1:8001", "--", "/llm-d-inference-sim", "--port", "8001"},
			Files: map[string]File{
				"tcpfront":            {Src: filepath.Join(dir, "tcpfront"), Mode: 0o755},
				"llm-d-inference-sim": {Src: sim, Mode: 0o755},
			}},
	}, nil
}

func xzDecompress(src, dst string) error {
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	cmd := exec.Command("xz", "-dc", src)
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = out, &stderr
	if err := cmd.Run(); err != nil {
		out.Close()
		return fmt.Errorf("xz -dc %s: %w: %s", src, err, stderr.String())
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, 0o755)
}

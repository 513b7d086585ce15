#!/usr/bin/env bash
# node-assets.sh builds the binaries of a real single-node Kubernetes (kubelet, kube-controller-manager,
# kube-scheduler, kube-proxy, and CoreDNS) from the Go module proxy into a cache outside the
# repository, next to the envtest assets (hack/setup-envtest-assets.sh, whose kube-apiserver, etcd and
# kubectl the node uses too), and prints the directory. The Kubernetes binaries are built at the
# envtest kube-apiserver's version; nothing is downloaded but Go modules. docs/node.md.
#
# Idempotent: a binary whose --version already matches is not rebuilt. The envtest script's lock
# keeps two builds from running at once.
#
# Usage: NODE_ASSETS=$(hack/node-assets.sh)
# Progress goes to stderr; only the asset directory is printed on stdout.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-1.37.2}"
# CoreDNS as Kubernetes 1.37's kubeadm pins it (cmd/kubeadm/app/constants: CoreDNSVersion).
COREDNS_VERSION="${COREDNS_VERSION:-1.14.7}"
ASSETS="${ENVTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/epd-coordinator}/node/${KUBE_VERSION}-linux-amd64"
LOG_PREFIX=node-assets
# shellcheck source=hack/assets-lib.sh
. "$(dirname "$0")/assets-lib.sh"
assets_lock "$ASSETS"

export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
# NICE (default 10): these builds share the machine with other work.
NICE="${NICE:-10}"

ver="v${KUBE_VERSION}"
kube_cmds="kubelet kube-controller-manager kube-scheduler kube-proxy"
need_kube=""
for cmd in $kube_cmds; do
  has_version "$ASSETS/$cmd" "Kubernetes $ver" || need_kube="$need_kube $cmd"
done

if [ -n "$need_kube" ]; then
  mod="$WORK/kubernetes-node-${KUBE_VERSION}"
  mkdir -p "$mod"
  cd "$mod"
  if [ ! -f .resolved ]; then
    log "resolving k8s.io/kubernetes v${KUBE_VERSION} (node commands) from the module proxy"
    # shellcheck disable=SC2086
    kube_module node-assets/kubernetes $kube_cmds
    touch .resolved
  fi
  ldflags=$(kube_ldflags)
  # One go build for all of them: the packages they share compile once and the links run in
  # parallel.
  log "building$need_kube $ver (minutes on a cold build cache)"
  pkgs=""
  for cmd in $need_kube; do pkgs="$pkgs k8s.io/kubernetes/cmd/$cmd"; done
  rm -rf "$ASSETS/.build" && mkdir -p "$ASSETS/.build"
  # shellcheck disable=SC2086
  nice -n "$NICE" go build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$ldflags" -o "$ASSETS/.build/" $pkgs
  for cmd in $need_kube; do mv "$ASSETS/.build/$cmd" "$ASSETS/$cmd"; done
  rmdir "$ASSETS/.build"
fi

if ! has_version "$ASSETS/coredns" "CoreDNS-${COREDNS_VERSION}"; then
  mod="$WORK/coredns-${COREDNS_VERSION}"
  mkdir -p "$mod"
  cd "$mod"
  if [ ! -f .resolved ]; then
    log "resolving CoreDNS v${COREDNS_VERSION} from the module proxy"
    rm -f go.mod go.sum
    go mod init node-assets/coredns >/dev/null 2>&1
    go get "github.com/coredns/coredns@v${COREDNS_VERSION}" >&2
    touch .resolved
  fi
  # CoreDNS with the plugins of the node's Corefile only (test/harness/node/coredns.go), in
  # CoreDNS's plugin.cfg order, as its docs build a custom server: not compiling the other plugins
  # (cloud DNS providers and their SDKs) saves most of the build.
  cat > main.go <<'GO'
// Command coredns is CoreDNS with the plugins the node tier's Corefile uses.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"ready", "health", "errors", "cache", "kubernetes", "forward"}
}

func main() { coremain.Run() }
GO
  log "building CoreDNS v${COREDNS_VERSION} (errors, health, ready, cache, kubernetes, forward)"
  nice -n "$NICE" go build -trimpath -ldflags "-s -w" -o "$ASSETS/coredns.tmp" .
  mv "$ASSETS/coredns.tmp" "$ASSETS/coredns"
fi

echo "$ASSETS"

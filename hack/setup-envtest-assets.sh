#!/usr/bin/env bash
# setup-envtest-assets.sh builds the envtest control plane (kube-apiserver, etcd, kubectl) from the
# Go module proxy into a cache outside the repository and prints the directory to use as
# KUBEBUILDER_ASSETS. setup-envtest's binary downloads are not reachable from our build machines; the
# module proxy is. Idempotent: a binary whose --version already matches is not rebuilt. A lock keeps
# two runs (e.g. parallel `make` targets) from building at once.
#
# Usage: KUBEBUILDER_ASSETS=$(hack/setup-envtest-assets.sh)
# Progress goes to stderr; only the asset directory is printed on stdout.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-3.7.3}"
ASSETS="${ENVTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/epd-coordinator}/k8s/${KUBE_VERSION}-linux-amd64"
LOG_PREFIX=envtest-assets
# shellcheck source=hack/assets-lib.sh
. "$(dirname "$0")/assets-lib.sh"
assets_lock "$ASSETS"

need_kube=0
has_version "$ASSETS/kube-apiserver" "v${KUBE_VERSION}" || need_kube=1
has_version "$ASSETS/kubectl" "v${KUBE_VERSION}" || need_kube=1
need_etcd=0
has_version "$ASSETS/etcd" "etcd Version: ${ETCD_VERSION}" || need_etcd=1

export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0

if [ "$need_kube" = 1 ]; then
  mod="$WORK/kubernetes-${KUBE_VERSION}"
  mkdir -p "$mod"
  cd "$mod"
  if [ ! -f go.mod ]; then
    log "resolving k8s.io/kubernetes v${KUBE_VERSION} from the module proxy"
    kube_module envtest-assets/kubernetes kube-apiserver kubectl
  fi
  ver="v${KUBE_VERSION}"
  ldflags=$(kube_ldflags)
  for cmd in kube-apiserver kubectl; do
    if ! has_version "$ASSETS/$cmd" "$ver"; then
      log "building $cmd $ver (the first build takes several minutes)"
      go build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$ldflags" -o "$ASSETS/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
      mv "$ASSETS/$cmd.tmp" "$ASSETS/$cmd"
    fi
  done
fi

if [ "$need_etcd" = 1 ]; then
  mod="$WORK/etcd-${ETCD_VERSION}"
  mkdir -p "$mod"
  cd "$mod"
  if [ ! -f go.mod ]; then
    log "resolving etcd v${ETCD_VERSION} from the module proxy"
    go mod init envtest-assets/etcd >/dev/null 2>&1
    go get "go.etcd.io/etcd/server/v3@v${ETCD_VERSION}" >&2
  fi
  log "building etcd v${ETCD_VERSION}"
  go build -trimpath -ldflags "-s -w" -o "$ASSETS/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$ASSETS/etcd.tmp" "$ASSETS/etcd"
fi

echo "$ASSETS"

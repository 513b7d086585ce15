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
CACHE_ROOT="${ENVTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/epd-coordinator}"
ASSETS="$CACHE_ROOT/k8s/${KUBE_VERSION}-linux-amd64"
WORK="$CACHE_ROOT/build"

log() { printf '[envtest-assets] %s\n' "$*" >&2; }

mkdir -p "$ASSETS" "$WORK"
exec 9>"$CACHE_ROOT/.lock"
if ! flock -n 9; then
  log "another build holds $CACHE_ROOT/.lock; waiting"
  flock 9
fi

has_version() { # binary, expected substring
  [ -x "$1" ] || return 1
  local out
  # Capture first: `cmd | grep -q` can fail under pipefail when grep exits before cmd finishes.
  case "$(basename "$1")" in
    kubectl) out=$("$1" version --client 2>/dev/null) || return 1 ;;
    *) out=$("$1" --version 2>/dev/null) || return 1 ;;
  esac
  [[ "$out" == *"$2"* ]]
}

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
    go mod init envtest-assets/kubernetes >/dev/null 2>&1
    go mod edit -require="k8s.io/kubernetes@v${KUBE_VERSION}"
    go mod download "k8s.io/kubernetes@v${KUBE_VERSION}"
    kdir=$(go mod download -json "k8s.io/kubernetes@v${KUBE_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    # kubernetes replaces every staging module with ./staging/src/...; point each at the proxy's
    # published v0.X.Y instead.
    minor=${KUBE_VERSION#1.}
    for m in $(sed -n 's/^[[:space:]]*\(k8s\.io\/[^[:space:]]*\) => \.\/staging\/src\/.*/\1/p' "$kdir/go.mod"); do
      go mod edit -replace="$m=$m@v0.${minor}"
    done
    log "resolving kube-apiserver and kubectl dependencies"
    go get "k8s.io/kubernetes/cmd/kube-apiserver@v${KUBE_VERSION}" "k8s.io/kubernetes/cmd/kubectl@v${KUBE_VERSION}" >&2
  fi
  ver="v${KUBE_VERSION}"; major=${KUBE_VERSION%%.*}; minor=${KUBE_VERSION#*.}; minor=${minor%%.*}
  ldflags="-s -w"
  for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ldflags="$ldflags -X $p.gitVersion=$ver -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
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

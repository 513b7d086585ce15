# assets-lib.sh: what hack/setup-envtest-assets.sh and hack/node-assets.sh share. Source it after
# setting LOG_PREFIX and KUBE_VERSION; it sets CACHE_ROOT and WORK and defines the functions below.
# shellcheck shell=bash

CACHE_ROOT="${ENVTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/epd-coordinator}"
WORK="$CACHE_ROOT/build"

log() { printf '[%s] %s\n' "$LOG_PREFIX" "$*" >&2; }

# assets_lock creates the asset directory $1 and the build directory, then takes the cache's lock
# (fd 9, held until the script exits): one build at a time per machine.
assets_lock() {
  mkdir -p "$1" "$WORK"
  exec 9>"$CACHE_ROOT/.lock"
  if ! flock -n 9; then
    log "another build holds $CACHE_ROOT/.lock; waiting"
    flock 9
  fi
}

# has_version: binary $1 exists and its version output contains $2 (kubectl's client version;
# --version, or -version for the commands that only take that).
has_version() {
  [ -x "$1" ] || return 1
  local out
  # Capture first: `cmd | grep -q` can fail under pipefail when grep exits before cmd finishes.
  case "$(basename "$1")" in
    kubectl) out=$("$1" version --client 2>/dev/null) || return 1 ;;
    *) out=$("$1" --version 2>/dev/null) || out=$("$1" -version 2>/dev/null) || return 1 ;;
  esac
  [[ "$out" == *"$2"* ]]
}

# kube_module resolves, in the current (empty) directory named module $1, k8s.io/kubernetes at
# KUBE_VERSION with each staging module it replaces by ./staging/src pointed at the proxy's
# published v0.X.Y instead, then go-gets the commands $2... of it.
kube_module() {
  local name=$1 kdir m minor=${KUBE_VERSION#1.}
  shift
  rm -f go.mod go.sum
  go mod init "$name" >/dev/null 2>&1
  go mod edit -require="k8s.io/kubernetes@v${KUBE_VERSION}"
  go mod download "k8s.io/kubernetes@v${KUBE_VERSION}"
  kdir=$(go mod download -json "k8s.io/kubernetes@v${KUBE_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  for m in $(sed -n 's/^[[:space:]]*\(k8s\.io\/[^[:space:]]*\) => \.\/staging\/src\/.*/\1/p' "$kdir/go.mod"); do
    go mod edit -replace="$m=$m@v0.${minor}"
  done
  log "resolving the dependencies of $*"
  local args=() cmd
  for cmd in "$@"; do args+=("k8s.io/kubernetes/cmd/$cmd@v${KUBE_VERSION}"); done
  go get "${args[@]}" >&2
}

# kube_ldflags are the link flags that stamp KUBE_VERSION into a Kubernetes command's --version.
kube_ldflags() {
  local ver="v${KUBE_VERSION}" major=${KUBE_VERSION%%.*} minor=${KUBE_VERSION#*.} p flags="-s -w"
  minor=${minor%%.*}
  for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    flags="$flags -X $p.gitVersion=$ver -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  printf '%s' "$flags"
}

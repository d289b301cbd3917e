#!/usr/bin/env bash
# Builds kwok (sigs.k8s.io/kwok v0.8.0) from Go modules into a cache
# directory, with the Stage objects kwokctl gives it by default, or reuses
# what is there when its version and sources match:
#
#   kwok          sigs.k8s.io/kwok/cmd/kwok, pinned by hack/kwok/go.mod
#   stages.yaml   node-initialize, node-heartbeat-with-lease, pod-ready,
#                 pod-complete and pod-delete from the same module
#                 (kustomize/stage/...), for kwok --config
#
#   hack/build-kwok.sh            build or reuse; prints the directory
#   hack/build-kwok.sh --force    rebuild even when the binary matches
#
# The directory is $DPKIT_KWOK_BIN when set, otherwise
# ${XDG_CACHE_HOME:-$HOME/.cache}/dpkit/kwok/v0.8.0, which is where
# BenchmarkKwokSim (test/e2e) looks. Only that benchmark uses kwok; tests
# do not. See docs/performance.md.
set -euo pipefail

KWOK_VERSION=v0.8.0

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/lib/build.sh
source "$root/hack/lib/build.sh"
out="${DPKIT_KWOK_BIN:-$(cache_dir kwok "$KWOK_VERSION")}"
force=false
case "${1:-}" in
  "") ;;
  --force) force=true ;;
  -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "build-kwok: unknown argument $1 (use --force or --help)" >&2; exit 2 ;;
esac

log() { echo "build-kwok: $*" >&2; }

mod="$root/hack/kwok"
# stamp identifies the sources: the module files pin every version.
stamp() {
  cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -d' ' -f1
}

# current reports whether kwok and its stages are there, built from the
# wanted module and the current module files.
current() {
  [[ -x "$out/kwok" && -f "$out/stages.yaml" && -f "$out/.stamp" ]] || return 1
  [[ "$(cat "$out/.stamp")" == "$(stamp)" ]] || return 1
  go version -m "$out/kwok" 2>/dev/null | grep -E "^[[:space:]]+(mod|dep)[[:space:]]+sigs.k8s.io/kwok[[:space:]]+${KWOK_VERSION}([[:space:]]|$)" >/dev/null || return 1
}

lock_dir "$out"

if ! $force && current; then
  log "reusing $out (kwok ${KWOK_VERSION})"
  echo "$out"
  exit 0
fi

ldflags="-s -w"

tmp="$(mktemp -d "$out/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
log "building kwok ${KWOK_VERSION} into $out (a cold build takes minutes)"
start=$SECONDS
sum="$(stamp)"
module_build "$mod" "$tmp" sigs.k8s.io/kwok/cmd/kwok

# The kwok binary ships no stages (kwokctl adds them); take kwokctl's
# defaults from the module itself so they match the binary.
src="$(cd "$mod" && GOFLAGS="${GOFLAGS:-} -mod=readonly" go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
first=true
for f in node/fast/node-initialize.yaml \
         node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
         pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
  $first || echo "---"
  first=false
  cat "$src/kustomize/stage/$f"
done >"$tmp/stages.yaml"

mv -f "$tmp/kwok" "$out/kwok"
mv -f "$tmp/stages.yaml" "$out/stages.yaml"
echo "$sum" >"$out/.stamp"
if ! current; then
  log "built kwok in $out does not report ${KWOK_VERSION}"
  exit 1
fi
log "built in $((SECONDS - start))s"
echo "$out"

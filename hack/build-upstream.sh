#!/usr/bin/env bash
# Builds the upstream interop binaries (Kubernetes v1.37.0) from Go modules
# into a cache directory, or reuses the binaries already there when their
# version and sources match:
#
#   sample-device-plugin   k8s.io/kubernetes/test/images/sample-device-plugin
#   kubelet-devicemanager  hack/tools/cmd/kubelet-devicemanager: the kubelet's
#                          device manager (pkg/kubelet/cm/devicemanager) run
#                          standalone
#   kubelet-dramanager     hack/tools/cmd/kubelet-dramanager: the kubelet's DRA
#                          manager (pkg/kubelet/cm/dra) run standalone
#
#   hack/build-upstream.sh            build or reuse; prints the directory
#   hack/build-upstream.sh --force    rebuild even when the binaries match
#
# The directory is $DPKIT_UPSTREAM_BIN when set, otherwise
# ${XDG_CACHE_HOME:-$HOME/.cache}/dpkit/upstream/v1.37.0, which is where
# test/upstream looks. See docs/upstream-interop.md.
set -euo pipefail

KUBE_VERSION=v1.37.0

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/lib/build.sh
source "$root/hack/lib/build.sh"
out="${DPKIT_UPSTREAM_BIN:-$(cache_dir upstream "$KUBE_VERSION")}"
force=false
case "${1:-}" in
  "") ;;
  --force) force=true ;;
  -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "build-upstream: unknown argument $1 (use --force or --help)" >&2; exit 2 ;;
esac

log() { echo "build-upstream: $*" >&2; }

tools="$root/hack/tools"
# stamp identifies the sources of the binaries: the module files and the
# program of our own. A change to either rebuilds.
stamp() {
  cat "$tools/go.mod" "$tools/go.sum" "$tools"/cmd/kubelet-devicemanager/*.go "$tools"/cmd/kubelet-dramanager/*.go | sha256sum | cut -d' ' -f1
}

# current reports whether the binaries are there, built from the wanted
# Kubernetes module and from the current sources.
current() {
  [[ -x "$out/sample-device-plugin" && -x "$out/kubelet-devicemanager" && -x "$out/kubelet-dramanager" && -f "$out/.stamp" ]] || return 1
  [[ "$(cat "$out/.stamp")" == "$(stamp)" ]] || return 1
  # The sample plugin has no version flag (it starts serving when run):
  # read the module versions recorded in the binary instead.
  go version -m "$out/sample-device-plugin" 2>/dev/null | grep -E "^[[:space:]]+(mod|dep)[[:space:]]+k8s.io/kubernetes[[:space:]]+${KUBE_VERSION}([[:space:]]|$)" >/dev/null || return 1
  for b in kubelet-devicemanager kubelet-dramanager; do
    "$out/$b" --version 2>/dev/null | grep -x "Kubernetes ${KUBE_VERSION}" >/dev/null || return 1
  done
}

lock_dir "$out"

if ! $force && current; then
  log "reusing $out (Kubernetes ${KUBE_VERSION})"
  echo "$out"
  exit 0
fi

ldflags="$(kube_ldflags "$KUBE_VERSION")"

tmp="$(mktemp -d "$out/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
log "building sample-device-plugin, kubelet-devicemanager and kubelet-dramanager (Kubernetes ${KUBE_VERSION}) into $out (a cold build takes minutes)"
start=$SECONDS
sum="$(stamp)"
tools_build "$tmp" \
  k8s.io/kubernetes/test/images/sample-device-plugin \
  ./cmd/kubelet-devicemanager \
  ./cmd/kubelet-dramanager
for b in sample-device-plugin kubelet-devicemanager kubelet-dramanager; do
  mv -f "$tmp/$b" "$out/$b"
done
echo "$sum" >"$out/.stamp"
if ! current; then
  log "built binaries in $out do not report Kubernetes ${KUBE_VERSION}"
  exit 1
fi
log "built in $((SECONDS - start))s"
echo "$out"

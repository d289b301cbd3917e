#!/usr/bin/env bash
# Builds the test control plane -- kube-apiserver, kube-scheduler and
# kube-controller-manager (Kubernetes v1.37.0) and etcd (v3.7.0) -- and
# kubectl v1.37.0, which the docs' recipes use, from Go modules into a cache
# directory, or reuses the binaries already there when their versions match.
#
#   hack/build-controlplane.sh            build or reuse; prints the directory
#   hack/build-controlplane.sh --force    rebuild even when the binaries match
#
# The directory is $DPKIT_CONTROLPLANE_BIN when set, otherwise
# ${XDG_CACHE_HOME:-$HOME/.cache}/dpkit/controlplane/v1.37.0, which is where
# test/controlplane looks. A cold build takes a few minutes on 2 cores; a
# cached one a few seconds. See docs/testing.md.
set -euo pipefail

KUBE_VERSION=v1.37.0
ETCD_VERSION=v3.7.0

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/lib/build.sh
source "$root/hack/lib/build.sh"
out="${DPKIT_CONTROLPLANE_BIN:-$(cache_dir controlplane "$KUBE_VERSION")}"
force=false
case "${1:-}" in
  "") ;;
  --force) force=true ;;
  -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "build-controlplane: unknown argument $1 (use --force or --help)" >&2; exit 2 ;;
esac

log() { echo "build-controlplane: $*" >&2; }

# current reports whether every binary in $out answers with the wanted version.
current() {
  [[ -x "$out/kube-apiserver" && -x "$out/kube-scheduler" && -x "$out/kube-controller-manager" && -x "$out/etcd" && -x "$out/kubectl" ]] || return 1
  "$out/kube-apiserver" --version 2>/dev/null | grep -qx "Kubernetes ${KUBE_VERSION}" || return 1
  "$out/kube-scheduler" --version 2>/dev/null | grep -qx "Kubernetes ${KUBE_VERSION}" || return 1
  "$out/kube-controller-manager" --version 2>/dev/null | grep -qx "Kubernetes ${KUBE_VERSION}" || return 1
  "$out/etcd" --version 2>/dev/null | grep -qx "etcd Version: ${ETCD_VERSION#v}" || return 1
  # Read whole: kubectl prints two lines, and grep -q quitting after the
  # first would fail it with SIGPIPE under pipefail.
  [[ "$("$out/kubectl" version --client 2>/dev/null)" == *"Client Version: ${KUBE_VERSION}"* ]] || return 1
}

lock_dir "$out"

if ! $force && current; then
  log "reusing $out (Kubernetes ${KUBE_VERSION}, etcd ${ETCD_VERSION})"
  echo "$out"
  exit 0
fi

ldflags="$(kube_ldflags "$KUBE_VERSION")"

tmp="$(mktemp -d "$out/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
log "building Kubernetes ${KUBE_VERSION} and etcd ${ETCD_VERSION} into $out (a cold build takes minutes)"
start=$SECONDS
tools_build "$tmp" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kubectl \
  ./cmd/etcd
for b in kube-apiserver kube-scheduler kube-controller-manager kubectl etcd; do
  mv -f "$tmp/$b" "$out/$b"
done
if ! current; then
  log "built binaries in $out do not report Kubernetes ${KUBE_VERSION} / etcd ${ETCD_VERSION}"
  exit 1
fi
log "built in $((SECONDS - start))s"
echo "$out"

#!/usr/bin/env bash
# Builds the test node's binaries from Go modules into a cache directory, or
# reuses the binaries already there when their versions and sources match:
#
#   kubelet                      k8s.io/kubernetes/cmd/kubelet v1.37.0 (hack/tools),
#                                or $DPKIT_KUBELET_VERSION: v1.34.4, v1.35.4 or
#                                v1.36.3 (hack/skew/v1.NN), the skew matrix
#   containerd, ctr,             github.com/containerd/containerd/v2 v2.4.2
#   containerd-shim-runc-v2      (hack/containerd; 2.x injects CDI devices)
#   pause                        test/controlplane/cmd/pause, the sandbox process
#
#   hack/build-node.sh            build or reuse; prints the directory
#   hack/build-node.sh --force    rebuild even when the binaries match
#
# runc and the reference CNI plugins (ptp, host-local, loopback) come from
# the system: apt-get install runc containernetworking-plugins busybox-static
# (busybox-static is the test node's busybox image). The directory is
# $DPKIT_NODE_BIN when set, otherwise
# ${XDG_CACHE_HOME:-$HOME/.cache}/dpkit/node/<kubelet version>, which is where
# test/controlplane looks (it reads $DPKIT_KUBELET_VERSION too). Same flags as the control plane (-trimpath,
# CGO_ENABLED=0), so the packages the kubelet shares with kube-apiserver
# compile once. See docs/testing.md.
set -euo pipefail

KUBE_VERSION="${DPKIT_KUBELET_VERSION:-v1.37.0}"
CONTAINERD_VERSION=v2.4.2

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/lib/build.sh
source "$root/hack/lib/build.sh"
out="${DPKIT_NODE_BIN:-$(cache_dir node "$KUBE_VERSION")}"
force=false
case "${1:-}" in
  "") ;;
  --force) force=true ;;
  -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "build-node: unknown argument $1 (use --force or --help)" >&2; exit 2 ;;
esac

log() { echo "build-node: $*" >&2; }

ctrmod="$root/hack/containerd"
# kubemod is the module the kubelet is built from: hack/tools for the
# control plane's version, hack/skew/v1.NN for an older kubelet.
case "$KUBE_VERSION" in
  v1.37.0) kubemod="$root/hack/tools" ;;
  v1.34.4|v1.35.4|v1.36.3) kubemod="$root/hack/skew/$(echo "$KUBE_VERSION" | cut -d. -f1,2)" ;;
  *) echo "build-node: DPKIT_KUBELET_VERSION=$KUBE_VERSION: use v1.34.4, v1.35.4, v1.36.3 or v1.37.0" >&2; exit 2 ;;
esac
# stamp identifies the sources: the module files of both modules and the
# pause program. A change to any rebuilds.
stamp() {
  cat "$kubemod/go.mod" "$kubemod/go.sum" "$ctrmod/go.mod" "$ctrmod/go.sum" \
    "$root"/test/controlplane/cmd/pause/*.go | sha256sum | cut -d' ' -f1
}

bins=(kubelet containerd containerd-shim-runc-v2 ctr pause)

current() {
  local b
  for b in "${bins[@]}"; do [[ -x "$out/$b" ]] || return 1; done
  [[ -f "$out/.stamp" && "$(cat "$out/.stamp")" == "$(stamp)" ]] || return 1
  "$out/kubelet" --version 2>/dev/null | grep -qx "Kubernetes ${KUBE_VERSION}" || return 1
  "$out/containerd" --version 2>/dev/null | grep -q " ${CONTAINERD_VERSION} " || return 1
}

lock_dir "$out"

if ! $force && current; then
  log "reusing $out (kubelet ${KUBE_VERSION}, containerd ${CONTAINERD_VERSION})"
  echo "$out"
  exit 0
fi

tmp="$(mktemp -d "$out/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
log "building kubelet ${KUBE_VERSION}, containerd ${CONTAINERD_VERSION} and pause into $out (a cold build takes minutes)"
start=$SECONDS
sum="$(stamp)"

ldflags="$(kube_ldflags "$KUBE_VERSION")"
module_build "$kubemod" "$tmp" k8s.io/kubernetes/cmd/kubelet

# containerd's own Makefile builds with these tags when cgo is off: the
# btrfs, devmapper and zfs snapshotters need cgo or tools this node lacks.
ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=${CONTAINERD_VERSION} -X github.com/containerd/containerd/v2/version.Revision=dpkit-test-node"
(
  cd "$ctrmod"
  GOFLAGS="${GOFLAGS:-} -mod=readonly" CGO_ENABLED=0 go build -trimpath -tags no_btrfs,no_devmapper,no_zfs \
    -ldflags "$ldflags" -o "$tmp/" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr
)

ldflags="-s -w"
(cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/pause" ./test/controlplane/cmd/pause)

for b in "${bins[@]}"; do
  mv -f "$tmp/$b" "$out/$b"
done
echo "$sum" >"$out/.stamp"
if ! current; then
  log "built binaries in $out do not report kubelet ${KUBE_VERSION} / containerd ${CONTAINERD_VERSION}"
  exit 1
fi
log "built in $((SECONDS - start))s"
echo "$out"

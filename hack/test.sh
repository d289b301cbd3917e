#!/usr/bin/env bash
# Runs dpkit's whole test suite: unit tests, real-socket tests, and the e2e
# tests against a real kube-apiserver, etcd, kube-scheduler and
# kube-controller-manager and a real node (kubelet, containerd; built from Go
# modules on first use and cached; see docs/testing.md). Extra arguments go
# to "go test", e.g. hack/test.sh -run TestAdvertise ./test/e2e/.
#
#   hack/test.sh            everything, with -race and coverage
#   hack/test.sh -short     skips what needs the control plane (and says so)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

short=false
for a in "$@"; do [[ "$a" == "-short" ]] && short=true; done
if ! $short; then
  echo "== building or reusing the test binaries (control plane, upstream interop)"
  bash hack/build-controlplane.sh >/dev/null
  bash hack/build-node.sh >/dev/null
  if [[ -f hack/build-upstream.sh ]]; then
    bash hack/build-upstream.sh >/dev/null
  fi
fi

echo "== go vet"
go vet ./...

pkgs=(./...)
for a in "$@"; do [[ "$a" == ./* ]] && pkgs=(); done
echo "== go test -race"
go test -race -count=1 -cover -timeout 30m "$@" "${pkgs[@]}"

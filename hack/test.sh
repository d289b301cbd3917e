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
  # The real node's parts that come from Debian (test/controlplane.StartNode):
  # runc, the reference CNI plugins, and busybox-static for the busybox image.
  if ! command -v runc >/dev/null || [[ ! -x /usr/lib/cni/ptp ]] || ! /bin/busybox --list >/dev/null 2>&1; then
    pkgs_deb="runc containernetworking-plugins busybox-static"
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
      echo "hack/test.sh: the real node needs $pkgs_deb; install them (apt-get install $pkgs_deb) or run hack/test.sh -short" >&2
      exit 1
    fi
    echo "== installing $pkgs_deb (Debian packages, for the real node)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs_deb >/dev/null
  fi
  echo "== building or reusing the test binaries (control plane, real node, upstream interop)"
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
# A failed test's message can sit under pages of the logs its clean-up
# prints (a kubelet's, a pod's description): on failure, the run ends with
# each failed test and the first lines it logged from a test file.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0
go test -race -count=1 -cover -timeout 45m "$@" "${pkgs[@]}" 2>&1 | tee "$log" || rc=$?
if [[ $rc -ne 0 ]]; then
  echo "== failed tests, and the first lines each logged"
  awk '
    /^ *--- FAIL: / { print; n = 0; infail = 1; next }
    /^(=== |--- |ok |FAIL|PASS)/ { infail = 0 }
    infail && n < 4 && /^ +[A-Za-z0-9_]+_test\.go:[0-9]+: / { print substr($0, 1, 1000); n++ }
    /^(panic: |FAIL\t)/ { print }
  ' "$log"
fi
exit "$rc"

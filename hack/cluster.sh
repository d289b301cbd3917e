#!/usr/bin/env bash
# A cluster to try dpkit against, on this machine, from Go modules only:
# kube-apiserver, etcd, kube-scheduler and kube-controller-manager v1.37.0
# (and kubectl v1.37.0), built on first use (about 6 minutes cold on 2
# cores, then seconds). It prints the lines to paste into your shell:
#
#   export KUBECONFIG=...   export CLIENT_CA=...   export PATH=...:$PATH (kubectl)
#
# and serves until Ctrl-C, which removes everything it made.
#
#   bash hack/cluster.sh                      the control plane (any user)
#   sudo bash hack/cluster.sh --node          and a real node: kubelet, containerd, runc (root)
#   bash hack/cluster.sh --env-file F &       for scripts: F appears once it runs; source it
#
# Every page of docs/ that needs a cluster starts from this one; see
# docs/getting-started.md.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
case " $* " in
  *" -h "*|*" --help "*) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
bash hack/build-controlplane.sh >/dev/null
case " $* " in
  *" --node "*) bash hack/build-node.sh >/dev/null ;;
esac
bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/controlplane" ./test/controlplane/cmd/controlplane
# Not exec, so that the trap removes the binary. A background job of a
# script ignores SIGINT: Ctrl-C and SIGTERM reach the control plane as
# SIGTERM, and it stops everything it started.
"$bin/controlplane" "$@" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null || true' INT TERM
set +e
wait "$pid"
status=$?
while kill -0 "$pid" 2>/dev/null; do
  wait "$pid"
  status=$?
done
exit "$status"

#!/usr/bin/env bash
# Times what a newcomer does, from a fresh clone with empty Go and dpkit
# caches, following the docs' recipes as written (docs/getting-started.md
# reports the figures):
#
#   1. git clone
#   2. make build                        dpkit, dpkit-cluster, dpkit-fakedra
#   3. bash hack/cluster.sh              the cluster to try things on: its first build, its start
#   4. docs/virtual-node.md quick-start  a device plugin pod on dpkit node
#   5. docs/dra.md fake-driver           a claim prepared by the fake DRA driver
#   6. docs/dra-plugins.md on-a-dpkit-node  a claim prepared by dpkit's own DRA front
#
#   bash hack/first-ten-minutes.sh [--warm]   (--warm keeps this user's caches)
#
# Each step prints its wall and CPU (user + system) time. Everything it
# starts is stopped; the clone and the empty caches are removed.
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d)"
cleanup() {
  [[ -n "${cluster_pid:-}" ]] && kill -TERM "$cluster_pid" 2>/dev/null && wait "$cluster_pid" 2>/dev/null
  chmod -R u+w "$work" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
if [[ "${1:-}" != "--warm" ]]; then
  export GOCACHE="$work/cache/go-build" GOMODCACHE="$work/cache/mod" XDG_CACHE_HOME="$work/cache/xdg"
fi
export TMPDIR="$work/tmp"
mkdir -p "$TMPDIR"

# step NAME COMMAND...: runs the command, prints its times.
step() {
  local name=$1
  shift
  /usr/bin/time -f "%e %U %S" -o "$work/time" "$@" > "$work/${name//\//_}.log" 2>&1 || {
    echo "step $name failed; its output:" >&2
    tail -40 "$work/${name//\//_}.log" >&2
    exit 1
  }
  read -r wall user sys < "$work/time"
  awk -v n="$name" -v w="$wall" -v u="$user" -v s="$sys" 'BEGIN { printf "%-34s wall %7.1fs  cpu %7.1fs\n", n, w, u + s }'
}

# recipe PAGE NAME: the sh block after <!-- recipe: NAME --> in docs/PAGE.
recipe() {
  awk -v name="<!-- recipe: $2 -->" '
    $0 == name { on = 1; next }
    on == 1 && /^```sh/ { on = 2; next }
    on == 2 && /^```/ { exit }
    on == 2 { print }' "docs/$1"
}

step clone git clone -q "$src" "$work/dpkit"
cd "$work/dpkit"
step make-build make build
export PATH="$PWD/bin:$PATH"

# The cluster: its first build, then hack/cluster.sh, which writes its
# exports to a file once everything runs.
step cluster-build bash hack/build-controlplane.sh
t0=$SECONDS
bash hack/cluster.sh --env-file "$work/cluster.env" > "$work/cluster.log" 2>&1 &
cluster_pid=$!
until [[ -f "$work/cluster.env" ]]; do
  kill -0 "$cluster_pid" 2>/dev/null || { echo "hack/cluster.sh failed:" >&2; tail -40 "$work/cluster.log" >&2; exit 1; }
  sleep 1
done
printf '%-34s wall %7.1fs\n' "cluster-start" "$((SECONDS - t0))"
# shellcheck disable=SC1091
source "$work/cluster.env"

for r in "virtual-node.md quick-start" "dra.md fake-driver" "dra-plugins.md on-a-dpkit-node"; do
  read -r page name <<< "$r"
  recipe "$page" "$name" > "$work/$name.sh"
  step "${page%.md}/$name" bash -euo pipefail "$work/$name.sh"
done

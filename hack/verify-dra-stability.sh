#!/usr/bin/env bash
# Runs dpkit verify --dra N times in a row on the upstream-helper fake driver
# (cmd/dpkit-fakedra) and on dpkit's own DRA front (dpkit plugin with
# fronts: [dra]), and says whether each driver got the same verdict for
# every check in every run (docs/verify.md, "Stable verdicts").
#
#   bash hack/cluster.sh --env-file /tmp/cluster.env &   # a control plane
#   source /tmp/cluster.env                               # once the file is there
#   bash hack/verify-dra-stability.sh [N]                 # N defaults to 10
#
# It prints one line per driver: the runs, the distinct verdict sets, and,
# when they differ, the checks that changed with the verdicts seen. Exit 1
# when a driver's verdicts changed between runs.
set -euo pipefail
runs="${1:-10}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
: "${KUBECONFIG:?a control plane: bash hack/cluster.sh --env-file F, then source F}"
bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/" ./cmd/dpkit ./cmd/dpkit-cluster ./cmd/dpkit-fakedra
export PATH="$bin:$PATH"
cat >"$bin/fake-dra.yaml" <<'EOF'
apiVersion: dpkit.io/v1alpha1
kind: PluginConfig
plugins:
- fake:
    resources:
    - name: verify.dpkit.io/dev
      count: 3
  fronts: [dra]
EOF

status=0
# judge NAME COMMAND...: N runs of verify --dra on COMMAND.
judge() {
  local name="$1"
  shift
  local dir="$bin/$name"
  mkdir -p "$dir"
  for i in $(seq "$runs"); do
    # The verdicts only: the details carry times and random names.
    dpkit verify --dra -o json -- "$@" 2>"$dir/$i.err" |
      python3 -c 'import json,sys; [print(r["id"], r["verdict"]) for r in json.load(sys.stdin)["results"]]' >"$dir/$i" || true
  done
  local distinct
  distinct="$(for i in $(seq "$runs"); do md5sum <"$dir/$i"; done | sort -u | wc -l)"
  echo "$name: $runs runs, $distinct distinct verdict set(s); $(awk '{print $2}' "$dir/1" | sort | uniq -c | tr -s ' ' | paste -sd, -)"
  if [[ "$distinct" != 1 ]]; then
    status=1
    cat "$dir"/[0-9]* | sort | uniq -c | awk -v n="$runs" '$1 != n {print "  " $2 " " $3 " in " $1 " of " n " runs"}'
  fi
}
judge upstream-helper-fake dpkit-fakedra --registry-dir '{registry-dir}' --kubeconfig '{kubeconfig}' --node-name '{node-name}' --rolling-update '{pod-uid}'
judge dpkit-plugin dpkit plugin --config "$bin/fake-dra.yaml"
exit "$status"

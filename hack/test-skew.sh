#!/usr/bin/env bash
# Runs the real-node tests on every kubelet a v1.37 control plane supports
# (v1.34.4, v1.35.4, v1.36.3 and v1.37.0; the control plane stays v1.37):
# builds (or reuses) each kubelet with hack/build-node.sh, then runs
# $SKEW_TESTS against a node with that kubelet. Prints one line per
# version with the result and the time, and fails when any version fails.
#
#   hack/test-skew.sh                 every version
#   hack/test-skew.sh v1.34.4 ...     those versions
#
# Needs what the real node needs (root, runc, the CNI plugins; see
# docs/testing.md). The kubelets' modules (hack/skew/v1.NN) are checked
# for tidiness here rather than in make verify, so that CI does not
# download three more Kubernetes trees.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
versions=("$@")
if [[ ${#versions[@]} -eq 0 ]]; then
  versions=(v1.34.4 v1.35.4 v1.36.3 v1.37.0)
fi
tests="${SKEW_TESTS:-TestRealNodeSkew|TestRealNodeDRA|TestRealNodeRollingUpdate|TestRealNodeRollingUpdateDRA|TestRealNodeCDI|TestExporterOnRealNode}"

for mod in hack/skew/*/; do
  if ! (cd "$mod" && go mod tidy -diff >/dev/null); then
    echo "test-skew: go.mod/go.sum of $mod are not tidy (run: cd $mod && go mod tidy)" >&2
    exit 1
  fi
done

summary=()
fail=0
for v in "${versions[@]}"; do
  start=$SECONDS
  if ! DPKIT_KUBELET_VERSION="$v" bash hack/build-node.sh >/dev/null; then
    summary+=("$v: build failed")
    fail=1
    continue
  fi
  built=$((SECONDS - start))
  start=$SECONDS
  rc=0
  DPKIT_KUBELET_VERSION="$v" go test -count=1 -timeout 30m -run "$tests" -v ./test/e2e/ 2>&1 |
    tee "${TMPDIR:-/tmp}/dpkit-skew-$v.log" | grep -E '^(--- |=== RUN|ok|FAIL|PASS)|skew:' || true
  rc=${PIPESTATUS[0]}
  result=pass
  [[ $rc -eq 0 ]] || { result="FAIL (log: ${TMPDIR:-/tmp}/dpkit-skew-$v.log)"; fail=1; }
  summary+=("$v: $result; kubelet build ${built}s, tests $((SECONDS - start))s")
done
printf 'test-skew: %s\n' "${summary[@]}"
exit $fail

#!/usr/bin/env bash
# Checks what CI and reviewers expect without running tests: gofmt, go vet,
# golangci-lint (.golangci.yml; the version pinned as a tool in
# hack/lint/go.mod) and that go.mod/go.sum are tidy in every module of the
# repository.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
fail=0

unformatted=$(git ls-files '*.go' | xargs gofmt -l)
if [[ -n "$unformatted" ]]; then
  echo "gofmt would change (run: gofmt -w <file>):"; echo "$unformatted" | sed 's/^/  /'; fail=1
fi
go vet ./... || fail=1
# go tool -n builds the pinned golangci-lint (cached after the first time)
# and prints its path.
lint=$(cd hack/lint && go tool -n golangci-lint) || { echo "cannot build golangci-lint from hack/lint"; exit 1; }
"$lint" run --allow-parallel-runners ./... || { echo "golangci-lint found problems (configuration: .golangci.yml)"; fail=1; }
for mod in . hack/tools hack/containerd hack/kwok hack/render hack/lint; do
  [[ -f "$mod/go.mod" ]] || continue
  if ! (cd "$mod" && go mod tidy -diff >/dev/null); then
    echo "go.mod/go.sum of $mod are not tidy (run: cd $mod && go mod tidy)"; fail=1
  fi
done
exit $fail

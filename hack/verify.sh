#!/usr/bin/env bash
# Checks what CI and reviewers expect without running tests: gofmt, go vet,
# and that go.mod/go.sum are tidy in every module of the repository.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
fail=0

unformatted=$(git ls-files '*.go' | xargs gofmt -l)
if [[ -n "$unformatted" ]]; then
  echo "gofmt would change (run: gofmt -w <file>):"; echo "$unformatted" | sed 's/^/  /'; fail=1
fi
go vet ./... || fail=1
for mod in . hack/tools hack/kwok hack/render; do
  [[ -f "$mod/go.mod" ]] || continue
  if ! (cd "$mod" && go mod tidy -diff >/dev/null); then
    echo "go.mod/go.sum of $mod are not tidy (run: cd $mod && go mod tidy)"; fail=1
  fi
done
exit $fail

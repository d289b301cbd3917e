#!/usr/bin/env bash
# Runs the benchmarks whose figures docs/performance.md reports. Each line of
# docs/performance.md names the command for its own table; this runs them all.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
echo "== SDK (pkg/deviceplugin)"
go test -run '^$' -bench . -benchtime 2000x ./pkg/deviceplugin/
echo "== dpkit plugin idle memory (test/bench)"
go test -run '^$' -bench PluginIdleRSS -benchtime 1x ./test/bench/
echo "== device manager (pkg/devicemanager)"
go test -run '^$' -bench . -benchtime 200x ./pkg/devicemanager/

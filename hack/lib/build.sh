# Shared by hack/build-controlplane.sh, hack/build-upstream.sh and
# hack/build-kwok.sh; sourced, not run.

# cache_dir NAME VERSION prints the default cache directory for a set of
# binaries: ${XDG_CACHE_HOME:-$HOME/.cache}/dpkit/NAME/VERSION.
cache_dir() {
  echo "${XDG_CACHE_HOME:-${HOME:-${TMPDIR:-/tmp}}/.cache}/dpkit/$1/$2"
}

# lock_dir DIR creates DIR and holds its lock (fd 9) for the rest of the
# script: one build at a time per directory, a second caller waits, then
# reuses what the first built.
lock_dir() {
  mkdir -p "$1"
  exec 9>"$1/.lock"
  if command -v flock >/dev/null; then
    flock 9
  fi
}

# kube_ldflags VERSION prints the -ldflags that make Kubernetes binaries
# report VERSION (as a release build does) and build reproducibly.
kube_ldflags() {
  local v="$1" pkg=k8s.io/component-base/version
  local flags="-s -w"
  flags+=" -X ${pkg}.gitVersion=${v}"
  flags+=" -X ${pkg}.gitMajor=$(echo "${v#v}" | cut -d. -f1)"
  flags+=" -X ${pkg}.gitMinor=$(echo "${v#v}" | cut -d. -f2)"
  flags+=" -X ${pkg}.gitTreeState=clean"
  flags+=" -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
  echo "$flags"
}

# module_build MODULE_DIR OUTDIR PACKAGE... builds packages of one of the
# repository's separate modules under hack/ (static, trimmed, with the
# module's pinned versions and the -ldflags in $ldflags) into OUTDIR.
module_build() {
  local moddir="$1" outdir="$2"; shift 2
  (
    cd "$moddir"
    GOFLAGS="${GOFLAGS:-} -mod=readonly" CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$outdir/" "$@"
  )
}

# tools_build OUTDIR PACKAGE... builds packages of the hack/tools module
# into OUTDIR.
tools_build() {
  module_build "$root/hack/tools" "$@"
}

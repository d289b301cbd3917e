#!/usr/bin/env bash
# Builds dpkit's two container images as archives, without Docker or any
# other container engine (hack/image writes them: internal/imagespec says
# what they hold, internal/ociimage writes them reproducibly; the same tree
# gives the same digests, which it prints):
#
#   $BIN/images/dpkit-plugin.tar  $IMAGE_REPO/dpkit-plugin:$VERSION  the lean
#                                 "dpkit plugin" build the plugin DaemonSets run
#   $BIN/images/dpkit.tar         $IMAGE_REPO/dpkit:$VERSION         every
#                                 command (cmd/dpkit-cluster as /usr/bin/dpkit),
#                                 for dpkit advertise and dpkit node
#
# Load them with "kind load image-archive", "docker load -i", "podman load -i"
# or "ctr -n k8s.io images import" (deploy/README.md). The Dockerfile builds
# the same images with the same names on a distroless base.
#
# Environment (the Makefile sets them): VERSION (default: the version in
# internal/version), IMAGE_REPO (ghcr.io/dpkit), ARCH (go env GOARCH), BIN
# (bin), GO (go).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

VERSION="${VERSION:-$(sed -n 's/^var Version = "\(.*\)"$/\1/p' internal/version/version.go)}"
IMAGE_REPO="${IMAGE_REPO:-ghcr.io/dpkit}"
GO="${GO:-go}"
ARCH="${ARCH:-$("$GO" env GOARCH)}"
BIN="${BIN:-bin}"
if [[ -z "$VERSION" ]]; then
  echo "images: no version: set VERSION or keep 'var Version = \"...\"' in internal/version/version.go" >&2
  exit 1
fi

out="$BIN/linux_$ARCH"
mkdir -p "$out" "$BIN/images"
ldflags="-s -w -X github.com/dpkit/dpkit/internal/version.Version=$VERSION"
build() { CGO_ENABLED=0 GOOS=linux GOARCH="$ARCH" "$GO" build -trimpath -ldflags "$ldflags" "$@"; }

echo "== building linux/$ARCH binaries into $out"
build -tags "dpkit_lean grpcnotrace" -o "$out/dpkit-plugin" ./cmd/dpkit
build -o "$out/dpkit-cluster" ./cmd/dpkit-cluster

image() { "$GO" run ./hack/image -version "$VERSION" -arch "$ARCH" "$@"; }
image -image plugin -binary "$out/dpkit-plugin" -tag "$IMAGE_REPO/dpkit-plugin:$VERSION" -o "$BIN/images/dpkit-plugin.tar"
image -image full -binary "$out/dpkit-cluster" -tag "$IMAGE_REPO/dpkit:$VERSION" -o "$BIN/images/dpkit.tar"

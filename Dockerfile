# syntax=docker/dockerfile:1
# dpkit: static binaries (CGO_ENABLED=0) on a distroless base. Two images,
# tagged with the version in internal/version that deploy/ pins:
#   docker build -t ghcr.io/dpkit/dpkit:v0.1.0 .
#       every command (cmd/dpkit-cluster as /usr/bin/dpkit): advertise,
#       node, kubelet, verify, ...
#   docker build --target plugin -t ghcr.io/dpkit/dpkit-plugin:v0.1.0 .
#       the lean build for device plugin DaemonSets: "dpkit plugin" only,
#       about a third of the resident memory (docs/performance.md)
# "make images" builds the same two images without Docker (hack/images.sh,
# internal/imagespec): same entrypoint, command, user, ports and labels, a
# test (internal/imagespec) holds them together.
# --build-arg VERSION=v0.1.1 stamps another version into the binaries.
ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
# Dependencies first so that source changes keep the module cache layer.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY cmd/ cmd/
COPY internal/ internal/
COPY pkg/ pkg/
ARG TARGETOS=linux
ARG TARGETARCH
# Empty: the version in internal/version.
ARG VERSION
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    LDFLAGS="-s -w ${VERSION:+-X github.com/dpkit/dpkit/internal/version.Version=${VERSION}}" && \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false -ldflags "$LDFLAGS" \
      -o /out/dpkit ./cmd/dpkit-cluster && \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false -tags "dpkit_lean grpcnotrace" -ldflags "$LDFLAGS" \
      -o /out/dpkit-plugin ./cmd/dpkit

# static: no libc, no shell. The plugin runs as root (uid 0) only to create
# sockets in the kubelet's directories; the manifests drop every capability.
FROM gcr.io/distroless/static-debian12:latest AS plugin
# The labels internal/imagespec gives both images; empty VERSION: the
# version in internal/version (a test holds this default to it).
ARG VERSION
LABEL org.opencontainers.image.source="https://github.com/dpkit/dpkit" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION:-v0.1.0}"
COPY --from=build /out/dpkit-plugin /usr/bin/dpkit
USER 0:0
EXPOSE 9400
ENTRYPOINT ["/usr/bin/dpkit"]
CMD ["plugin", "--config", "/etc/dpkit/config.yaml", "--metrics-address", ":9400"]

FROM gcr.io/distroless/static-debian12:latest AS dpkit
ARG VERSION
LABEL org.opencontainers.image.source="https://github.com/dpkit/dpkit" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION:-v0.1.0}"
COPY --from=build /out/dpkit /usr/bin/dpkit
USER 0:0
ENTRYPOINT ["/usr/bin/dpkit"]

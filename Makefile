# A thin front for the scripts in hack/.
GO ?= go
BIN ?= bin
# The version of the tree (internal/version); images are tagged with it and
# deploy/ pins the same tag.
VERSION ?= $(shell sed -n 's/^var Version = "\(.*\)"$$/\1/p' internal/version/version.go)
IMAGE_REPO ?= ghcr.io/dpkit
ARCH ?= $(shell $(GO) env GOARCH)
LDFLAGS := -s -w -X github.com/dpkit/dpkit/internal/version.Version=$(VERSION)
# The plugin image's binary: "dpkit plugin" only (see docs/performance.md).
LEAN_TAGS := dpkit_lean grpcnotrace
# make chaos: events of each kind per configuration, and which runs
# (VirtualNode, RealNode or both); CHAOS_KINDS, a regular expression, runs
# only the event kinds it matches (all when empty).
CHAOS_EVENTS ?= 20
CHAOS ?= VirtualNode|RealNode
CHAOS_KINDS ?=

.PHONY: all build build-lean image images test test-skew test-short verify lint bench chaos controlplane kwok clean

all: build

build: ## bin/dpkit, bin/dpkit-cluster (node, advertise, get --kubeconfig; dpkit runs it for those) and bin/dpkit-fakedra (the fake DRA driver)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/dpkit ./cmd/dpkit-cluster ./cmd/dpkit-fakedra

build-lean: ## dpkit with "plugin" and "version" only, for device plugin DaemonSets
	CGO_ENABLED=0 $(GO) build -tags '$(LEAN_TAGS)' -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/dpkit-plugin ./cmd/dpkit

images: ## $(BIN)/images/dpkit-plugin.tar and dpkit.tar, tagged $(IMAGE_REPO)/...:$(VERSION); no Docker needed
	VERSION='$(VERSION)' IMAGE_REPO='$(IMAGE_REPO)' ARCH='$(ARCH)' BIN='$(BIN)' GO='$(GO)' bash hack/images.sh

image: images ## the same as images

test: ## every test, with -race and coverage; builds the test control plane on first use
	bash hack/test.sh

test-skew: ## the real-node tests on kubelets v1.34, v1.35, v1.36 and v1.37 (docs/testing.md)
	bash hack/test-skew.sh

test-short: ## the tests that need no control plane
	bash hack/test.sh -short

verify: ## gofmt, go vet, golangci-lint, tidy modules
	bash hack/verify.sh

lint: ## golangci-lint alone (.golangci.yml)
	"$$(cd hack/lint && $(GO) tool -n golangci-lint)" run ./...

bench: ## the benchmarks behind docs/performance.md
	bash hack/bench.sh

chaos: ## the lifecycle chaos runs on dpkit node and on the real node (root), CHAOS_EVENTS events of each kind per configuration (docs/reliability.md); the suite runs them with 1
	bash hack/build-controlplane.sh >/dev/null
	bash hack/build-node.sh >/dev/null
	mkdir -p $(BIN)
	DPKIT_CHAOS_EVENTS='$(CHAOS_EVENTS)' DPKIT_CHAOS_KINDS='$(CHAOS_KINDS)' DPKIT_CHAOS_REPORT='$(CURDIR)/$(BIN)/chaos.md' $(GO) test -count=1 -timeout 0 -run '^TestChaos($(CHAOS))$$' -v ./test/e2e/

controlplane: ## build (or reuse) kube-apiserver, kube-scheduler and etcd for tests
	bash hack/build-controlplane.sh

kwok: ## build (or reuse) kwok for BenchmarkKwokSim, the comparison in docs/performance.md
	bash hack/build-kwok.sh

clean:
	rm -rf $(BIN)

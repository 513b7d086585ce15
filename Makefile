# Coordinator: the data plane (cmd/coordinator) and the operator (cmd/manager).
# `make test` is what CI runs (.ci/run); `make demo` runs the whole system locally.

GO        ?= go
BIN       ?= $(CURDIR)/bin
GOFLAGS_BUILD ?= -trimpath
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   ?= -s -w -X main.version=$(VERSION) -X main.commit=$(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)

# Packages whose tests run with the race detector (fast to build); the rest run without it.
RACE_PKGS  = ./dataplane/... ./cmd/coordinator/... ./test/simworker/... ./test/gateway/... ./test/mediaserver/... ./test/stack/... ./test/integration/...

.PHONY: all
all: build

##@ Build

.PHONY: build
build: ## Build every binary into ./bin.
	$(GO) build $(GOFLAGS_BUILD) -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/... ./test/simworker/cmd/simworker ./test/gateway/cmd/gateway

##@ Development

.PHONY: fmt
fmt: ## gofmt the tree.
	gofmt -w $$(git ls-files '*.go')

.PHONY: lint
lint: ## go vet + gofmt check.
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

##@ Test

.PHONY: envtest-assets
envtest-assets: ## Build kube-apiserver, etcd and kubectl for envtest (cached outside the repo).
	@hack/setup-envtest-assets.sh >/dev/null

.PHONY: test
test: lint envtest-assets ## Run every test (what CI runs).
	$(GO) test -race -count=1 $(RACE_PKGS)
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest-assets.sh)" $(GO) test -count=1 $$($(GO) list ./... | grep -v -e /dataplane/ -e /cmd/coordinator -e /test/simworker -e /test/gateway -e /test/mediaserver -e /test/stack -e /test/integration)

.PHONY: bench
bench: ## Go benchmarks of the request path.
	$(GO) test -run '^$$' -bench . -benchmem ./dataplane/...

.PHONY: help
help: ## Show targets.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*?##/ { printf "  %-18s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

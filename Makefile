# Coordinator: the data plane (cmd/coordinator) and the operator (cmd/manager).
# `make test` is what CI runs (.ci/run); `make demo` runs the whole system locally.

GO        ?= go
BIN       ?= $(CURDIR)/bin
GOFLAGS_BUILD ?= -trimpath
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   ?= -s -w -X main.version=$(VERSION) -X main.commit=$(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)

# Packages whose tests run with the race detector (fast to build); the rest run without it.
RACE_PKGS  = ./dataplane/... ./cmd/coordinator/... ./test/simworker/... ./test/gateway/... ./test/mediaserver/... ./test/stack/... ./test/integration/... ./test/asyncworker/...

.PHONY: all
all: build

##@ Build

.PHONY: build
build: ## Build every binary into ./bin.
	$(GO) build $(GOFLAGS_BUILD) -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/... ./test/simworker/cmd/simworker ./test/gateway/cmd/gateway ./test/asyncworker/cmd/asyncworker

##@ Development

.PHONY: fmt
fmt: ## gofmt the tree.
	gofmt -w $$(git ls-files '*.go')

.PHONY: lint
lint: ## go vet + gofmt check.
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

##@ Operator

CONTROLLER_GEN ?= $(GO) tool controller-gen
# kubectl with built-in kustomize; the envtest assets directory has a v1.37.2 one:
# make deploy KUBECTL=$$(hack/setup-envtest-assets.sh)/kubectl
KUBECTL ?= kubectl
# Operator image (config/manager) and the default coordinator image it runs.
IMG ?= ghcr.io/epd-dev/coordinator-operator:latest
COORDINATOR_IMG ?= ghcr.io/epd-dev/coordinator:latest
CONTROLLER_GEN_SOURCES = paths=./api/... paths=./controllers/...

.PHONY: manifests
manifests: ## Generate the CRD (config/crd/bases) and the manager ClusterRole (config/rbac/role.yaml).
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd $(CONTROLLER_GEN_SOURCES) output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac

.PHONY: generate
generate: ## Generate the API types' DeepCopy methods.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

.PHONY: verify-generated
verify-generated: ## Fail when the CRD, ClusterRole or DeepCopy code is stale (compares a fresh generation with the tree).
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd $(CONTROLLER_GEN_SOURCES) output:crd:dir=$$tmp/crd output:rbac:dir=$$tmp/rbac && \
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/... output:object:dir=$$tmp/object && \
	{ diff -r $$tmp/crd config/crd/bases && diff $$tmp/rbac/role.yaml config/rbac/role.yaml && \
	  diff $$tmp/object/zz_generated.deepcopy.go api/v1alpha1/zz_generated.deepcopy.go; } || \
	{ echo "generated files are stale: run 'make manifests generate'"; exit 1; }

.PHONY: run
run: ## Run the operator against the cluster of the current kubeconfig (CRD installed: make install).
	$(GO) run ./cmd/manager --coordinator-image=$(COORDINATOR_IMG) $(ARGS)

.PHONY: install
install: ## Install the CRD into the cluster of the current kubeconfig.
	$(KUBECTL) kustomize config/crd | $(KUBECTL) apply --server-side -f -

.PHONY: uninstall
uninstall: ## Remove the CRD (and every CoordinatorPipeline) from the cluster.
	$(KUBECTL) kustomize config/crd | $(KUBECTL) delete --ignore-not-found -f -

.PHONY: build-installer
build-installer: ## Render the whole operator install (CRD, RBAC, manager) with IMG into dist/install.yaml.
	@mkdir -p dist
	$(KUBECTL) kustomize config/default | sed 's|image: controller:latest|image: $(IMG)|' > dist/install.yaml

.PHONY: deploy
deploy: build-installer ## Deploy the operator (IMG) to the cluster of the current kubeconfig.
	$(KUBECTL) apply --server-side -f dist/install.yaml

.PHONY: undeploy
undeploy: build-installer ## Remove the operator from the cluster.
	$(KUBECTL) delete --ignore-not-found -f dist/install.yaml

##@ Test

.PHONY: envtest-assets
envtest-assets: ## Build kube-apiserver, etcd and kubectl for envtest (cached outside the repo).
	@hack/setup-envtest-assets.sh >/dev/null

.PHONY: test
test: verify-generated lint envtest-assets ## Run every test (what CI runs).
	$(GO) test -race -count=1 $(RACE_PKGS)
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest-assets.sh)" $(GO) test -count=1 $$($(GO) list ./... | grep -v -e /dataplane/ -e /cmd/coordinator -e /test/simworker -e /test/gateway -e /test/mediaserver -e /test/stack -e /test/integration -e /test/asyncworker)

# make bench BENCH_ARGS='--duration 4s --targets direct,raw-proxy,decode-only' (flags: docs/benchmarks.md)
BENCH_OUT  ?= $(BIN)/bench/$(shell date +%Y%m%d-%H%M%S)
BENCH_ARGS ?=

.PHONY: bench
bench: ## Benchmarks (docs/benchmarks.md): builds the binaries, runs the Go micro-benchmarks of the request path, then the multi-process load harness; not part of `make test`.
	$(GO) build $(GOFLAGS_BUILD) -o $(BIN)/ ./test/bench/cmd/benchharness
	$(BIN)/benchharness --out $(BENCH_OUT) $(BENCH_ARGS)

##@ Demo

.PHONY: demo
demo: ## Run the whole system locally (control plane, operator, worker pool, coordinator) and serve http://127.0.0.1:8080/v1.
	$(GO) run ./hack/demo

.PHONY: help
help: ## Show targets.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*?##/ { printf "  %-18s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

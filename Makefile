# Coordinator: the data plane (cmd/coordinator) and the operator (cmd/manager).
# `make test` is what CI runs (.ci/run); `make demo` runs the whole system locally.

GO        ?= go
BIN       ?= $(CURDIR)/bin
GOFLAGS_BUILD ?= -trimpath
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   ?= -s -w -X main.version=$(VERSION) -X main.commit=$(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)

# The one package list: UNIT_PKGS are the data plane and its binary (`make unit`); RACE_PKGS run
# with the race detector in `make test` (fast to build); every other package runs without it.
UNIT_PKGS  = ./dataplane/... ./cmd/coordinator/...
RACE_PKGS  = $(UNIT_PKGS) ./test/doubles/... ./test/harness/stack/... ./test/suites/integration/...
# The real-node tier (docs/node.md): a real kubelet, containerd and pods on this machine, as root.
# It runs on its own after the other packages (one node per machine; it needs the CPU to itself).
NODE_PKGS  = ./test/harness/node/... ./test/suites/node/...
# A race-detector binary sleeps 1 s at exit by default (atexit_sleep_ms): one second per package.
GORACE    ?= atexit_sleep_ms=0
export GORACE

.PHONY: all
all: build

##@ Build

.PHONY: build
build: ## Build every binary into ./bin.
	$(GO) build $(GOFLAGS_BUILD) -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/... ./test/doubles/simworker/cmd/simworker ./test/doubles/gateway/cmd/gateway ./test/doubles/asyncworker/cmd/asyncworker ./test/harness/endpoints/cmd/steadyload

##@ Development

# golangci-lint, pinned in its own tool module (hack/tools/go.mod) so that its hundreds of linter
# modules stay out of go.mod; `go tool` downloads and builds it on first use (~3 min cold).
GOLANGCI_LINT ?= $(GO) tool -modfile=hack/tools/go.mod golangci-lint

.PHONY: fmt
fmt: ## gofmt and goimports the tree (the formatters of .golangci.yml).
	$(GOLANGCI_LINT) fmt ./...

.PHONY: lint
lint: ## golangci-lint (.golangci.yml): go vet, staticcheck, errcheck and more, gofmt and goimports.
	$(GOLANGCI_LINT) run ./...

##@ Operator

CONTROLLER_GEN ?= $(GO) tool controller-gen
# kustomize v5.8.1, pinned in go.mod (tool directive); no system kubectl or kustomize needed.
KUSTOMIZE ?= $(GO) tool kustomize
# kubectl, only to talk to a cluster (install, deploy); the envtest assets directory has a v1.37.2
# one: make deploy KUBECTL=$$(hack/setup-envtest-assets.sh)/kubectl
KUBECTL ?= kubectl
# The operator release: chart version/appVersion, CSV version and image tags (a test keeps
# charts/coordinator-operator/Chart.yaml in step).
OPERATOR_VERSION ?= 0.1.0
# Operator image (config/manager) and the default coordinator image it runs.
IMG ?= ghcr.io/epd-dev/coordinator-operator:v$(OPERATOR_VERSION)
COORDINATOR_IMG ?= ghcr.io/epd-dev/coordinator:v$(OPERATOR_VERSION)
CONTROLLER_GEN_SOURCES = paths=./api/... paths=./internal/controller/...

.PHONY: manifests
manifests: ## Generate the CRD and manager ClusterRole (controller-gen), then the chart's CRD/RBAC templates and the OLM bundle from them.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd $(CONTROLLER_GEN_SOURCES) output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	@$(MAKE) --no-print-directory helm-chart bundle

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
	$(KUSTOMIZE) build config/crd | $(KUBECTL) apply --server-side -f -

.PHONY: uninstall
uninstall: ## Remove the CRD (and every CoordinatorPipeline) from the cluster.
	$(KUSTOMIZE) build config/crd | $(KUBECTL) delete --ignore-not-found -f -

##@ Packaging (docs/install.md)

# Where build-installer writes the single-file install.
INSTALLER ?= dist/install.yaml
# The manager container's imagePullPolicy in the install (IfNotPresent, as in config/manager and the
# chart: an IMG tagged latest would otherwise default to Always, which fails for an image imported
# into the node, e.g. with kind load or ctr images import).
IMG_PULL_POLICY ?= IfNotPresent
# OLM channels of the bundle, and the bundle image.
BUNDLE_CHANNELS ?= candidate
BUNDLE_DEFAULT_CHANNEL ?= candidate
BUNDLE_IMG ?= ghcr.io/epd-dev/coordinator-operator-bundle:v$(OPERATOR_VERSION)
# Image builds (not runnable on machines without a container engine).
CONTAINER_TOOL ?= docker
PLATFORMS ?= linux/amd64,linux/arm64
IMAGE_BUILD_ARGS = --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)

.PHONY: build-installer
build-installer: ## Render the whole operator install (CRD, namespace, RBAC, manager, metrics Service) with IMG, IMG_PULL_POLICY and COORDINATOR_IMG into $(INSTALLER).
	@mkdir -p $(dir $(INSTALLER))
	@# kustomize edit works on the current directory: edit a copy of config/ (inside the module, so
	@# that `go tool` finds go.mod) instead of the tracked files.
	@mkdir -p $(BIN) && tmp=$$(mktemp -d "$(BIN)/build-installer.XXXXXX") && trap 'rm -rf "$$tmp"' EXIT && cp -R config "$$tmp/" && \
	cd "$$tmp/config/manager" && \
	$(KUSTOMIZE) edit set image controller=$(IMG) && \
	$(KUSTOMIZE) edit add patch --kind Deployment --name controller-manager \
	  --patch '{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "controller-manager", "namespace": "system"}, "spec": {"template": {"spec": {"containers": [{"name": "manager", "imagePullPolicy": "$(IMG_PULL_POLICY)", "env": [{"name": "RELATED_IMAGE_COORDINATOR", "value": "$(COORDINATOR_IMG)"}]}]}}}}' && \
	cd - >/dev/null && $(KUSTOMIZE) build "$$tmp/config/default" > $(INSTALLER)
	@echo "wrote $(INSTALLER) (operator $(IMG), pull policy $(IMG_PULL_POLICY), coordinator $(COORDINATOR_IMG))"

.PHONY: deploy
deploy: build-installer ## Deploy the operator (IMG) to the cluster of the current kubeconfig.
	$(KUBECTL) apply --server-side -f $(INSTALLER)

.PHONY: undeploy
undeploy: build-installer ## Remove the operator from the cluster.
	$(KUBECTL) delete --ignore-not-found -f $(INSTALLER)

.PHONY: helm-chart
helm-chart: ## Regenerate the Helm chart's CRD, RBAC and monitoring files (charts/coordinator-operator) from config/, and its README values table from values.yaml.
	$(GO) run ./hack/chartgen

.PHONY: helm-lint
helm-lint: ## Lint and template the Helm chart (helm SDK; no helm binary needed).
	$(GO) test -count=1 ./test/packaging/chart/...

.PHONY: bundle
bundle: ## Generate the OLM bundle (bundle/, bundle.Dockerfile) for OPERATOR_VERSION, IMG and COORDINATOR_IMG.
	$(GO) run ./hack/bundlegen -version $(OPERATOR_VERSION) -image $(IMG) -coordinator-image $(COORDINATOR_IMG) \
	  -channels $(BUNDLE_CHANNELS) -default-channel $(BUNDLE_DEFAULT_CHANNEL)

.PHONY: bundle-validate
bundle-validate: ## Validate the bundle like `operator-sdk bundle validate --select-optional suite=operatorframework` (operator-framework/api).
	$(GO) test -count=1 ./test/packaging/bundle/...

.PHONY: bundle-build
bundle-build: ## Build the bundle image (BUNDLE_IMG).
	$(CONTAINER_TOOL) build -f bundle.Dockerfile -t $(BUNDLE_IMG) .

.PHONY: bundle-push
bundle-push: ## Push the bundle image.
	$(CONTAINER_TOOL) push $(BUNDLE_IMG)

.PHONY: docker-build
docker-build: ## Build the operator (IMG) and coordinator (COORDINATOR_IMG) images for the local platform.
	$(CONTAINER_TOOL) build $(IMAGE_BUILD_ARGS) -f Dockerfile -t $(IMG) .
	$(CONTAINER_TOOL) build $(IMAGE_BUILD_ARGS) -f Dockerfile.coordinator -t $(COORDINATOR_IMG) .

.PHONY: docker-push
docker-push: ## Push both images.
	$(CONTAINER_TOOL) push $(IMG)
	$(CONTAINER_TOOL) push $(COORDINATOR_IMG)

.PHONY: docker-buildx
docker-buildx: ## Build and push both images for PLATFORMS with docker buildx.
	$(CONTAINER_TOOL) buildx build --push --platform=$(PLATFORMS) $(IMAGE_BUILD_ARGS) -f Dockerfile -t $(IMG) .
	$(CONTAINER_TOOL) buildx build --push --platform=$(PLATFORMS) $(IMAGE_BUILD_ARGS) -f Dockerfile.coordinator -t $(COORDINATOR_IMG) .

##@ Test

.PHONY: envtest-assets
envtest-assets: ## Build kube-apiserver, etcd and kubectl for envtest (cached outside the repo).
	@hack/setup-envtest-assets.sh >/dev/null

.PHONY: node-assets
node-assets: ## Build kubelet, kube-controller-manager, kube-scheduler, kube-proxy and CoreDNS for the node tier (cached outside the repo).
	@hack/node-assets.sh >/dev/null

.PHONY: test
test: verify-generated lint envtest-assets node-assets ## Run every test (what CI runs).
	@# The in-process renderer's reference (transformers.js and the six families' tokenizer packages,
	@# pinned by test/suites/renderref/package-lock.json; the template text's is python3's Jinja2):
	@# test/suites/renderref compares against it, and
	@# dataplane/render/tokenizer's goldens and benchmarks use its tokenizer files.
	hack/renderref.sh >/dev/null
	@# -bench . -benchtime 1x: every benchmark runs once as a test, so none rots.
	$(GO) test -race -count=1 -bench . -benchtime 1x $(RACE_PKGS)
	@# The rest, envtest-backed (internal/controller, test/packaging/chart, test/packaging/installer, and
	@# test/suites/realepp: llm-d's EPP and simulator from ../shared/peers or LLMD_EPP_BIN/LLMD_SIM_BIN) and packaging (test/packaging/bundle,
	@# test/packaging/images: builds both binaries as the Dockerfiles do, minutes on a cold cache).
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest-assets.sh)" $(GO) test -count=1 -bench . -benchtime 1x -timeout 20m $$($(GO) list ./... | grep -vxF "$$($(GO) list $(RACE_PKGS) $(NODE_PKGS))")
	@# test/packaging/monitoring, a module of its own (keeps Prometheus's PromQL parser out of go.mod): the
	@# shipped alerts and dashboard parse and query only what the binaries export.
	assets="$$(hack/setup-envtest-assets.sh)" && cd test/packaging/monitoring && KUBEBUILDER_ASSETS="$$assets" $(GO) test -count=1 -timeout 10m ./...
	@# The real-node tier (docs/node.md), one package at a time, verbose: its log holds the measured
	@# figures (lines with FIGURE). As root; without root or the Debian packages it fails under CI.
	$(MAKE) --no-print-directory test-node

.PHONY: test-node
test-node: envtest-assets node-assets ## The real-node tier alone (root; containerd, runc, containernetworking-plugins, iptables): docs/node.md.
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest-assets.sh)" NODE_ASSETS="$$(hack/node-assets.sh)" $(GO) test -count=1 -p 1 -v -timeout 25m $(NODE_PKGS)

.PHONY: unit
unit: ## The data plane's and its binary's tests with the race detector: no lint, envtest or node (tests that need what is missing skip, outside CI).
	$(GO) test -race -count=1 $(UNIT_PKGS)

# make bench BENCH_ARGS='--duration 4s --targets direct,raw-proxy,decode-only' (flags: docs/benchmarks.md)
BENCH_OUT  ?= $(BIN)/bench/$(shell date +%Y%m%d-%H%M%S)
BENCH_ARGS ?=

.PHONY: bench
bench: ## Benchmarks (docs/benchmarks.md): builds the binaries, runs the Go micro-benchmarks of the request path, then the multi-process load harness; not part of `make test`.
	hack/renderref.sh >/dev/null
	$(GO) build $(GOFLAGS_BUILD) -o $(BIN)/ ./test/harness/bench/cmd/benchharness
	$(BIN)/benchharness --out $(BENCH_OUT) $(BENCH_ARGS)

# make fuzz FUZZTIME=2m FUZZ_PKGS=./dataplane/state/body: every native fuzz target (func FuzzX in a
# _test.go file, found afresh each run) fuzzed in turn for FUZZTIME. A failing input is written to
# the package's testdata/fuzz/FuzzX/: fix the bug and check the file in, it then runs with every
# `go test` (as every seed corpus does, so `make test` replays them all).
FUZZTIME  ?= 30s
FUZZ_PKGS ?= ./...
FUZZ_ARGS ?=

.PHONY: fuzz
fuzz: ## Fuzz every Go fuzz target in turn for FUZZTIME (default 30s); not part of `make test`, which runs their seed corpora.
	@failed=""; \
	for dir in $$($(GO) list -f '{{.Dir}}' $(FUZZ_PKGS) | while read -r d; do \
	    grep -lqE '^func Fuzz[A-Za-z0-9_]*\(' "$$d"/*_test.go 2>/dev/null && echo "$$d"; done); do \
	  for target in $$(cd "$$dir" && $(GO) test -list '^Fuzz' . | grep '^Fuzz'); do \
	    echo "== fuzz $$target in $${dir#$(CURDIR)/} for $(FUZZTIME)"; \
	    (cd "$$dir" && $(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) $(FUZZ_ARGS) .) || failed="$$failed $${dir#$(CURDIR)/}:$$target"; \
	  done; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz failures:$$failed"; exit 1; fi

##@ Demo

# NODE=1: on a real single-node Kubernetes on this machine (root; docs/node.md).
NODE ?=

.PHONY: demo
demo: ## Run the whole system locally (control plane, operator, worker pool, coordinator) and serve http://127.0.0.1:8080/v1; NODE=1 runs it on a real node (kubelet, pods, the coordinator Service).
	$(GO) run ./hack/demo $(if $(NODE),-node)

.PHONY: help
help: ## Show targets.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*?##/ { printf "  %-18s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

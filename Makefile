# c8s: confidential containers, one confidential VM per pod.
# `make help` lists the targets.

SHELL        := /bin/bash
GO           ?= go
BIN          := $(CURDIR)/bin
OUT          := $(CURDIR)/_output
TOOLS_BIN    := $(OUT)/tools/bin
IMAGE_OUT    := $(OUT)/image
PREFIX       ?= /usr/local
GOFLAGS_BUILD := -trimpath -buildvcs=false

HOST_CMDS  := ./shim/cmd/containerd-shim-c8s-v2 ./launcher/cmd/c8s-launcher ./launcher/cmd/c8s-verify ./measurements/cmd/c8s-measure
GUEST_CMDS := ./guest/cmd/c8s-agent

export PATH := $(TOOLS_BIN):$(PATH)
# When this make started, so that `make demo` can print the time it took in all.
ifndef C8S_MAKE_START
C8S_MAKE_START := $(shell date +%s)
endif
export C8S_MAKE_START

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z_-]+:.*## /{printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build every binary into bin/.
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o $(BIN)/ $(HOST_CMDS)
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -ldflags '-s -w' -o $(BIN)/ $(GUEST_CMDS)

.PHONY: deps
deps: ## Install the Debian packages c8s builds and tests with (idempotent).
	hack/install-deps.sh

.PHONY: deps-demo
deps-demo: ## Install only the Debian packages `make demo` needs (idempotent).
	hack/install-deps.sh demo

.PHONY: tools
tools: ## Build containerd, Kubernetes (etcd, apiserver, controller-manager, scheduler, kubelet), crictl, critest and CNI plugins from their Go modules (cached).
	hack/build-tools.sh $(TOOLS_BIN) containerd kubernetes
	hack/build-critools.sh $(TOOLS_BIN)

.PHONY: tools-containerd
tools-containerd: ## Build only containerd, ctr and the runc shim from their Go module (cached): all `make demo` needs.
	hack/build-tools.sh $(TOOLS_BIN) containerd

.PHONY: protos
protos: ## Regenerate the ttrpc APIs (guest/api, shim/api).
	hack/protos.sh generate

.PHONY: check-protos
check-protos: ## Fail if the generated ttrpc APIs are not current.
	hack/protos.sh check

.PHONY: image
image: build ## Build the guest image (kernel, initramfs, manifest) into _output/image.
	images/build.sh $(IMAGE_OUT)

.PHONY: image-verify
image-verify: build ## Build the guest image twice and prove the builds are identical.
	images/verify-reproducible.sh

.PHONY: unit
unit: ## Run the Go tests as they are (no installs; end-to-end tests skip without their prerequisites).
	$(GO) test ./...

.PHONY: lint
lint: ## Run staticcheck over the tree (built from its pinned module into _output/tools, cached).
	hack/lint.sh

.PHONY: test
test: deps tools image ## Install what is needed, then run every test, end to end included (lint too).
	hack/test.sh

.PHONY: demo
demo: ## Run a container inside a confidential VM through a private containerd (installs and builds only what it needs).
	@# The package installs overlap the Go builds, which need none of them.
	$(MAKE) --no-print-directory -j3 deps-demo tools-containerd build
	$(MAKE) --no-print-directory image
	hack/demo.sh

.PHONY: bench
bench: deps tools image ## Print the benchmark figures and ratios against peers.
	hack/bench.sh

.PHONY: conformance
conformance: deps tools build image ## critest's CRI suite with c8s and with runc, counts side by side (long).
	hack/conformance.sh

.PHONY: fresh-check
fresh-check: ## Prove a clone builds and passes `make unit` in a fresh Debian 12 root (debootstrap; slow).
	hack/fresh-check.sh

.PHONY: fuzz
fuzz: ## Run every fuzz target (found with go test -list) for a bounded time each.
	hack/fuzz.sh

.PHONY: install
install: build image ## Install binaries, guest image, configs and the containerd handlers (RESTART=1 restarts containerd).
	hack/install.sh $(PREFIX)

.PHONY: uninstall
uninstall: ## Undo `make install` (restores containerd's config; RESTART=1 restarts containerd).
	bin/c8s-launcher uninstall --root "$${DESTDIR:-/}" --prefix $(PREFIX) $$([ "$${RESTART:-0}" = 1 ] && echo --restart)

.PHONY: clean
clean: ## Remove build outputs (keeps the tool cache in _output/tools).
	rm -rf $(BIN) $(IMAGE_OUT)

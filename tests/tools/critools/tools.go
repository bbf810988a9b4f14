//go:build tools

// Package critools pins crictl and critest from cri-tools, the CRI client and
// the CRI validation suite that the c8s end-to-end tests and
// `make conformance` run against containerd. It is its own module, apart
// from tests/tools, so that cri-tools' Kubernetes libraries never change
// the versions containerd is built with. hack/build-tools.sh builds both.
//
// critest is a Go test binary (`go test -c` of cmd/critest, as cri-tools'
// own Makefile builds it), so the packages its test imports are pinned here.
//
// The CNI plugins (bridge, host-local, loopback, portmap) give containerd's
// CRI pod networking for critest, whose pods mostly use their own network
// namespace.
//
// v1.34 is the cri-tools release that matches the CRI API (k8s.io/cri-api
// v0.34) of the containerd version c8s is built against.
package critools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
	_ "github.com/onsi/ginkgo/v2"
	_ "github.com/onsi/gomega"
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
	_ "sigs.k8s.io/cri-tools/pkg/benchmark"
	_ "sigs.k8s.io/cri-tools/pkg/validate"
)

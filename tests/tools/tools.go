//go:build tools

// Package tools pins the third-party commands that c8s tests run against
// (containerd, ctr and the runc shim). hack/build-tools.sh builds them from
// this module, at the containerd version the root go.mod requires.
//
// To add a tool, blank-import its main package here, `go get` its module in
// this directory, and add the package to TOOLS in hack/build-tools.sh.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)

//go:build tools

// Package staticcheck pins staticcheck (honnef.co/go/tools), the linter
// that `make lint` and `make test` run over the tree. hack/build-tools.sh
// builds it from this module, at the version required here, into the tools
// output directory. It is a module of its own so that the linter's
// dependencies (golang.org/x/tools) never move the versions c8s builds with.
//
// v0.8.2 is staticcheck 2026.2.2, a release that understands Go 1.26. To
// move it, `go get honnef.co/go/tools@VERSION && go mod tidy` here and fix
// what the new release reports.
package staticcheck

import (
	_ "honnef.co/go/tools/cmd/staticcheck"
)

// Command c8s-launcher is the node-side tool of c8s: QEMU command lines,
// the accelerator probe, diagnostics, install, node discovery and
// attestation of running pods. Each subcommand lives in its own cmd_*.go
// file and registers itself from an init function.
package main

import (
	"context"
	"flag"
	"io"

	"github.com/c8s-dev/c8s/internal/subcmd"
)

var tool = subcmd.New("c8s-launcher")

func register(name, summary string, run func(ctx context.Context, args []string, stdout io.Writer) error) {
	tool.Register(name, summary, run)
}

// newFlags returns a flag set for subcommand name that reports errors
// instead of exiting.
func newFlags(name string) *flag.FlagSet { return tool.FlagSet(name) }

func main() { tool.Main() }

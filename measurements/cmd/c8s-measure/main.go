// Command c8s-measure precomputes the launch digests of confidential VMs
// (SEV, SEV-ES, SEV-SNP, TDX, IGVM, UKI and c8s's sim TEE) from the
// artefacts they boot. Each subcommand lives in its own file and registers
// itself from an init function.
package main

import (
	"context"
	"io"

	"github.com/c8s-dev/c8s/internal/subcmd"
)

var tool = subcmd.New("c8s-measure")

// register adds a subcommand; c8s-measure's subcommands write to their own
// package-level outputs (sevOut, tdxOut), which tests replace.
func register(name, summary string, run func(args []string) error) {
	tool.Register(name, summary, func(_ context.Context, args []string, _ io.Writer) error { return run(args) })
}

func main() { tool.Main() }

// Command c8s-measure precomputes the launch digests of confidential VMs
// (SEV, SEV-ES, SEV-SNP, TDX, IGVM, UKI and c8s's sim TEE) from the
// artefacts they boot. Each subcommand lives in its own file and registers
// itself from an init function.
package main

import (
	"context"
	"io"
	"os"

	"github.com/c8s-dev/c8s/internal/subcmd"
)

// tool is the subcommand table; the init functions fill it in, and it is
// only read once main runs.
var tool = subcmd.New("c8s-measure")

// runFunc is a subcommand: it prints its results to stdout and its
// warnings and notes to stderr.
type runFunc func(args []string, stdout, stderr io.Writer) error

// register adds a subcommand. It prints to the stdout subcmd hands it, and
// to the process's stderr.
func register(name, summary string, run runFunc) {
	tool.Register(name, summary, func(_ context.Context, args []string, stdout io.Writer) error {
		return run(args, stdout, os.Stderr)
	})
}

func main() { tool.Main() }

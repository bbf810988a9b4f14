// Command c8s-launcher is the node-side launcher tool: it shows the QEMU
// command line c8s would run for a configuration and probes the
// accelerator. Each subcommand lives in its own cmd_*.go file and registers
// itself from an init function.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
)

// command is one subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout io.Writer) error
}

var commands = map[string]command{}

func register(name, summary string, run func(ctx context.Context, args []string, stdout io.Writer) error) {
	if _, dup := commands[name]; dup {
		panic("c8s-launcher: duplicate subcommand " + name)
	}
	commands[name] = command{summary: summary, run: run}
}

// newFlags returns a flag set for subcommand name that reports errors
// instead of exiting.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("c8s-launcher "+name, flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	return fs
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: c8s-launcher COMMAND [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-12s %s\n", n, commands[n].summary)
	}
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	cmd, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "c8s-launcher: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if err := cmd.run(context.Background(), os.Args[2:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "c8s-launcher %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

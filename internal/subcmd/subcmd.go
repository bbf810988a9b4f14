// Package subcmd dispatches the subcommands of c8s's command-line tools
// (c8s-launcher, c8s-measure): each subcommand registers itself from its
// own file, and Main runs the one named on the command line.
package subcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
)

// Func runs a subcommand with its arguments, printing results to stdout.
type Func func(ctx context.Context, args []string, stdout io.Writer) error

type command struct {
	summary string
	run     Func
}

// Tool is one command-line tool and its subcommands.
type Tool struct {
	name     string
	commands map[string]command
}

// New returns the tool called name.
func New(name string) *Tool { return &Tool{name: name, commands: map[string]command{}} }

// Register adds a subcommand; registering a name twice is a programming
// error and panics at start-up.
func (t *Tool) Register(name, summary string, run Func) {
	if _, dup := t.commands[name]; dup {
		panic(t.name + ": duplicate subcommand " + name)
	}
	t.commands[name] = command{summary: summary, run: run}
}

// FlagSet returns a flag set for subcommand name that reports errors
// instead of exiting.
func (t *Tool) FlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(t.name+" "+name, flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	return fs
}

// Run runs subcommand name.
func (t *Tool) Run(ctx context.Context, name string, args []string, stdout io.Writer) error {
	cmd, ok := t.commands[name]
	if !ok {
		return fmt.Errorf("unknown command %q", name)
	}
	return cmd.run(ctx, args, stdout)
}

// Usage prints the subcommands.
func (t *Tool) Usage(w io.Writer) {
	fmt.Fprintf(w, "usage: %s COMMAND [flags]\n\ncommands:\n", t.name)
	names := make([]string, 0, len(t.commands))
	width := 0
	for n := range t.commands {
		names = append(names, n)
		width = max(width, len(n))
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-*s  %s\n", width, n, t.commands[n].summary)
	}
}

// Main runs the subcommand named by os.Args and exits: 0 on success (or
// help), 1 when the subcommand fails, 2 for a usage error.
func (t *Tool) Main() {
	args := os.Args[1:]
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		t.Usage(os.Stderr)
		if len(args) == 0 {
			os.Exit(2)
		}
		return
	}
	if _, ok := t.commands[args[0]]; !ok {
		fmt.Fprintf(os.Stderr, "%s: unknown command %q\n", t.name, args[0])
		t.Usage(os.Stderr)
		os.Exit(2)
	}
	if err := t.Run(context.Background(), args[0], args[1:], os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintf(os.Stderr, "%s %s: %v\n", t.name, args[0], err)
		os.Exit(1)
	}
}

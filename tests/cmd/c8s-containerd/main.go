// Command c8s-containerd runs a private containerd for the scripts, with
// the code the Go tests use (tests/internal/containerdtest):
//
//	c8s-containerd start [--dir DIR] [--namespace NS] [--cri] [--extra-config FILE]
//	                     [--path-prefix DIRS] [--tools-bin DIR] [--log FILE] [--log-level LEVEL]
//	c8s-containerd stop --dir DIR
//
// start returns once the daemon answers, leaving it running, and prints
// shell assignments for eval: CD_DIR, CD_SOCK, CD_NAMESPACE, CD_LOG and
// CD_PID. stop ends the namespace's tasks, the daemon and every process
// whose command line names the directory, unmounts what remains below it
// and removes it.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/c8s-dev/c8s/tests/internal/containerdtest"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "c8s-containerd:", err)
		os.Exit(1)
	}
}

const usage = "usage: c8s-containerd start [flags] | c8s-containerd stop --dir DIR"

func run(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "start":
		return start(args[1:], stdout)
	case "stop":
		return stop(args[1:])
	}
	return fmt.Errorf("unknown command %q; %s", args[0], usage)
}

func start(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("start", flag.ContinueOnError)
	var o containerdtest.Options
	fs.StringVar(&o.Dir, "dir", "", "directory for everything (default: a new temporary one)")
	fs.StringVar(&o.Namespace, "namespace", "", "ctr's namespace (default: "+containerdtest.NamespacePrefix+"SUFFIX)")
	fs.BoolVar(&o.CRI, "cri", false, "keep the CRI plugins enabled")
	extra := fs.String("extra-config", "", "TOML file of tables appended to the generated config")
	prefix := fs.String("path-prefix", "", "directories (colon-separated) put first in the daemon's PATH, e.g. the repository's bin/ for containerd-shim-c8s-v2")
	fs.StringVar(&o.ToolsBin, "tools-bin", "", "directory of containerd and ctr (default: $"+containerdtest.EnvToolsBin+", else _output/tools/bin)")
	fs.StringVar(&o.LogPath, "log", "", "file for the daemon's output (default: DIR/containerd.log)")
	fs.StringVar(&o.LogLevel, "log-level", "", "the daemon's log level (default debug)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return errors.New(usage)
	}
	if *extra != "" {
		b, err := os.ReadFile(*extra)
		if err != nil {
			return err
		}
		o.ExtraConfig = string(b)
	}
	if *prefix != "" {
		o.PathPrefix = filepath.SplitList(*prefix)
	}
	d, err := containerdtest.Run(o)
	if err != nil {
		return err
	}
	for _, kv := range [][2]string{{"CD_DIR", d.Dir}, {"CD_SOCK", d.Address}, {"CD_NAMESPACE", d.Namespace}, {"CD_LOG", d.LogPath}, {"CD_PID", fmt.Sprint(d.Pid)}} {
		fmt.Fprintf(stdout, "%s=%s\n", kv[0], shellQuote(kv[1]))
	}
	return nil
}

func stop(args []string) error {
	fs := flag.NewFlagSet("stop", flag.ContinueOnError)
	dir := fs.String("dir", "", "the directory start printed as CD_DIR")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || fs.NArg() != 0 {
		return errors.New("usage: c8s-containerd stop --dir DIR")
	}
	d, err := containerdtest.Attach(*dir)
	if err != nil {
		return err
	}
	return d.Close()
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

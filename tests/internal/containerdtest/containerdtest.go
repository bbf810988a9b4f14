// Package containerdtest is c8s's one way to run a private containerd: its
// own root, state, sockets and config in one directory, the binaries built
// by `make tools` (hack/build-tools.sh), and a ctr wrapper bound to it.
//
// Go tests call Start, which stops and removes everything in t.Cleanup.
// The scripts (hack/lib/containerd.sh for the demo and the benchmarks,
// hack/conformance.sh) call the same code through tests/cmd/c8s-containerd
// (start, stop), which is Run and Close.
//
// To run containers with the c8s runtime, put the repository's bin/ first in
// the daemon's PATH, so that containerd finds containerd-shim-c8s-v2 for the
// runtime name io.containerd.c8s.v2, and add any runtime options as TOML:
//
//	root, _ := containerdtest.RepoRoot()
//	d := containerdtest.Start(t, containerdtest.Options{
//		PathPrefix:  []string{filepath.Join(root, "bin")},
//		ExtraConfig: "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.c8s]\n  runtime_type = \"io.containerd.c8s.v2\"\n",
//		CRI:         true,
//	})
//	d.Ctr(t, "run", "--rm", "--runtime", "io.containerd.c8s.v2", image, "id", "echo", "hi")
//
// A test that checks what a container printed reads it from a file
// (ctr run --log-uri file:///path): ctr's own stdout can miss the last
// lines, as its client closes the output FIFOs on the task's exit before
// it has read them to the end.
//
// Without the binaries (or without root) a test is skipped with the reason,
// unless C8S_E2E_REQUIRED=1, in which case it fails.
package containerdtest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Environment variables read by this package.
const (
	// EnvRequired, set to "1", turns every skip for a missing prerequisite
	// into a failure (CI sets it).
	EnvRequired = "C8S_E2E_REQUIRED"
	// EnvToolsBin overrides the directory holding containerd and ctr.
	EnvToolsBin = "C8S_TOOLS_BIN"
)

// NamespacePrefix starts the namespace ctr uses unless Options names one. A
// suffix unique to the daemon follows, because ctr places containers in the
// cgroup /<namespace>/<id>, which concurrent daemons would otherwise share.
const NamespacePrefix = "c8s-test-"

// Options configures Start.
type Options struct {
	// ToolsBin holds containerd, ctr and containerd-shim-runc-v2. Default:
	// $C8S_TOOLS_BIN, else _output/tools/bin in the repository.
	ToolsBin string
	// PathPrefix directories come first in the daemon's and ctr's PATH, so
	// that containerd finds shims there (e.g. the repository's bin/ for
	// containerd-shim-c8s-v2).
	PathPrefix []string
	// ExtraConfig is TOML appended to the generated config. The generated
	// part ends with tables, so ExtraConfig must consist of tables only and
	// must not repeat [grpc], [ttrpc], [debug] or the opt and NRI plugins.
	ExtraConfig string
	// CRI keeps the CRI plugins enabled (they are disabled by default).
	CRI bool
	// Namespace for ctr (NamespacePrefix and a unique suffix if empty).
	Namespace string
	// NRI enables containerd's NRI plugin (disabled by default), with its
	// socket at Daemon.NRISocket and no plugin directories of the node's:
	// plugins connect to the socket (github.com/containerd/nri's
	// pkg/stub, stub.WithSocketPath).
	NRI bool
	// Dir is the directory to keep everything in (created if missing;
	// removed by Close). Default: a new temporary directory, short
	// because socket paths must fit in 108 bytes.
	Dir string
	// LogPath receives the daemon's output. Default: containerd.log in
	// Dir.
	LogPath string
	// LogLevel is the daemon's log level (default "debug").
	LogLevel string
}

// RepoRoot returns the root of the c8s repository, found by walking up from
// the working directory to the go.mod of module github.com/c8s-dev/c8s.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && firstLine(data) == "module github.com/c8s-dev/c8s" {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the c8s repository (no go.mod of github.com/c8s-dev/c8s above the working directory)")
		}
		dir = parent
	}
}

func firstLine(data []byte) string {
	line, _, _ := bytes.Cut(data, []byte("\n"))
	return strings.TrimSpace(string(line))
}

// SkipOrFail skips the test with reason, or fails it when EnvRequired=1.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv(EnvRequired) == "1" {
		t.Fatalf(format+" ("+EnvRequired+"=1)", args...)
	}
	t.Skipf(format, args...)
}

// ToolsBin returns the directory holding the containerd binaries, or skips
// (fails under EnvRequired=1) when they are absent.
func ToolsBin(t testing.TB) string {
	t.Helper()
	dir, err := DefaultToolsBin()
	if err != nil {
		t.Fatal(err)
	}
	if err := checkTools(dir); err != nil {
		SkipOrFail(t, "%v", err)
	}
	return dir
}

// Start runs a private containerd for the test and waits until it
// answers; t.Cleanup stops it and removes its directory. It needs root;
// without it (or without the binaries) the test is skipped, or fails under
// EnvRequired=1.
func Start(t testing.TB, opts Options) *Daemon {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipOrFail(t, "containerd needs root")
	}
	if opts.ToolsBin == "" {
		opts.ToolsBin = ToolsBin(t)
	}
	d, err := Run(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("containerd log (%s):\n%s", d.LogPath, d.Log())
		}
		if err := d.Close(); err != nil {
			t.Errorf("stop the private containerd: %v", err)
		}
	})
	return d
}

// Ctr runs ctr with args and returns its standard output (ctr's warnings,
// e.g. about cgroup v1, go to standard error). On error it fails the test,
// showing both outputs and the daemon's log.
func (d *Daemon) Ctr(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := d.CtrCommand(ctx, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("ctr %s: %v\nstdout:\n%s\nstderr:\n%s\ncontainerd log:\n%s",
			strings.Join(args, " "), err, stdout.String(), stderr.String(), d.Log())
	}
	return stdout.String()
}

// Package containerdtest starts a private containerd for a test: its own
// root, state, sockets and config in a temporary directory, the binaries
// built by `make tools` (hack/build-tools.sh), and a ctr wrapper bound to it.
// Everything it started is stopped and removed in t.Cleanup.
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
// Without the binaries (or without root) a test is skipped with the reason,
// unless C8S_E2E_REQUIRED=1, in which case it fails.
package containerdtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"text/template"
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

// criPlugins are disabled unless Options.CRI is set.
var criPlugins = []string{
	"io.containerd.grpc.v1.cri",
	"io.containerd.cri.v1.runtime",
	"io.containerd.cri.v1.images",
	"io.containerd.podsandbox.controller.v1.podsandbox",
}

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
}

// Daemon is a running private containerd.
type Daemon struct {
	Dir          string // temporary directory holding everything below
	Root         string
	State        string
	Address      string // gRPC socket
	TTRPCAddress string
	ConfigPath   string
	LogPath      string
	NRISocket    string // NRI's socket when Options.NRI is set
	Namespace    string
	ToolsBin     string

	env  []string
	cmd  *exec.Cmd
	done chan error
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
	dir := os.Getenv(EnvToolsBin)
	if dir == "" {
		root, err := RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(root, "_output", "tools", "bin")
	}
	for _, bin := range []string{"containerd", "ctr", "containerd-shim-runc-v2"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			SkipOrFail(t, "%s not found in %s: run make tools", bin, dir)
		}
	}
	return dir
}

var configTemplate = template.Must(template.New("config").Parse(`version = 3
root = "{{.Root}}"
state = "{{.State}}"
disabled_plugins = [{{range $i, $p := .Disabled}}{{if $i}}, {{end}}"{{$p}}"{{end}}]

[grpc]
  address = "{{.Address}}"

[ttrpc]
  address = "{{.TTRPCAddress}}"

[debug]
  level = "debug"

[plugins.'io.containerd.internal.v1.opt']
  path = "{{.Dir}}/opt"

[plugins.'io.containerd.nri.v1.nri']
{{- if .NRISocket}}
  disable = false
  socket_path = "{{.NRISocket}}"
  plugin_path = "{{.Dir}}/nri/plugins"
  plugin_config_path = "{{.Dir}}/nri/conf.d"
{{- else}}
  disable = true
{{- end}}

{{.Extra}}
`))

// Start runs a private containerd and waits until it answers. It needs
// root; without it (or without the binaries) the test is skipped, or fails
// under EnvRequired=1.
func Start(t testing.TB, opts Options) *Daemon {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipOrFail(t, "containerd needs root")
	}
	if opts.ToolsBin == "" {
		opts.ToolsBin = ToolsBin(t)
	}
	// A short directory: socket paths must fit in 108 bytes.
	dir, err := os.MkdirTemp("", "c8s-ctd-")
	if err != nil {
		t.Fatal(err)
	}
	if opts.Namespace == "" {
		opts.Namespace = NamespacePrefix + strings.TrimPrefix(filepath.Base(dir), "c8s-ctd-")
	}
	d := &Daemon{
		Dir:          dir,
		Root:         filepath.Join(dir, "root"),
		State:        filepath.Join(dir, "state"),
		Address:      filepath.Join(dir, "containerd.sock"),
		TTRPCAddress: filepath.Join(dir, "containerd.sock.ttrpc"),
		ConfigPath:   filepath.Join(dir, "config.toml"),
		LogPath:      filepath.Join(dir, "containerd.log"),
		Namespace:    opts.Namespace,
		ToolsBin:     opts.ToolsBin,
		done:         make(chan error, 1),
	}
	if opts.NRI {
		d.NRISocket = filepath.Join(dir, "nri.sock")
	}
	t.Cleanup(func() { d.stop(t) })

	var disabled []string
	if !opts.CRI {
		disabled = criPlugins
	}
	var cfg bytes.Buffer
	if err := configTemplate.Execute(&cfg, map[string]any{
		"Root": d.Root, "State": d.State, "Address": d.Address, "TTRPCAddress": d.TTRPCAddress,
		"Dir": dir, "Disabled": disabled, "Extra": opts.ExtraConfig, "NRISocket": d.NRISocket,
	}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.ConfigPath, cfg.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}

	path := slices.Concat(opts.PathPrefix, []string{opts.ToolsBin, os.Getenv("PATH"), "/usr/local/sbin:/usr/sbin:/sbin"})
	d.env = append(os.Environ(), "PATH="+strings.Join(path, string(os.PathListSeparator)))

	logFile, err := os.Create(d.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	d.cmd = exec.Command(filepath.Join(opts.ToolsBin, "containerd"), "--config", d.ConfigPath)
	d.cmd.Env = d.env
	d.cmd.Stdout = logFile
	d.cmd.Stderr = logFile
	// Own process group: a Ctrl-C of the test does not reach it first, and
	// stop can signal exactly this daemon.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	go func() { d.done <- d.cmd.Wait() }()

	if err := d.waitReady(60 * time.Second); err != nil {
		t.Fatalf("%v\ncontainerd log:\n%s", err, d.Log())
	}
	return d
}

// waitReady polls `ctr version` until the daemon answers, it exits, or the
// limit passes (a guard against hangs, not a performance check).
func (d *Daemon) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		select {
		case err := <-d.done:
			d.done <- err
			return fmt.Errorf("containerd exited during start-up: %v", err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := d.CtrCommand(ctx, "version").CombinedOutput()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd did not answer on %s within %v: %v", d.Address, limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// CtrCommand returns a ctr command bound to this daemon and namespace.
func (d *Daemon) CtrCommand(ctx context.Context, args ...string) *exec.Cmd {
	full := append([]string{"--address", d.Address, "--namespace", d.Namespace}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(d.ToolsBin, "ctr"), full...)
	cmd.Env = d.env
	return cmd
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

// Log returns the daemon's log so far.
func (d *Daemon) Log() string {
	data, err := os.ReadFile(d.LogPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return string(data)
}

// stop ends the tasks in the namespace, the daemon, and any shim it left,
// unmounts what remains under Dir and removes Dir.
func (d *Daemon) stop(t testing.TB) {
	if d.cmd != nil && d.cmd.Process != nil {
		if t.Failed() {
			t.Logf("containerd log (%s):\n%s", d.LogPath, d.Log())
		}
		d.killTasks()
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(15 * time.Second):
			_ = d.cmd.Process.Kill()
			<-d.done
		}
	}
	killProcessesMentioning(d.Dir)
	unmountUnder(d.Dir)
	if err := os.RemoveAll(d.Dir); err != nil {
		t.Errorf("remove containerd test directory: %v", err)
	}
}

// killTasks kills and deletes every task left in the namespace.
func (d *Daemon) killTasks() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := d.CtrCommand(ctx, "tasks", "ls", "--quiet").Output()
	if err != nil {
		return
	}
	for _, id := range strings.Fields(string(out)) {
		_ = d.CtrCommand(ctx, "tasks", "kill", "--signal", "SIGKILL", id).Run()
		_ = d.CtrCommand(ctx, "tasks", "delete", "--force", id).Run()
		_ = d.CtrCommand(ctx, "containers", "delete", id).Run()
	}
}

// killProcessesMentioning SIGKILLs the processes whose command line names
// dir: shims started by this daemon carry its socket path.
func killProcessesMentioning(dir string) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	self := os.Getpid()
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(dir)) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// unmountUnder detaches every mount below dir, deepest first.
func unmountUnder(dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			points = append(points, fields[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, p := range points {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
}

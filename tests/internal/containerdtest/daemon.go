package containerdtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/template"
	"time"
)

// criPlugins are disabled unless Options.CRI is set.
var criPlugins = []string{
	"io.containerd.grpc.v1.cri",
	"io.containerd.cri.v1.runtime",
	"io.containerd.cri.v1.images",
	"io.containerd.podsandbox.controller.v1.podsandbox",
}

// StateFile, in a Daemon's Dir, records what Attach needs to find a daemon
// that another process started (c8s-containerd start, then stop).
const StateFile = "harness.json"

// Daemon is a running private containerd.
type Daemon struct {
	Dir          string `json:"dir"` // directory holding everything below
	Root         string `json:"root"`
	State        string `json:"state"`
	Address      string `json:"address"` // gRPC socket
	TTRPCAddress string `json:"ttrpc_address"`
	ConfigPath   string `json:"config"`
	LogPath      string `json:"log"`
	NRISocket    string `json:"nri_socket,omitempty"` // NRI's socket when Options.NRI is set
	Namespace    string `json:"namespace"`
	ToolsBin     string `json:"tools_bin"`
	// Pid is the containerd process.
	Pid int `json:"pid"`

	env  []string
	cmd  *exec.Cmd
	done chan error
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
  level = "{{.LogLevel}}"

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

// DefaultToolsBin is where the containerd binaries are: $C8S_TOOLS_BIN,
// else _output/tools/bin in the repository.
func DefaultToolsBin() (string, error) {
	if dir := os.Getenv(EnvToolsBin); dir != "" {
		return dir, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "_output", "tools", "bin"), nil
}

// checkTools fails when dir lacks a binary Run needs.
func checkTools(dir string) error {
	for _, bin := range []string{"containerd", "ctr", "containerd-shim-runc-v2"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return fmt.Errorf("%s not found in %s: run make tools", bin, dir)
		}
	}
	return nil
}

// Run starts a private containerd and waits until it answers. The daemon
// runs in its own process group and outlives the caller unless Close
// stops it. On error nothing is left running and a directory Run created
// is removed.
func Run(opts Options) (_ *Daemon, retErr error) {
	if opts.ToolsBin == "" {
		dir, err := DefaultToolsBin()
		if err != nil {
			return nil, err
		}
		opts.ToolsBin = dir
	}
	if err := checkTools(opts.ToolsBin); err != nil {
		return nil, err
	}
	dir := opts.Dir
	if dir == "" {
		// A short directory: socket paths must fit in 108 bytes.
		var err error
		if dir, err = os.MkdirTemp("", "c8s-ctd-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if opts.Namespace == "" {
		opts.Namespace = NamespacePrefix + strings.TrimPrefix(filepath.Base(dir), "c8s-ctd-")
	}
	if opts.LogPath == "" {
		opts.LogPath = filepath.Join(dir, "containerd.log")
	}
	if opts.LogLevel == "" {
		opts.LogLevel = "debug"
	}
	d := &Daemon{
		Dir:          dir,
		Root:         filepath.Join(dir, "root"),
		State:        filepath.Join(dir, "state"),
		Address:      filepath.Join(dir, "containerd.sock"),
		TTRPCAddress: filepath.Join(dir, "containerd.sock.ttrpc"),
		ConfigPath:   filepath.Join(dir, "config.toml"),
		LogPath:      opts.LogPath,
		Namespace:    opts.Namespace,
		ToolsBin:     opts.ToolsBin,
		done:         make(chan error, 1),
	}
	if opts.NRI {
		d.NRISocket = filepath.Join(dir, "nri.sock")
	}
	defer func() {
		if retErr != nil {
			if err := d.Close(); err != nil {
				retErr = fmt.Errorf("%w (and cleaning up: %v)", retErr, err)
			}
		}
	}()

	var disabled []string
	if !opts.CRI {
		disabled = criPlugins
	}
	var cfg bytes.Buffer
	if err := configTemplate.Execute(&cfg, map[string]any{
		"Root": d.Root, "State": d.State, "Address": d.Address, "TTRPCAddress": d.TTRPCAddress,
		"Dir": dir, "Disabled": disabled, "Extra": opts.ExtraConfig, "NRISocket": d.NRISocket, "LogLevel": opts.LogLevel,
	}); err != nil {
		return nil, err
	}
	if err := os.WriteFile(d.ConfigPath, cfg.Bytes(), 0o600); err != nil {
		return nil, err
	}

	path := slices.Concat(opts.PathPrefix, []string{opts.ToolsBin, os.Getenv("PATH"), "/usr/local/sbin:/usr/sbin:/sbin"})
	d.env = append(os.Environ(), "PATH="+strings.Join(path, string(os.PathListSeparator)))

	logFile, err := os.Create(d.LogPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	d.cmd = exec.Command(filepath.Join(opts.ToolsBin, "containerd"), "--config", d.ConfigPath)
	d.cmd.Env = d.env
	d.cmd.Stdout = logFile
	d.cmd.Stderr = logFile
	// Own process group: a Ctrl-C of the test or script does not reach it
	// first, and Close can signal exactly this daemon.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	d.Pid = d.cmd.Process.Pid
	go func() { d.done <- d.cmd.Wait() }()
	state, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, StateFile), append(state, '\n'), 0o600); err != nil {
		return nil, err
	}
	if err := d.waitReady(60 * time.Second); err != nil {
		return nil, fmt.Errorf("%w\ncontainerd log:\n%s", err, d.Log())
	}
	return d, nil
}

// Attach returns the daemon that Run started in dir, from its StateFile.
func Attach(dir string) (*Daemon, error) {
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		return nil, fmt.Errorf("no private containerd in %s: %w", dir, err)
	}
	d := &Daemon{env: os.Environ()}
	if err := json.Unmarshal(b, d); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, StateFile), err)
	}
	if d.Dir != dir {
		if abs, _ := filepath.Abs(dir); d.Dir != abs {
			return nil, fmt.Errorf("%s describes a daemon in %s, not %s", StateFile, d.Dir, dir)
		}
	}
	return d, nil
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

// Log returns the daemon's log so far.
func (d *Daemon) Log() string {
	data, err := os.ReadFile(d.LogPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return string(data)
}

// Close ends the tasks in the namespace, the daemon, and any shim or VM it
// left (their command lines name Dir), unmounts what remains under Dir and
// removes Dir.
func (d *Daemon) Close() error {
	if d.Pid > 0 {
		d.killTasks()
		_ = syscall.Kill(d.Pid, syscall.SIGTERM)
		if !d.waitExit(15 * time.Second) {
			_ = syscall.Kill(d.Pid, syscall.SIGKILL)
			d.waitExit(15 * time.Second)
		}
	}
	killProcessesMentioning(d.Dir)
	unmountUnder(d.Dir)
	if err := os.RemoveAll(d.Dir); err != nil {
		return fmt.Errorf("remove the containerd directory: %w", err)
	}
	return nil
}

// waitExit waits until the daemon has exited: reaped, when this process
// started it, else gone from the process table.
func (d *Daemon) waitExit(limit time.Duration) bool {
	if d.cmd != nil {
		select {
		case err := <-d.done:
			d.done <- err
			return true
		case <-time.After(limit):
			return false
		}
	}
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err := syscall.Kill(d.Pid, 0); errors.Is(err, syscall.ESRCH) || zombie(d.Pid) {
			return true
		}
	}
	return false
}

// zombie reports whether pid has exited but not been reaped (its parent,
// the c8s-containerd that started it, is gone, and init reaps it later).
func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, ok := bytes.Cut(b, []byte(") "))
	return ok && len(rest) > 0 && rest[0] == 'Z'
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
// a path below dir: shims started by this daemon carry its socket path.
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
		if err == nil && bytes.Contains(cmdline, []byte(dir+"/")) {
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

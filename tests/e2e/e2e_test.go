// Package e2e tests c8s end to end: a real containerd 2.x built from its Go
// module drives containerd-shim-c8s-v2, which boots real pod VMs under
// QEMU with the guest image from `make image`. Every test here boots as
// few VMs as it can: one per scenario that needs a pod VM.
//
// Prerequisites (`make test` provides them all): root, `make build`,
// `make image`, `make tools`. Without them the tests skip with the reason,
// or fail when C8S_E2E_REQUIRED=1.
package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/console"

	"github.com/c8s-dev/c8s/manifest"
	"github.com/c8s-dev/c8s/tests/internal/containerdtest"
	"github.com/c8s-dev/c8s/tests/internal/ociimage"
)

const (
	runtimeType = "io.containerd.c8s.v2"
	image       = "docker.io/c8s/busybox:test"
)

// env is one private containerd with the c8s runtime and the test image.
type env struct {
	d        *containerdtest.Daemon
	root     string
	config   string // c8s config of the working setup
	stateDir string // its runtime.state_dir
	imageDir string // _output/image
}

func setup(t *testing.T) *env {
	t.Helper()
	root, err := containerdtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	e := &env{root: root, imageDir: filepath.Join(root, "_output", "image")}
	for _, f := range []string{
		filepath.Join(root, "bin", "containerd-shim-c8s-v2"),
		filepath.Join(e.imageDir, "vmlinuz"),
		filepath.Join(e.imageDir, "initrd.img"),
	} {
		if _, err := os.Stat(f); err != nil {
			containerdtest.SkipOrFail(t, "%s is missing: run make build image", f)
		}
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		containerdtest.SkipOrFail(t, "qemu-system-x86_64 not found: run make deps")
	}
	e.d = containerdtest.Start(t, containerdtest.Options{PathPrefix: []string{filepath.Join(root, "bin")}})
	e.stateDir = filepath.Join(e.d.Dir, "c8s")
	e.config = e.writeConfig(t, "c8s.toml", fmt.Sprintf(`
[hypervisor]
kernel = %q
initrd = %q
tee = "sim"
accel = "auto"
enable_annotations = ["default_memory"]

[runtime]
state_dir = %q
`, filepath.Join(e.imageDir, "vmlinuz"), filepath.Join(e.imageDir, "initrd.img"), e.stateDir))

	tarball := filepath.Join(e.d.Dir, "busybox.tar")
	if err := ociimage.WriteFile(tarball, ociimage.Options{Name: image}); err != nil {
		t.Fatalf("build the test image: %v", err)
	}
	e.d.Ctr(t, "images", "import", tarball)
	return e
}

func (e *env) writeConfig(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(e.d.Dir, name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// run is `ctr run --runtime io.containerd.c8s.v2` with the given config.
func (e *env) run(ctx context.Context, config string, args ...string) *exec.Cmd {
	full := append([]string{"run", "--runtime", runtimeType, "--runtime-config-path", config}, args...)
	return e.d.CtrCommand(ctx, full...)
}

// result runs cmd and returns its stdout, stderr and exit code.
func result(t *testing.T, cmd *exec.Cmd) (string, string, int) {
	t.Helper()
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("%s: %v", strings.Join(cmd.Args, " "), err)
	}
	return stdout.String(), stderr.String(), code
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	return c
}

// qemus lists the QEMU processes of this test's pods.
func (e *env) qemus(t *testing.T) []int {
	t.Helper()
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(data), "\x00", " ")
		if strings.Contains(cmd, "qemu-system") && strings.Contains(cmd, e.stateDir) {
			var pid int
			fmt.Sscanf(filepath.Base(filepath.Dir(p)), "%d", &pid)
			pids = append(pids, pid)
		}
	}
	return pids
}

// assertNothingLeft checks that no QEMU, shim, VM state dir (with its
// sockets), root disk or mount of this test's pods is left.
//
// The API, or a CRI call, can report a pod gone while containerd is still
// cleaning up after its shim: it runs the shim binary's short-lived
// `delete` action after the shim exits, and CRI unmounts a sandbox's
// /dev/shm asynchronously. So every check is made on one snapshot, taken
// again until a snapshot is clean or the deadline passes, and what the last
// snapshot saw is reported. (Checking the shim twice, once to wait and once
// to report, failed when the first look fell between the shim's exit and
// containerd's `delete` run and the second saw that run.)
func (e *env) assertNothingLeft(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		left := e.leftovers(t)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, l := range left {
				t.Error(l)
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// leftovers takes one snapshot of what this test's pods may leave behind.
func (e *env) leftovers(t *testing.T) []string {
	t.Helper()
	var left []string
	if pids := e.qemus(t); len(pids) > 0 {
		left = append(left, fmt.Sprintf("QEMU processes left behind: %v", pids))
	}
	// Shims of this daemon carry its socket in their command line.
	if pid := processMatching(t, "containerd-shim-c8s-v2", "-address "+e.d.Address); pid != 0 {
		left = append(left, fmt.Sprintf("shim process %d left behind", pid))
	}
	var files []string
	filepath.Walk(e.stateDir, func(path string, info os.FileInfo, err error) error {
		if err != nil || path == e.stateDir {
			return nil
		}
		rel, _ := filepath.Rel(e.stateDir, path)
		if rel == "cache" || rel == "node" {
			return filepath.SkipDir // node state (probe cache, sim identity) stays
		}
		files = append(files, rel)
		return nil
	})
	if len(files) > 0 {
		left = append(left, fmt.Sprintf("left in the c8s state dir: %v", files))
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, e.d.Dir) {
			left = append(left, "mount left behind: "+line)
		}
	}
	return left
}

// events collects containerd's task events while a test runs.
type events struct {
	cmd *exec.Cmd
	mu  sync.Mutex
	out strings.Builder
	wg  sync.WaitGroup
}

func (e *env) watchEvents(t *testing.T) *events {
	ev := &events{cmd: e.d.CtrCommand(context.Background(), "events")}
	pipe, err := ev.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := ev.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ev.wg.Add(1)
	go func() {
		defer ev.wg.Done()
		s := bufio.NewScanner(pipe)
		for s.Scan() {
			ev.mu.Lock()
			ev.out.WriteString(s.Text() + "\n")
			ev.mu.Unlock()
		}
	}()
	t.Cleanup(func() { ev.cmd.Process.Kill(); ev.cmd.Wait() })
	time.Sleep(200 * time.Millisecond) // let ctr subscribe
	return ev
}

func (ev *events) topics(id string) []string {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	var topics []string
	for _, line := range strings.Split(ev.out.String(), "\n") {
		if !strings.Contains(line, `"`+id+`"`) {
			continue
		}
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/tasks/") {
				topics = append(topics, f)
			}
		}
	}
	return topics
}

func kernelRelease(t *testing.T, imageDir string) string {
	t.Helper()
	m, err := manifest.Load(filepath.Join(imageDir, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	return m.Kernel.Release
}

// ptyRun runs cmd with a pseudo-terminal as its stdio (ctr -t needs one)
// and returns what it printed.
func ptyRun(t *testing.T, cmd *exec.Cmd) (string, int) {
	t.Helper()
	master, slave, err := console.NewPty()
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	s, err := os.OpenFile(slave, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s, s, s
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		s.Close()
		t.Fatal(err)
	}
	s.Close()
	var out strings.Builder
	done := make(chan struct{})
	go func() { io.Copy(&out, master); close(done) }()
	err = cmd.Wait()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), code
}

var ansi = regexp.MustCompile(`\x1b\[[0-9;?]*[a-zA-Z]`)

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runc "github.com/containerd/go-runc"
	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/ociruntime"
	"github.com/c8s-dev/c8s/guest/reaper"
	"github.com/c8s-dev/c8s/guest/rootfs"
)

// The service tests run the real agent against Debian's runc on the host:
// containers from a busybox rootfs on a loop-mounted ext4 image, over a real
// ttrpc connection. The agent's container logic does not need to be PID 1;
// the test binary becomes a child subreaper instead.

var testReaper *reaper.Reaper

func TestMain(m *testing.M) {
	r, err := reaper.New()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testReaper = r
	runc.Monitor = r
	os.Exit(m.Run())
}

// env is one agent serving over a unix socket, with its clients.
type env struct {
	svc      *Service
	agent    agentapi.AgentService
	io       agentapi.IOService
	stateDir string
	runcRoot string
	cgParent string
	loopDev  string
	baseSpec []byte
	baseProc specs.Process
}

func requireHost(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the agent service tests need root (mounts, runc)")
	}
	for _, bin := range []string{"runc", "mkfs.ext4", "losetup"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("the agent service tests need %s: %v", bin, err)
		}
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("the agent service tests need /bin/busybox (Debian busybox-static)")
	}
}

// run runs a command through the reaper (a plain exec.Cmd.Run would race
// with the reaper's wait4(-1)).
func run(t *testing.T, dir string, name string, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	c := exec.Command(name, args...)
	c.Dir = dir
	c.Stdout, c.Stderr = &out, &out
	status, err := testReaper.Run(c)
	if err != nil || status != 0 {
		t.Fatalf("%s %s: status %d, err %v: %s", name, strings.Join(args, " "), status, err, out.String())
	}
	return out.String()
}

// busyboxImage builds an ext4 image of a busybox rootfs and attaches it to a
// loop device.
func busyboxImage(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	for _, d := range []string{"bin", "proc", "sys", "dev", "etc", "tmp", "run"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), bb, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"sh", "echo", "cat", "sleep", "stty", "tty", "readlink", "true", "ls"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	// As in Debian's and Ubuntu's images.
	if err := os.MkdirAll(filepath.Join(root, "var"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../run", filepath.Join(root, "var/run")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"etc/hosts", "etc/resolv.conf", "etc/c8s-file"} {
		if err := os.WriteFile(filepath.Join(root, f), []byte("image content\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	img := filepath.Join(dir, "rootfs.ext4")
	run(t, dir, "mkfs.ext4", "-q", "-F", "-d", root, img, "32M")
	dev := strings.TrimSpace(run(t, dir, "losetup", "--find", "--show", "--read-only", img))
	t.Cleanup(func() {
		c := exec.Command("losetup", "-d", dev)
		_, _ = testReaper.Run(c)
	})
	return dev
}

func newEnv(t *testing.T) *env {
	t.Helper()
	requireHost(t)
	base := t.TempDir()
	e := &env{
		stateDir: filepath.Join(base, "state"),
		runcRoot: filepath.Join(base, "runc"),
		cgParent: fmt.Sprintf("/c8s-test-%d", time.Now().UnixNano()),
		loopDev:  busyboxImage(t),
	}
	specDir := filepath.Join(base, "spec")
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, specDir, "runc", "spec")
	raw, err := os.ReadFile(filepath.Join(specDir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	// As containerd's CRI gives it: no ambient or inheritable set
	// (WithoutAmbientCaps), which `runc spec` has and a policy refuses.
	s.Process.Capabilities.Ambient, s.Process.Capabilities.Inheritable = nil, nil
	if e.baseSpec, err = json.Marshal(&s); err != nil {
		t.Fatal(err)
	}
	e.baseProc = *s.Process

	svc, err := New(Config{
		StateDir:      e.stateDir,
		CgroupsParent: e.cgParent,
		Runtime:       &ociruntime.Runtime{Root: e.runcRoot, Reaper: testReaper},
		Channel:       "test",
		MountRootfs: func(ctx context.Context, r *agentapi.Rootfs, target string) error {
			// The image is read-only; the fstype and options come from the request.
			return rootfs.Mount(e.loopDev, r.GetFstype(), r.GetOptions(), target)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.svc = svc
	srv, err := svc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(base, "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(context.Background(), l) }()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	client := ttrpc.NewClient(conn)
	e.agent = agentapi.NewAgentClient(client)
	e.io = agentapi.NewIOClient(client)

	t.Cleanup(func() {
		// Remove whatever a failed test left, then the cgroup parents.
		svc.mu.Lock()
		var ids []string
		for id := range svc.containers {
			ids = append(ids, id)
		}
		svc.mu.Unlock()
		for _, id := range ids {
			if _, err := e.agent.RemoveContainer(context.Background(), &agentapi.RemoveContainerRequest{ContainerId: id}); err != nil {
				t.Errorf("cleanup: remove %s: %v", id, err)
			}
		}
		client.Close()
		_ = srv.Close()
		dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", e.cgParent))
		if d := filepath.Join("/sys/fs/cgroup", e.cgParent); fileExists(d) {
			dirs = append(dirs, d)
		}
		for _, d := range dirs {
			_ = os.Remove(d)
		}
	})
	return e
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// spec returns the base spec running args.
func (e *env) spec(t *testing.T, args ...string) specs.Spec {
	t.Helper()
	var s specs.Spec
	if err := json.Unmarshal(e.baseSpec, &s); err != nil {
		t.Fatal(err)
	}
	s.Process.Args = args
	s.Hostname = ""
	return s
}

func (e *env) process(args ...string) []byte {
	p := e.baseProc
	p.Args = args
	raw, _ := json.Marshal(&p)
	return raw
}

func rootfsReq() *agentapi.Rootfs {
	return &agentapi.Rootfs{Fstype: "ext4", Options: []string{"ro"}, Source: &agentapi.Rootfs_Scsi{Scsi: &agentapi.ScsiDisk{}}}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func (e *env) create(t *testing.T, id string, s specs.Spec, stdio *agentapi.Stdio, mod func(*agentapi.CreateContainerRequest)) uint32 {
	t.Helper()
	raw, err := json.Marshal(&s)
	if err != nil {
		t.Fatal(err)
	}
	req := &agentapi.CreateContainerRequest{ContainerId: id, Spec: raw, Rootfs: rootfsReq(), Stdio: stdio}
	if mod != nil {
		mod(req)
	}
	resp, err := e.agent.CreateContainer(ctxT(t), req)
	if err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
	if resp.GetPid() == 0 {
		t.Fatalf("create %s returned pid 0", id)
	}
	return resp.GetPid()
}

func (e *env) start(t *testing.T, id string) {
	t.Helper()
	if _, err := e.agent.StartContainer(ctxT(t), &agentapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
}

// readAll reads a stream to eof.
func (e *env) readAll(t *testing.T, id, exec string, stderr bool) string {
	t.Helper()
	var out bytes.Buffer
	for {
		req := &agentapi.ReadStreamRequest{ContainerId: id, ExecId: exec, MaxBytes: 7}
		var (
			resp *agentapi.ReadStreamResponse
			err  error
		)
		if stderr {
			resp, err = e.io.ReadStderr(ctxT(t), req)
		} else {
			resp, err = e.io.ReadStdout(ctxT(t), req)
		}
		if err != nil {
			t.Fatalf("read %s/%s: %v", id, exec, err)
		}
		if len(resp.GetData()) > 7 {
			t.Fatalf("read returned %d bytes, more than max_bytes 7", len(resp.GetData()))
		}
		out.Write(resp.GetData())
		if resp.GetEof() {
			return out.String()
		}
	}
}

func (e *env) wait(t *testing.T, id, exec string) uint32 {
	t.Helper()
	resp, err := e.agent.WaitProcess(ctxT(t), &agentapi.ProcessRequest{ContainerId: id, ExecId: exec})
	if err != nil {
		t.Fatalf("wait %s/%s: %v", id, exec, err)
	}
	if resp.GetExitedAt() == nil || resp.GetExitedAt().AsTime().IsZero() {
		t.Errorf("wait %s/%s: no exit time", id, exec)
	}
	return resp.GetExitStatus()
}

// run creates and starts container id from s with piped stdio, waits for
// it, removes it and returns its stdout.
func (e *env) run(t *testing.T, id string, s specs.Spec) string {
	t.Helper()
	e.create(t, id, s, pipes(), nil)
	e.start(t, id)
	e.wait(t, id, "")
	out := e.readAll(t, id, "", false)
	e.remove(t, id)
	return out
}

func (e *env) remove(t *testing.T, id string) {
	t.Helper()
	if _, err := e.agent.RemoveContainer(ctxT(t), &agentapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatalf("remove %s: %v", id, err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

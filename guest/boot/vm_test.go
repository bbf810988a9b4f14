package boot_test

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

	v2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/internal/newc"
)

// TestAgentInVM boots the guest image under QEMU (TCG) with the agent built
// from this tree as /init, and drives it over virtio-serial the way the shim
// will: GetInfo, a container from a virtio-scsi ext4 disk, output, exit
// status, exec, stats, remove, reconnect, shutdown. It needs a built image
// (make image) and boots a VM, so it runs only with C8S_AGENT_VM_TEST=1 or
// under `make test` (C8S_E2E_REQUIRED=1); C8S_IMAGE_DIR overrides the image
// (default _output/image).
func TestAgentInVM(t *testing.T) {
	imgDir := needVM(t)
	dir := t.TempDir()
	disk := busyboxDisk(t, dir)
	vm := bootVM(t, imgDir, dir, "", "1024",
		"-device", "virtio-scsi-pci,id=scsi0",
		"-drive", "file="+disk+",format=raw,if=none,id=d0,readonly=on",
		"-device", "scsi-hd,drive=d0,bus=scsi0.0,channel=0,scsi-id=2,lun=1",
	)
	sock, agent, io, closeConn := vm.sock, vm.agent, vm.io, vm.close
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	info, err := agent.GetInfo(ctx, &agentapi.GetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetAgentVersion() != testVersion {
		t.Fatalf("the VM runs agent %q, not the one built by this test (%q)", info.GetAgentVersion(), testVersion)
	}
	if info.GetChannel() != "virtio-serial" || !strings.Contains(info.GetKernelRelease(), "cloud-amd64") {
		t.Errorf("info = %+v", info)
	}

	s := specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: "/host/rootfs", Readonly: true},
		Process: &specs.Process{
			Args: []string{"sh", "-c", "echo out; cat /etc/hosts; echo err >&2; exit 3"},
			Env:  []string{"PATH=/bin"}, Cwd: "/",
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "mode=755"}},
			{Destination: "/etc/hosts", Type: "bind", Source: "/host/hosts", Options: []string{"rbind", "ro"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: "system.slice:cri:x",
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.NetworkNamespace, Path: "/var/run/netns/host"},
			},
		},
	}
	raw, _ := json.Marshal(&s)
	rootfs := &agentapi.Rootfs{Fstype: "ext4", Options: []string{"ro"},
		Source: &agentapi.Rootfs_Scsi{Scsi: &agentapi.ScsiDisk{Target: 2, Lun: 1}}}
	created := time.Now()
	cr, err := agent.CreateContainer(ctx, &agentapi.CreateContainerRequest{
		ContainerId: "vm1", Spec: raw, Rootfs: rootfs,
		Stdio: &agentapi.Stdio{Stdout: true, Stderr: true},
		Files: []*agentapi.File{{Source: "/host/hosts", Content: []byte("10.0.0.1 vm\n"), Mode: 0o644}},
	})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if _, err := agent.StartContainer(ctx, &agentapi.StartContainerRequest{ContainerId: "vm1"}); err != nil {
		t.Fatalf("start: %v", err)
	}
	w, err := agent.WaitProcess(ctx, &agentapi.ProcessRequest{ContainerId: "vm1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("create+start+exit of pid %d took %s", cr.GetPid(), time.Since(created).Round(time.Millisecond))
	if w.GetExitStatus() != 3 {
		t.Errorf("exit status = %d, want 3", w.GetExitStatus())
	}
	if out := readAll(t, ctx, io.ReadStdout, "vm1", ""); out != "out\n10.0.0.1 vm\n" {
		t.Errorf("stdout = %q", out)
	}
	if out := readAll(t, ctx, io.ReadStderr, "vm1", ""); out != "err\n" {
		t.Errorf("stderr = %q", out)
	}
	if _, err := agent.RemoveContainer(ctx, &agentapi.RemoveContainerRequest{ContainerId: "vm1"}); err != nil {
		t.Fatal(err)
	}

	// A long-running container: exec, stats, signal; across a reconnect.
	s.Process.Args = []string{"sleep", "100000"}
	raw, _ = json.Marshal(&s)
	if _, err := agent.CreateContainer(ctx, &agentapi.CreateContainerRequest{ContainerId: "vm2", Spec: raw, Rootfs: rootfs, Stdio: &agentapi.Stdio{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.StartContainer(ctx, &agentapi.StartContainerRequest{ContainerId: "vm2"}); err != nil {
		t.Fatal(err)
	}
	closeConn()
	agent, io, closeConn = dialAgent(t, sock)
	defer closeConn()
	proc, _ := json.Marshal(&specs.Process{Args: []string{"sh", "-c", "echo exec; exit 4"}, Env: []string{"PATH=/bin"}, Cwd: "/"})
	if _, err := agent.ExecProcess(ctx, &agentapi.ExecProcessRequest{ContainerId: "vm2", ExecId: "x", Process: proc, Stdio: &agentapi.Stdio{Stdout: true}}); err != nil {
		t.Fatalf("exec after reconnect: %v", err)
	}
	if out := readAll(t, ctx, io.ReadStdout, "vm2", "x"); out != "exec\n" {
		t.Errorf("exec stdout = %q", out)
	}
	if w, err := agent.WaitProcess(ctx, &agentapi.ProcessRequest{ContainerId: "vm2", ExecId: "x"}); err != nil || w.GetExitStatus() != 4 {
		t.Errorf("exec wait: %v, %v", w, err)
	}
	st, err := agent.Stats(ctx, &agentapi.StatsRequest{ContainerId: "vm2"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := typeurl.UnmarshalAny(st.GetStats())
	if err != nil {
		t.Fatal(err)
	}
	if v2, ok := m.(*v2stats.Metrics); !ok || v2.GetPids().GetCurrent() != 1 || v2.GetMemory().GetUsage() == 0 {
		t.Errorf("stats = %T %+v, want v2 metrics with 1 pid and memory usage", m, m)
	}
	if _, err := agent.SignalProcess(ctx, &agentapi.SignalProcessRequest{ContainerId: "vm2", Signal: 9}); err != nil {
		t.Fatal(err)
	}
	if w, err := agent.WaitProcess(ctx, &agentapi.ProcessRequest{ContainerId: "vm2"}); err != nil || w.GetExitStatus() != 137 {
		t.Errorf("wait after SIGKILL: %v, %v", w, err)
	}
	if _, err := agent.RemoveContainer(ctx, &agentapi.RemoveContainerRequest{ContainerId: "vm2"}); err != nil {
		t.Fatal(err)
	}
	// Measure the agent: a container in the guest's pid namespace reads
	// /proc/1/status.
	s.Process.Args = []string{"grep", "-E", "^(VmRSS|Threads)", "/proc/1/status"}
	s.Linux.Namespaces = s.Linux.Namespaces[1:] // drop the pid namespace
	raw, _ = json.Marshal(&s)
	if _, err := agent.CreateContainer(ctx, &agentapi.CreateContainerRequest{ContainerId: "rss", Spec: raw, Rootfs: rootfs, Stdio: &agentapi.Stdio{Stdout: true}}); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.StartContainer(ctx, &agentapi.StartContainerRequest{ContainerId: "rss"}); err != nil {
		t.Fatal(err)
	}
	out := readAll(t, ctx, io.ReadStdout, "rss", "")
	if !strings.Contains(out, "VmRSS") {
		t.Errorf("agent status = %q", out)
	}
	t.Logf("agent (PID 1) after two containers: %s", strings.Join(strings.Fields(out), " "))
	if _, err := agent.RemoveContainer(ctx, &agentapi.RemoveContainerRequest{ContainerId: "rss"}); err != nil {
		t.Fatal(err)
	}

	// Slow reconnects: the agent sees each host leave before the next one
	// comes. The guest's driver may hand over the next host's request
	// before it reports that host connected; the answer must still reach
	// the host (CI saw GetInfo time out here, guest/channel race_test.go).
	// The pauses vary the order of those events.
	for i, pause := range []time.Duration{time.Second, 20 * time.Millisecond, 300 * time.Millisecond, 100 * time.Millisecond, 700 * time.Millisecond, 50 * time.Millisecond, 500 * time.Millisecond, 200 * time.Millisecond} {
		closeConn()
		time.Sleep(pause)
		agent, _, closeConn = dialAgent(t, sock)
		if _, err := agent.GetInfo(ctx, &agentapi.GetInfoRequest{}); err != nil {
			t.Fatalf("GetInfo after slow reconnect %d (%s without a host): %v", i, pause, err)
		}
	}
	defer closeConn()
	if _, err := agent.Shutdown(ctx, &agentapi.Empty{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-vm.done:
		vm.done <- nil
	case <-time.After(time.Minute):
		t.Error("VM did not power off after Shutdown")
	}
}

func dialAgent(t *testing.T, sock string) (agentapi.AgentService, agentapi.IOService, func()) {
	t.Helper()
	var conn net.Conn
	for i := 0; ; i++ {
		var err error
		if conn, err = net.Dial("unix", sock); err == nil {
			break
		}
		if i > 200 {
			t.Fatalf("dial %s: %v", sock, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c := ttrpc.NewClient(conn)
	return agentapi.NewAgentClient(c), agentapi.NewIOClient(c), func() { c.Close() }
}

func readAll(t *testing.T, ctx context.Context, read func(context.Context, *agentapi.ReadStreamRequest) (*agentapi.ReadStreamResponse, error), id, execID string) string {
	t.Helper()
	var out bytes.Buffer
	for {
		r, err := read(ctx, &agentapi.ReadStreamRequest{ContainerId: id, ExecId: execID})
		if err != nil {
			t.Fatalf("read %s/%s: %v", id, execID, err)
		}
		out.Write(r.GetData())
		if r.GetEof() {
			return out.String()
		}
	}
}

func sh(t *testing.T, dir, script string) {
	t.Helper()
	c := exec.Command("/bin/sh", "-ec", script)
	c.Dir = dir
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
}

// testVersion marks the agent this test builds.
const testVersion = "vm-test"

// agentInitrd appends a cpio archive holding the freshly built agent as
// /init to the image's (decompressed) initramfs; the kernel unpacks both,
// the later /init wins.
func agentInitrd(t *testing.T, imgDir, dir string) string {
	t.Helper()
	stage := filepath.Join(dir, "stage")
	if err := os.MkdirAll(stage, 0o755); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-X github.com/c8s-dev/c8s/guest/agent.Version="+testVersion,
		"-o", filepath.Join(stage, "init"), "github.com/c8s-dev/c8s/guest/cmd/c8s-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build agent: %v\n%s", err, out)
	}
	initrd := filepath.Join(dir, "initrd.img")
	// The whole root tree as an initramfs: the image's initrd-plain.img
	// (its initrd.img holds the first stage and what runs from memory, not
	// the root's other files).
	base := filepath.Join(imgDir, "initrd-plain.img")
	// Decompressed, so that the archive appended below follows an
	// uncompressed one.
	sh(t, stage, fmt.Sprintf("zstd -q -dc %s > %s", base, initrd))
	agent, err := os.ReadFile(filepath.Join(stage, "init"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(initrd, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := newc.NewWriter(f)
	if err := w.Write(newc.Entry{Name: "init", Mode: newc.ModeRegular | 0o755, Body: agent}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return initrd
}

// busyboxDisk makes an ext4 disk image with a busybox rootfs.
func busyboxDisk(t *testing.T, dir string) string {
	t.Helper()
	sh(t, dir, `mkdir -p rootfs/bin rootfs/proc rootfs/dev rootfs/sys rootfs/etc rootfs/tmp
cp /bin/busybox rootfs/bin/busybox
for a in sh echo cat sleep grep; do ln -s busybox rootfs/bin/$a; done
echo image > rootfs/etc/hosts
mkfs.ext4 -q -F -d rootfs disk.ext4 32M`)
	return filepath.Join(dir, "disk.ext4")
}

package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"
	"github.com/moby/sys/mountinfo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/cgroupstats"
)

func pipes() *agentapi.Stdio {
	return &agentapi.Stdio{Stdout: true, Stderr: true}
}

// assertGone checks that nothing of a removed container is left: no mounts
// and no files under the state dir, no runc state.
func (e *env) assertGone(t *testing.T, id string) {
	t.Helper()
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(e.stateDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range infos {
		t.Errorf("mount left after remove: %s", m.Mountpoint)
	}
	if fileExists(filepath.Join(e.stateDir, id)) {
		t.Errorf("bundle of %s left after remove", id)
	}
	if fileExists(filepath.Join(e.runcRoot, id)) {
		t.Errorf("runc state of %s left after remove", id)
	}
}

func TestContainerRunsAndReportsOutputAndExit(t *testing.T) {
	e := newEnv(t)
	s := e.spec(t, "sh", "-c", "echo out; cat /etc/hosts /etc/c8s-file; echo err >&2; exit 3")
	s.Mounts = append(s.Mounts,
		specs.Mount{Destination: "/etc/hosts", Type: "bind", Source: "/var/lib/host-only/hosts", Options: []string{"rbind", "ro"}},
		specs.Mount{Destination: "/etc/c8s-file", Type: "bind", Source: "/nonexistent/volume", Options: []string{"rbind"}},
	)
	s.Linux.Devices = append(s.Linux.Devices, specs.LinuxDevice{Path: "/dev/c8s-no-such-device", Type: "c", Major: 1, Minor: 3})
	pid := e.create(t, "c1", s, pipes(), func(r *agentapi.CreateContainerRequest) {
		r.Files = []*agentapi.File{{Source: "/var/lib/host-only/hosts", Content: []byte("10.1.2.3 pod\n"), Mode: 0o644}}
	})
	e.start(t, "c1")
	// Wait first: the output of a process that exited before anyone read it
	// must still be there.
	if st := e.wait(t, "c1", ""); st != 3 {
		t.Errorf("exit status = %d, want 3", st)
	}
	if st := e.wait(t, "c1", ""); st != 3 {
		t.Errorf("second wait: exit status = %d, want 3", st)
	}
	// The host file's guest copy replaced the image's /etc/hosts; the bind
	// mount of a missing source was dropped, so the image's file shows.
	if out := e.readAll(t, "c1", "", false); out != "out\n10.1.2.3 pod\nimage content\n" {
		t.Errorf("stdout = %q", out)
	}
	if out := e.readAll(t, "c1", "", true); out != "err\n" {
		t.Errorf("stderr = %q", out)
	}
	// Reads after eof keep returning eof.
	if out := e.readAll(t, "c1", "", false); out != "" {
		t.Errorf("stdout after eof = %q", out)
	}
	// Signalling an exited process is not an error.
	if _, err := e.agent.SignalProcess(ctxT(t), &agentapi.SignalProcessRequest{ContainerId: "c1", Signal: 9}); err != nil {
		t.Errorf("signal after exit: %v", err)
	}
	if pid == 0 {
		t.Error("no pid")
	}
	e.remove(t, "c1")
	e.assertGone(t, "c1")
	// Idempotent.
	e.remove(t, "c1")
}

func TestExecSignalsPidsAndStats(t *testing.T) {
	e := newEnv(t)
	initPid := e.create(t, "c2", e.spec(t, "sleep", "100000"), pipes(), nil)
	e.start(t, "c2")

	// Exec with stdin through pipes.
	if _, err := e.agent.ExecProcess(ctxT(t), &agentapi.ExecProcessRequest{
		ContainerId: "c2", ExecId: "e1", Process: e.process("sh", "-c", "read line; echo got:$line; echo e >&2; exit 5"),
		Stdio: &agentapi.Stdio{Stdin: true, Stdout: true, Stderr: true},
	}); err != nil {
		t.Fatal(err)
	}
	if w, err := e.io.WriteStdin(ctxT(t), &agentapi.WriteStdinRequest{ContainerId: "c2", ExecId: "e1", Data: []byte("hello\n")}); err != nil || w.GetWritten() != 6 {
		t.Fatalf("write stdin: %v, %v", w, err)
	}
	if _, err := e.agent.CloseStdin(ctxT(t), &agentapi.ProcessRequest{ContainerId: "c2", ExecId: "e1"}); err != nil {
		t.Fatal(err)
	}
	if out := e.readAll(t, "c2", "e1", false); out != "got:hello\n" {
		t.Errorf("exec stdout = %q", out)
	}
	if out := e.readAll(t, "c2", "e1", true); out != "e\n" {
		t.Errorf("exec stderr = %q", out)
	}
	if st := e.wait(t, "c2", "e1"); st != 5 {
		t.Errorf("exec exit = %d, want 5", st)
	}
	if _, err := e.agent.DeleteProcess(ctxT(t), &agentapi.ProcessRequest{ContainerId: "c2", ExecId: "e1"}); err != nil {
		t.Fatal(err)
	}
	_, err := e.agent.DeleteProcess(ctxT(t), &agentapi.ProcessRequest{ContainerId: "c2", ExecId: "e1"})
	assertCode(t, err, codes.NotFound)

	// Exec with a terminal: output arrives through the pty.
	if _, err := e.agent.ExecProcess(ctxT(t), &agentapi.ExecProcessRequest{
		ContainerId: "c2", ExecId: "tty", Process: e.process("sh", "-c", "read x; stty size; tty"),
		Stdio: &agentapi.Stdio{Terminal: true, Stdin: true, Stdout: true},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.agent.ResizePty(ctxT(t), &agentapi.ResizePtyRequest{ContainerId: "c2", ExecId: "tty", Width: 123, Height: 45}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.io.WriteStdin(ctxT(t), &agentapi.WriteStdinRequest{ContainerId: "c2", ExecId: "tty", Data: []byte("go\n")}); err != nil {
		t.Fatal(err)
	}
	out := e.readAll(t, "c2", "tty", false)
	if !strings.Contains(out, "45 123") || !strings.Contains(out, "/dev/pts/0") {
		t.Errorf("tty output = %q, want the size 45 123 and /dev/pts/0", out)
	}
	if st := e.wait(t, "c2", "tty"); st != 0 {
		t.Errorf("tty exec exit = %d, want 0", st)
	}
	_, err = e.agent.ResizePty(ctxT(t), &agentapi.ResizePtyRequest{ContainerId: "c2", Width: 1, Height: 1})
	assertCode(t, err, codes.FailedPrecondition)

	// A long-running exec: pids, refusing to delete it, signalling it.
	resp, err := e.agent.ExecProcess(ctxT(t), &agentapi.ExecProcessRequest{
		ContainerId: "c2", ExecId: "long", Process: e.process("sleep", "100000"), Stdio: &agentapi.Stdio{},
	})
	if err != nil {
		t.Fatal(err)
	}
	longPid := resp.GetPid()
	pids, err := e.agent.ListPids(ctxT(t), &agentapi.ListPidsRequest{ContainerId: "c2"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint32]string{}
	for _, p := range pids.GetProcesses() {
		got[p.GetPid()] = p.GetExecId()
	}
	if id, ok := got[initPid]; !ok || id != "" {
		t.Errorf("pids %v: want init pid %d without exec id", got, initPid)
	}
	if got[longPid] != "long" {
		t.Errorf("pids %v: want pid %d marked exec long", got, longPid)
	}
	_, err = e.agent.DeleteProcess(ctxT(t), &agentapi.ProcessRequest{ContainerId: "c2", ExecId: "long"})
	assertCode(t, err, codes.FailedPrecondition)

	// The processes of the execs that ended above leave the cgroup's pid
	// count once the kernel has released them, which can trail their exit
	// status by a moment: ask again until the count settles, for a while.
	// The count is Stats' pids.current on a unified hierarchy (the guest's);
	// on a v1 host Stats is refused, and the count is ListPids'.
	unified, err := cgroupstats.Unified(cgroupRoot)
	if err != nil {
		t.Fatal(err)
	}
	if !unified {
		_, err := e.agent.Stats(ctxT(t), &agentapi.StatsRequest{ContainerId: "c2"})
		assertCode(t, err, codes.FailedPrecondition)
	}
	var pidsNow uint64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if unified {
			stats, err := e.agent.Stats(ctxT(t), &agentapi.StatsRequest{ContainerId: "c2"})
			if err != nil {
				t.Fatal(err)
			}
			m, err := typeurl.UnmarshalAny(stats.GetStats())
			if err != nil {
				t.Fatalf("stats type %s: %v", stats.GetStats().GetTypeUrl(), err)
			}
			v2, ok := m.(*v2stats.Metrics)
			if !ok {
				t.Fatalf("stats is %T, want cgroup v2 Metrics", m)
			}
			if v2.GetMemory().GetUsage() == 0 {
				t.Fatal("memory usage is 0")
			}
			pidsNow = v2.GetPids().GetCurrent()
		} else {
			pids, err := e.agent.ListPids(ctxT(t), &agentapi.ListPidsRequest{ContainerId: "c2"})
			if err != nil {
				t.Fatal(err)
			}
			pidsNow = uint64(len(pids.GetProcesses()))
		}
		if pidsNow == 2 || time.Now().After(deadline) {
			break
		}
	}
	if pidsNow != 2 {
		t.Errorf("pids.current = %d, want 2 (init and the long exec)", pidsNow)
	}

	if _, err := e.agent.SignalProcess(ctxT(t), &agentapi.SignalProcessRequest{ContainerId: "c2", ExecId: "long", Signal: uint32(unix.SIGKILL)}); err != nil {
		t.Fatal(err)
	}
	if st := e.wait(t, "c2", "long"); st != 137 {
		t.Errorf("killed exec exit = %d, want 137", st)
	}
	// Kill everything: the init dies of SIGKILL.
	if _, err := e.agent.SignalProcess(ctxT(t), &agentapi.SignalProcessRequest{ContainerId: "c2", Signal: uint32(unix.SIGKILL), All: true}); err != nil {
		t.Fatal(err)
	}
	if st := e.wait(t, "c2", ""); st != 137 {
		t.Errorf("init exit = %d, want 137", st)
	}
	if out := e.readAll(t, "c2", "", false); out != "" {
		t.Errorf("init stdout = %q", out)
	}
	_, err = e.agent.ExecProcess(ctxT(t), &agentapi.ExecProcessRequest{ContainerId: "c2", ExecId: "late", Process: e.process("true"), Stdio: &agentapi.Stdio{}})
	assertCode(t, err, codes.FailedPrecondition)
	e.remove(t, "c2")
	e.assertGone(t, "c2")
}

// A container is known to the agent from the start of its create, but
// has a cgroup only once create has adapted its spec. The host asking for
// its stats in between (it can hold create there: it serves the image)
// must not get the VM's root cgroup's figures, every container's and the
// agent's, in its place.
func TestMaliciousHostStatsDuringCreate(t *testing.T) {
	e := newEnv(t)
	var statsErr error
	asked := false
	testHookSharesStaged = func() {
		asked = true
		_, statsErr = e.agent.Stats(ctxT(t), &agentapi.StatsRequest{ContainerId: "mid"})
	}
	t.Cleanup(func() { testHookSharesStaged = nil })
	e.create(t, "mid", e.spec(t, "true"), pipes(), nil)
	testHookSharesStaged = nil
	if !asked {
		t.Fatal("the hook in the middle of create never ran")
	}
	assertCode(t, statsErr, codes.Unavailable)
	e.remove(t, "mid")
	e.assertGone(t, "mid")
}

func TestPodContainerJoinsSandboxNamespaces(t *testing.T) {
	e := newEnv(t)
	sbPid := e.create(t, "sandbox", e.spec(t, "sleep", "100000"), &agentapi.Stdio{}, func(r *agentapi.CreateContainerRequest) {
		r.SandboxId = "sandbox"
	})
	e.start(t, "sandbox")
	s := e.spec(t, "sleep", "100000")
	for i, ns := range s.Linux.Namespaces {
		switch ns.Type {
		case specs.NetworkNamespace, specs.IPCNamespace, specs.UTSNamespace:
			s.Linux.Namespaces[i].Path = "/var/run/netns/host-path-of-" + string(ns.Type)
		}
	}
	appPid := e.create(t, "app", s, &agentapi.Stdio{}, func(r *agentapi.CreateContainerRequest) {
		r.SandboxId = "sandbox"
	})
	for _, ns := range []string{"net", "ipc", "uts"} {
		a := nsOf(t, int(sbPid), ns)
		b := nsOf(t, int(appPid), ns)
		if a != b {
			t.Errorf("%s namespace: app %s, sandbox %s; want the sandbox's", ns, b, a)
		}
	}
	if nsOf(t, int(sbPid), "pid") == nsOf(t, int(appPid), "pid") {
		t.Error("app shares the sandbox's pid namespace, which the spec did not ask for")
	}
	if nsOf(t, int(sbPid), "net") == nsOf(t, os.Getpid(), "net") {
		t.Error("sandbox is in the host's network namespace")
	}
	e.remove(t, "app")
	e.remove(t, "sandbox")
	e.assertGone(t, "app")
	e.assertGone(t, "sandbox")
}

func nsOf(t *testing.T, pid int, ns string) string {
	t.Helper()
	l, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestErrorsCarryCodesAndRuncMessages(t *testing.T) {
	e := newEnv(t)
	_, err := e.agent.StartContainer(ctxT(t), &agentapi.StartContainerRequest{ContainerId: "nope"})
	assertCode(t, err, codes.NotFound)
	_, err = e.agent.WaitProcess(ctxT(t), &agentapi.ProcessRequest{ContainerId: "nope"})
	assertCode(t, err, codes.NotFound)
	_, err = e.io.ReadStdout(ctxT(t), &agentapi.ReadStreamRequest{ContainerId: "nope"})
	assertCode(t, err, codes.NotFound)
	_, err = e.agent.CreateContainer(ctxT(t), &agentapi.CreateContainerRequest{ContainerId: "../x", Spec: []byte("{}"), Rootfs: rootfsReq()})
	assertCode(t, err, codes.InvalidArgument)
	_, err = e.agent.CreateContainer(ctxT(t), &agentapi.CreateContainerRequest{ContainerId: "bad", Spec: []byte("{"), Rootfs: rootfsReq()})
	assertCode(t, err, codes.InvalidArgument)
	e.assertGone(t, "bad")

	e.create(t, "c3", e.spec(t, "sleep", "100000"), pipes(), nil)
	raw := []byte(`{"ociVersion":"1.0.2","process":{"args":["true"],"cwd":"/"}}`)
	_, err = e.agent.CreateContainer(ctxT(t), &agentapi.CreateContainerRequest{ContainerId: "c3", Spec: raw, Rootfs: rootfsReq()})
	assertCode(t, err, codes.AlreadyExists)
	_, err = e.agent.WaitProcess(ctxT(t), &agentapi.ProcessRequest{ContainerId: "c3", ExecId: "nope"})
	assertCode(t, err, codes.NotFound)
	e.remove(t, "c3")

	// runc's own complaint reaches the caller.
	_, err = e.agent.CreateContainer(ctxT(t), &agentapi.CreateContainerRequest{
		ContainerId: "c4", Spec: mustJSON(t, e.spec(t, "/no/such/binary")), Rootfs: rootfsReq(), Stdio: pipes(),
	})
	if err == nil {
		e.start(t, "c4")
		t.Fatal("container with a missing binary was created and started")
	}
	t.Logf("create error: %v", err)
	if !strings.Contains(err.Error(), "/no/such/binary") {
		t.Errorf("error %q does not name the missing binary", err)
	}
	e.assertGone(t, "c4")
}

func assertCode(t *testing.T, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("error %v: code %s, want %s", err, got, want)
	}
	if want == codes.NotFound && !errdefs.IsNotFound(errgrpc.ToNative(err)) {
		t.Errorf("error %v does not map back to errdefs.ErrNotFound", err)
	}
}

func TestTerminalContainerAndCancelledWait(t *testing.T) {
	e := newEnv(t)
	e.create(t, "c5", e.spec(t, "sh", "-c", "read x; echo got:$x; tty; exit 2"), &agentapi.Stdio{Terminal: true, Stdin: true, Stdout: true}, nil)
	e.start(t, "c5")
	// The process waits for input, so this wait can only end by cancellation.
	ctx, cancel := context.WithCancel(ctxT(t))
	waitErr := make(chan error, 1)
	go func() {
		_, err := e.agent.WaitProcess(ctx, &agentapi.ProcessRequest{ContainerId: "c5"})
		waitErr <- err
	}()
	cancel()
	if err := <-waitErr; status.Code(err) != codes.Canceled && !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled wait: %v", err)
	}
	if _, err := e.io.WriteStdin(ctxT(t), &agentapi.WriteStdinRequest{ContainerId: "c5", Data: []byte("hi\n")}); err != nil {
		t.Fatal(err)
	}
	out := e.readAll(t, "c5", "", false)
	if !strings.Contains(out, "got:hi") || !strings.Contains(out, "/dev/pts/0") {
		t.Errorf("terminal output = %q", out)
	}
	if st := e.wait(t, "c5", ""); st != 2 {
		t.Errorf("exit = %d, want 2", st)
	}
	out = e.readAll(t, "c5", "", true)
	if out != "" {
		t.Errorf("stderr of a terminal process = %q, want none", out)
	}
	e.remove(t, "c5")
	e.assertGone(t, "c5")
}

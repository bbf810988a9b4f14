package agent

import (
	"context"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// joiningSpec is a pod container's spec that joins the sandbox's network,
// IPC and UTS namespaces by (host) path.
func (e *env) joiningSpec(t *testing.T) specs.Spec {
	s := e.spec(t, "sleep", "100000")
	for i, ns := range s.Linux.Namespaces {
		switch ns.Type {
		case specs.NetworkNamespace, specs.IPCNamespace, specs.UTSNamespace:
			s.Linux.Namespaces[i].Path = "/var/run/netns/host-path-of-" + string(ns.Type)
		}
	}
	return s
}

func inSandbox(r *agentapi.CreateContainerRequest) { r.SandboxId = "sandbox" }

// A container created in a pod whose sandbox has exited: the sandbox's
// pid may name any process of the VM by now, whose namespaces the
// container would join. Refused by name.
func TestMaliciousHostJoinsExitedSandbox(t *testing.T) {
	e := newEnv(t)
	e.create(t, "sandbox", e.spec(t, "sleep", "100000"), &agentapi.Stdio{}, inSandbox)
	e.start(t, "sandbox")
	if _, err := e.agent.SignalProcess(ctxT(t), &agentapi.SignalProcessRequest{ContainerId: "sandbox", Signal: uint32(unix.SIGKILL)}); err != nil {
		t.Fatal(err)
	}
	e.wait(t, "sandbox", "")
	_, err := e.agent.CreateContainer(ctxT(t), &agentapi.CreateContainerRequest{
		ContainerId: "app", SandboxId: "sandbox", Spec: mustJSON(t, e.joiningSpec(t)), Rootfs: rootfsReq(), Stdio: &agentapi.Stdio{},
	})
	assertCode(t, err, codes.FailedPrecondition)
	if err == nil || !strings.Contains(err.Error(), `sandbox "sandbox"`) || !strings.Contains(err.Error(), "exited") {
		t.Errorf("error %v does not name the exited sandbox", err)
	}
	e.remove(t, "sandbox")
	e.assertGone(t, "app")
}

// The sandbox's pid now names another process (a reused pid): a
// container still joins the sandbox's own namespaces, which the agent
// holds open, not those of whatever process has the pid.
func TestMaliciousHostSandboxPidReused(t *testing.T) {
	e := newEnv(t)
	sbPid := e.create(t, "sandbox", e.spec(t, "sleep", "100000"), &agentapi.Stdio{}, inSandbox)
	e.start(t, "sandbox")
	otherPid := e.create(t, "other", e.spec(t, "sleep", "100000"), &agentapi.Stdio{}, nil)
	if nsOf(t, int(otherPid), "net") == nsOf(t, int(sbPid), "net") {
		t.Fatal("the other container shares the sandbox's network namespace")
	}
	// As if the pid had been reaped and given to the other container's
	// init.
	e.svc.mu.Lock()
	sb := e.svc.containers["sandbox"]
	e.svc.mu.Unlock()
	sb.mu.Lock()
	sb.init.pid = int(otherPid)
	sb.mu.Unlock()

	appPid := e.create(t, "app", e.joiningSpec(t), &agentapi.Stdio{}, inSandbox)
	for _, ns := range []string{"net", "ipc", "uts"} {
		if got, want := nsOf(t, int(appPid), ns), nsOf(t, int(sbPid), ns); got != want {
			t.Errorf("%s namespace: app %s, want the sandbox's %s (the other container's: %s)", ns, got, want, nsOf(t, int(otherPid), ns))
		}
	}
	// Nothing of the join is left open in the agent.
	for _, id := range []string{"app", "other", "sandbox"} {
		e.remove(t, id)
	}
	e.svc.mu.Lock()
	n := len(e.svc.containers)
	e.svc.mu.Unlock()
	if n != 0 || sb.ns != nil {
		t.Errorf("after remove: %d containers, sandbox namespaces %v", n, sb.ns)
	}
}

// Port-forward into a pod whose sandbox has exited is refused: neither
// the stale pid's namespace nor the agent's own.
func TestMaliciousHostPortForwardExitedSandbox(t *testing.T) {
	ctx := context.Background()
	port := echoServer(t)
	proc := fakeProc(t, procNetTCP, "")
	s := withPolicy(t, "", proc)
	done := make(chan struct{})
	close(done)
	s.containers["sb"] = &container{id: "sb", sandboxID: "sb", init: &process{pid: 4242, done: done}}
	if _, err := s.forward.ListenPorts(ctx, &agentapi.ListenPortsRequest{}); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `"sb" has exited`) {
		t.Errorf("ListenPorts with the sandbox exited: %v, want failed precondition naming it", err)
	}
	if _, err := s.forward.Dial(ctx, &agentapi.DialRequest{Port: port}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Dial with the sandbox exited: %v, want failed precondition", err)
	}
	// A running sandbox of the pod is used.
	s.containers["sb2"] = &container{id: "sb2", sandboxID: "sb2", init: &process{pid: 4243}}
	if pid, err := s.forward.podPid(); err != nil || pid != 4243 {
		t.Errorf("podPid = %d, %v; want the running sandbox's 4243", pid, err)
	}
}

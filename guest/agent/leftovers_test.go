package agent

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// TestInitExitKillsWhatIsLeft: a container in a PID namespace it does not
// own (the VM's, as for a host-PID pod, or the pod's) whose init exits
// leaves children that inherited its stdout. The agent kills them, as
// runc's shim does, so the container's output ends and containerd can
// finish handling the exit; nothing of the container is left running.
func TestInitExitKillsWhatIsLeft(t *testing.T) {
	e := newEnv(t)
	s := e.spec(t, "sh", "-c", "sleep 1001 & sleep 1001 & echo forked; exec sleep 1001")
	s.Linux.Namespaces = slices.DeleteFunc(s.Linux.Namespaces, func(ns specs.LinuxNamespace) bool {
		return ns.Type == specs.PIDNamespace
	})
	pid := e.create(t, "fork", s, pipes(), nil)
	e.start(t, "fork")
	c, err := e.svc.lookup("fork")
	if err != nil {
		t.Fatal(err)
	}
	// Three sleeps: the init has printed and exec'd (three processes
	// alone could still be the shell before its echo).
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids, _ := cgroupPids(c.cgroup)
		if len(pids) == 3 && allSleep(pids) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("container processes: %v, want init and two children, all sleeping", pids)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Only the init is signalled; its children stay unless the agent acts.
	if _, err := e.agent.SignalProcess(ctxT(t), &agentapi.SignalProcessRequest{ContainerId: "fork", Signal: 9}); err != nil {
		t.Fatal(err)
	}
	if st := e.wait(t, "fork", ""); st != 128+9 {
		t.Errorf("exit status %d, want 137", st)
	}
	out := make(chan string, 1)
	go func() { out <- e.readAll(t, "fork", "", false) }()
	select {
	case got := <-out:
		if got != "forked\n" {
			t.Errorf("stdout = %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("stdout of container (init pid %d) never ended after its init exited: its children still hold it", pid)
	}
	// The output ends when the last holder closes it; the kernel lists a
	// dying process a moment longer.
	deadline = time.Now().Add(5 * time.Second)
	for {
		pids, err := cgroupPids(c.cgroup)
		if err == nil && len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left in the container's cgroup: %v, %v", pids, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.remove(t, "fork")
	e.assertGone(t, "fork")
}

// TestCreatedContainer: the processes of a created, never started
// container are listed (crun ps crashes on one), and a SIGKILL ends it at
// once with an exit a waiter sees.
func TestCreatedContainer(t *testing.T) {
	e := newEnv(t)
	pid := e.create(t, "created", e.spec(t, "sleep", "600"), pipes(), nil)
	resp, err := e.agent.ListPids(ctxT(t), &agentapi.ListPidsRequest{ContainerId: "created"})
	if err != nil {
		t.Fatalf("ListPids of a created container: %v", err)
	}
	if len(resp.Processes) != 1 || resp.Processes[0].Pid != pid {
		t.Errorf("ListPids = %v, want just the init %d", resp.Processes, pid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	waited := make(chan *agentapi.WaitProcessResponse, 1)
	go func() {
		r, _ := e.agent.WaitProcess(ctx, &agentapi.ProcessRequest{ContainerId: "created"})
		waited <- r
	}()
	if _, err := e.agent.SignalProcess(ctxT(t), &agentapi.SignalProcessRequest{ContainerId: "created", Signal: 9}); err != nil {
		t.Fatalf("SIGKILL of a created container: %v", err)
	}
	if r := <-waited; r == nil || r.ExitStatus != 128+9 {
		t.Fatalf("wait after SIGKILL of a created container: %v", r)
	}
	e.remove(t, "created")
	e.assertGone(t, "created")
}

// allSleep reports whether every process in pids runs sleep.
func allSleep(pids []int) bool {
	for _, pid := range pids {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || strings.TrimSpace(string(comm)) != "sleep" {
			return false
		}
	}
	return true
}

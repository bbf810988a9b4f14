package task

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// The life of a container and an exec, with the events containerd gets
// in order.
func TestLifecycleEvents(t *testing.T) {
	h := newHarness(t, setup{})
	pid := h.create("c1", "")
	if got := h.start("c1", ""); got != pid {
		t.Errorf("Start pid %d, want %d", got, pid)
	}
	evs := h.expect(topicCreate, topicStart)
	if st := evs[1].(*eventstypes.TaskStart); st.ContainerID != "c1" || st.Pid != pid {
		t.Errorf("TaskStart %+v", st)
	}
	if s := h.state("c1", ""); s.Status != task.Status_RUNNING {
		t.Errorf("State after Start: %v", s.Status)
	}

	h.exec("c1", "e1")
	if added := h.expect(topicExecAdded)[0].(*eventstypes.TaskExecAdded); added.ContainerID != "c1" || added.ExecID != "e1" {
		t.Errorf("TaskExecAdded %+v", added)
	}
	if s := h.state("c1", "e1"); s.Status != task.Status_CREATED || s.ID != "e1" || s.ExecID != "e1" {
		t.Errorf("State of the added exec: %+v", s)
	}
	epid := h.start("c1", "e1")
	started := h.expect(topicExecStarted)[0].(*eventstypes.TaskExecStarted)
	if started.ExecID != "e1" || started.Pid != epid || epid == pid {
		t.Errorf("TaskExecStarted %+v, exec pid %d", started, epid)
	}
	execs := h.vm().Calls("ExecProcess")
	if len(execs) != 1 || !strings.Contains(string(execs[0].Req.(*agent.ExecProcessRequest).Process), "/bin/true") {
		t.Fatalf("ExecProcess %+v, want the exec's process spec", execs)
	}

	h.vm().Exit("c1", "e1", 3, false)
	exit := h.expect(topicExit)[0].(*eventstypes.TaskExit)
	if exit.ContainerID != "c1" || exit.ID != "e1" || exit.Pid != epid || exit.ExitStatus != 3 || exit.ExitedAt == nil {
		t.Errorf("TaskExit of the exec %+v", exit)
	}
	if w := h.waitExit("c1", "e1"); w.ExitStatus != 3 {
		t.Errorf("Wait of the exec: %d", w.ExitStatus)
	}
	if s := h.state("c1", "e1"); s.Status != task.Status_STOPPED || s.ExitStatus != 3 || s.ExitedAt == nil {
		t.Errorf("State of the exited exec: %+v", s)
	}
	del, err := h.s.Delete(h.ctx, &taskAPI.DeleteRequest{ID: "c1", ExecID: "e1"})
	if err != nil || del.ExitStatus != 3 || del.Pid != epid {
		t.Fatalf("Delete of the exec: %+v, %v", del, err)
	}
	if d := h.vm().Calls("DeleteProcess"); len(d) != 1 || d[0].Req.(*agent.ProcessRequest).ExecId != "e1" {
		t.Errorf("DeleteProcess %+v", d)
	}
	if _, err := h.s.State(h.ctx, &taskAPI.StateRequest{ID: "c1", ExecID: "e1"}); !isClass(err, errdefs.ErrNotFound) {
		t.Errorf("State of a deleted exec: %v", errClass(err))
	}
	h.quiet() // no TaskDelete for an exec

	h.vm().Exit("c1", "", 0, false)
	if exit := h.expect(topicExit)[0].(*eventstypes.TaskExit); exit.ID != "c1" || exit.ExitStatus != 0 {
		t.Errorf("TaskExit of the init %+v", exit)
	}
	del, err = h.s.Delete(h.ctx, &taskAPI.DeleteRequest{ID: "c1"})
	if err != nil || del.Pid != pid {
		t.Fatalf("Delete: %+v, %v", del, err)
	}
	if d := h.expect(topicDelete)[0].(*eventstypes.TaskDelete); d.ContainerID != "c1" || d.Pid != pid || d.ExitedAt == nil {
		t.Errorf("TaskDelete %+v", d)
	}
	if !h.vm().Stopped() {
		t.Error("VM left running after its last container")
	}
	h.quiet()
}

// An OOM kill is published as TaskOOM, before the TaskExit (CRI reports
// reason OOMKilled only then); other exits publish no TaskOOM.
func TestOOMBeforeExit(t *testing.T) {
	h := newHarness(t, setup{})
	h.create("c1", "p")
	h.start("c1", "")
	h.create("c2", "p")
	h.start("c2", "")
	h.expect(topicCreate, topicStart, topicCreate, topicStart)

	h.vm().Exit("c1", "", 137, true)
	evs := h.expect(topicOOM, topicExit)
	if oom := evs[0].(*eventstypes.TaskOOM); oom.ContainerID != "c1" {
		t.Errorf("TaskOOM %+v", oom)
	}
	if exit := evs[1].(*eventstypes.TaskExit); exit.ContainerID != "c1" || exit.ExitStatus != 137 {
		t.Errorf("TaskExit %+v", exit)
	}
	h.vm().Exit("c2", "", 137, false)
	h.expect(topicExit)
	h.quiet()
}

func TestStartErrors(t *testing.T) {
	h := newHarness(t, setup{})
	h.create("c1", "")
	h.exec("c1", "e1")
	internal := fmt.Errorf("cgroup gone: %w", errdefs.ErrInternal)
	for _, c := range []struct {
		name, id, exec string
		fail           string // agent method to fail
		class          error
	}{
		{"unknown container", "nope", "", "", errdefs.ErrNotFound},
		{"unknown exec", "c1", "nope", "", errdefs.ErrNotFound},
		{"guest fails start", "c1", "", "StartContainer", errdefs.ErrInternal},
		{"guest fails exec", "c1", "e1", "ExecProcess", errdefs.ErrInternal},
	} {
		if c.fail != "" {
			h.vm().Fail(c.fail, internal)
		}
		_, err := h.s.Start(h.ctx, &taskAPI.StartRequest{ID: c.id, ExecID: c.exec})
		if !isClass(err, c.class) {
			t.Errorf("%s: %v, want %v", c.name, errClass(err), c.class)
		}
		if c.fail != "" {
			if !strings.Contains(err.Error(), "cgroup gone") {
				t.Errorf("%s: %v, want the guest's message", c.name, err)
			}
			if s := h.state(c.id, c.exec); s.Status != task.Status_CREATED {
				t.Errorf("%s: the process is %v, want still created", c.name, s.Status)
			}
			h.vm().Fail(c.fail, nil)
		}
	}
	h.start("c1", "")
	if _, err := h.s.Start(h.ctx, &taskAPI.StartRequest{ID: "c1"}); !isClass(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Start of a running process: %v, want FailedPrecondition", errClass(err))
	}
	// An exec whose FIFOs cannot be opened is killed in the guest.
	h.exec("c1", "e2", "", filepath.Join(t.TempDir(), "missing", "stdout"))
	if _, err := h.s.Start(h.ctx, &taskAPI.StartRequest{ID: "c1", ExecID: "e2"}); err == nil || !strings.Contains(err.Error(), "stdio FIFOs") {
		t.Errorf("Start of an exec without its FIFOs: %v", err)
	}
	if sig := h.vm().Calls("SignalProcess"); len(sig) != 1 || sig[0].Req.(*agent.SignalProcessRequest).ExecId != "e2" || sig[0].Req.(*agent.SignalProcessRequest).Signal != 9 {
		t.Errorf("the exec left in the guest: %+v", sig)
	}
	h.expect(topicCreate, topicExecAdded, topicStart, topicExecAdded)
	h.quiet()
}

// When QEMU dies every process still running exits with 137 (as if
// SIGKILLed): Waits return, TaskExit is published once each; the dead VM
// refuses new containers, and the pod's tasks can still be deleted.
func TestVMDeathExitsEveryProcess(t *testing.T) {
	h := newHarness(t, setup{})
	h.create("pod1", "pod1")
	h.start("pod1", "")
	h.create("c1", "pod1")
	h.start("c1", "")
	h.exec("c1", "e1")
	h.start("c1", "e1")
	h.exec("c1", "e2")
	h.start("c1", "e2")
	h.exec("c1", "e3")     // never started: it has no waiter
	h.create("c2", "pod1") // never started
	h.expect(topicCreate, topicStart, topicCreate, topicStart, topicExecAdded, topicExecStarted, topicExecAdded, topicExecStarted, topicExecAdded, topicCreate)
	sb := h.vm()
	sb.Exit("c1", "e2", 0, false)
	h.expect(topicExit)

	type waited struct {
		resp *taskAPI.WaitResponse
		err  error
	}
	waits := make(chan waited, 5)
	for _, p := range [][2]string{{"pod1", ""}, {"c1", ""}, {"c1", "e1"}, {"c1", "e3"}, {"c2", ""}} {
		go func() {
			resp, err := h.waitFor(p[0], p[1])
			waits <- waited{resp, err}
		}()
	}
	sb.Die(errors.New("qemu: killed"))
	for range 5 {
		w := <-waits
		if w.err != nil {
			t.Fatal(w.err)
		}
		if w.resp.ExitStatus != exitStatusVMLost {
			t.Errorf("Wait after the VM died: %d, want %d", w.resp.ExitStatus, exitStatusVMLost)
		}
	}
	exited := map[string]bool{}
	for range 5 {
		e := h.next()
		exit, ok := e.event.(*eventstypes.TaskExit)
		if !ok || exit.ExitStatus != exitStatusVMLost || exited[exit.ID] {
			t.Fatalf("event %s %+v, want one TaskExit 137 each", e.topic, e.event)
		}
		exited[exit.ID] = true
	}
	if !exited["pod1"] || !exited["c1"] || !exited["e1"] || !exited["e3"] || !exited["c2"] {
		t.Errorf("exits published: %v", exited)
	}
	h.quiet() // e2 had exited already: not again
	if w := h.waitExit("c1", "e2"); w.ExitStatus != 0 {
		t.Errorf("the exec that exited before the VM: %d", w.ExitStatus)
	}

	if _, err := h.s.Kill(h.ctx, &taskAPI.KillRequest{ID: "c1", Signal: 9}); !isClass(err, errdefs.ErrNotFound) {
		t.Errorf("Kill after the VM died: %v, want NotFound", errClass(err))
	}
	if _, err := h.s.Create(h.ctx, h.request("c3", "pod1")); !isClass(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Create after the VM died: %v, want FailedPrecondition", errClass(err))
	}
	before := len(sb.Calls())
	for _, p := range [][2]string{{"c1", "e1"}, {"c1", "e2"}, {"c1", "e3"}, {"c1", ""}, {"c2", ""}, {"pod1", ""}} {
		if _, err := h.s.Delete(h.ctx, &taskAPI.DeleteRequest{ID: p[0], ExecID: p[1]}); err != nil {
			t.Fatalf("Delete %v after the VM died: %v", p, err)
		}
	}
	h.expect(topicDelete, topicDelete, topicDelete)
	// Nothing needs undoing in a dead guest (an exec's release is tried,
	// its failure ignored).
	for _, c := range sb.Calls()[before:] {
		if c.Method != "Stop" && c.Method != "DeleteProcess" {
			t.Errorf("%s reached the dead VM", c.Method)
		}
	}
	if !sb.Stopped() {
		t.Error("the dead VM was not cleaned up")
	}
}

func TestDeleteErrors(t *testing.T) {
	h := newHarness(t, setup{})
	h.create("pod1", "pod1")
	h.create("c1", "pod1")
	h.start("c1", "")
	h.exec("c1", "e1")
	h.start("c1", "e1")
	h.exec("c1", "e2") // never started
	for _, c := range []struct {
		name, id, exec string
		class          error
	}{
		{"unknown", "nope", "", errdefs.ErrNotFound},
		{"unknown exec", "c1", "nope", errdefs.ErrNotFound},
		{"running", "c1", "", errdefs.ErrFailedPrecondition},
		{"running exec", "c1", "e1", errdefs.ErrFailedPrecondition},
	} {
		if _, err := h.s.Delete(h.ctx, &taskAPI.DeleteRequest{ID: c.id, ExecID: c.exec}); !isClass(err, c.class) {
			t.Errorf("%s: %v, want %v", c.name, errClass(err), c.class)
		}
	}
	// An exec never started is only forgotten: the guest never had it.
	if _, err := h.s.Delete(h.ctx, &taskAPI.DeleteRequest{ID: "c1", ExecID: "e2"}); err != nil {
		t.Fatal(err)
	}
	if n := len(h.vm().Calls("DeleteProcess")); n != 0 {
		t.Errorf("DeleteProcess of an exec the guest never had")
	}

	sb := h.vm()
	sb.Exit("c1", "", 0, false)
	h.waitExit("c1", "")
	sb.Fail("RemoveContainer", fmt.Errorf("umount busy: %w", errdefs.ErrUnavailable))
	if _, err := h.s.Delete(h.ctx, &taskAPI.DeleteRequest{ID: "c1"}); !isClass(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "umount busy") {
		t.Fatalf("Delete the guest refuses: %v, want Unavailable", errClass(err))
	}
	if s := h.state("c1", ""); s.Status != task.Status_STOPPED {
		t.Errorf("c1 after a failed Delete: %v", s.Status)
	}
	if _, removed := h.host.Images(); len(removed) != 0 {
		t.Errorf("a failed Delete removed %v", removed)
	}
	sb.Fail("RemoveContainer", nil)
	if _, err := h.s.Delete(h.ctx, &taskAPI.DeleteRequest{ID: "c1"}); err != nil {
		t.Fatalf("Delete again: %v", err)
	}
}

// Shutdown ends the shim only once it serves no container; events queued
// before are published first.
func TestShutdown(t *testing.T) {
	h := newHarness(t, setup{})
	h.create("c1", "")
	if _, err := h.s.Shutdown(h.ctx, &taskAPI.ShutdownRequest{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.sd.Done():
		t.Fatal("the shim shut down with a container")
	default:
	}
	h.vm().Exit("c1", "", 0, false)
	h.waitExit("c1", "")
	if _, err := h.s.Delete(h.ctx, &taskAPI.DeleteRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.s.Shutdown(h.ctx, &taskAPI.ShutdownRequest{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.sd.Done():
	case <-time.After(wait):
		t.Fatal("the shim did not shut down with no container left")
	}
	if !h.pub.isClosed() {
		t.Error("the publisher was not closed")
	}
	h.expect(topicCreate, topicExit, topicDelete)
	if !h.vm().Stopped() {
		t.Error("VM left running")
	}
}

package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/containerd/v2/pkg/stdio"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/shim/sandbox"
	"github.com/c8s-dev/c8s/shim/task/internal/fakesandbox"
)

// errGuestFailure is an error the guest returns, by class.
var errGuestFailure = fmt.Errorf("guest says no: %w", errdefs.ErrPermissionDenied)

// running returns a harness with container c1 started and exec e1
// started in it, its events consumed.
func running(t *testing.T, cfg setup) *harness {
	t.Helper()
	h := newHarness(t, cfg)
	h.create("c1", "")
	h.start("c1", "")
	h.exec("c1", "e1")
	h.start("c1", "e1")
	h.expect(topicCreate, topicStart, topicExecAdded, topicExecStarted)
	return h
}

func TestExecErrors(t *testing.T) {
	h := running(t, setup{})
	spec, _ := typeurl.MarshalAnyToProto(&specs.Process{Args: []string{"sh"}})
	for _, c := range []struct {
		name  string
		r     *taskAPI.ExecProcessRequest
		class error
	}{
		{"unknown container", &taskAPI.ExecProcessRequest{ID: "nope", ExecID: "e2", Spec: spec}, errdefs.ErrNotFound},
		{"no exec id", &taskAPI.ExecProcessRequest{ID: "c1", Spec: spec}, errdefs.ErrInvalidArgument},
		{"no spec", &taskAPI.ExecProcessRequest{ID: "c1", ExecID: "e2"}, errdefs.ErrInvalidArgument},
		{"exists", &taskAPI.ExecProcessRequest{ID: "c1", ExecID: "e1", Spec: spec}, errdefs.ErrAlreadyExists},
	} {
		if _, err := h.s.Exec(h.ctx, c.r); !isClass(err, c.class) {
			t.Errorf("%s: %v, want %v", c.name, errClass(err), c.class)
		}
	}
	h.vm().Exit("c1", "", 0, false)
	h.waitExit("c1", "")
	if _, err := h.s.Exec(h.ctx, &taskAPI.ExecProcessRequest{ID: "c1", ExecID: "e2", Spec: spec}); !isClass(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Exec in an exited container: %v, want FailedPrecondition", errClass(err))
	}
	h.expect(topicExit)
	h.quiet() // no TaskExecAdded for the refused
}

func TestKill(t *testing.T) {
	h := running(t, setup{})
	sb := h.vm()
	if _, err := h.s.Kill(h.ctx, &taskAPI.KillRequest{ID: "c1", ExecID: "e1", Signal: 10}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.s.Kill(h.ctx, &taskAPI.KillRequest{ID: "c1", Signal: 15, All: true}); err != nil {
		t.Fatal(err)
	}
	calls := sb.Calls("SignalProcess")
	if len(calls) != 2 {
		t.Fatalf("SignalProcess calls %+v", calls)
	}
	if r := calls[0].Req.(*agent.SignalProcessRequest); r.ContainerId != "c1" || r.ExecId != "e1" || r.Signal != 10 || r.All {
		t.Errorf("Kill of the exec reached the guest as %+v", r)
	}
	if r := calls[1].Req.(*agent.SignalProcessRequest); r.ContainerId != "c1" || r.ExecId != "" || r.Signal != 15 || !r.All {
		t.Errorf("Kill --all reached the guest as %+v", r)
	}
	// SIGTERM to all ended the init and the exec.
	if w := h.waitExit("c1", ""); w.ExitStatus != 128+15 {
		t.Errorf("exit after SIGTERM: %d", w.ExitStatus)
	}
	h.waitExit("c1", "e1")
	h.expect(topicExit, topicExit)
	if _, err := h.s.Kill(h.ctx, &taskAPI.KillRequest{ID: "c1", Signal: 9}); !isClass(err, errdefs.ErrNotFound) {
		t.Errorf("Kill of an exited process: %v, want NotFound", errClass(err))
	}
	if n := len(sb.Calls("SignalProcess")); n != 2 {
		t.Errorf("Kill of an exited process reached the guest")
	}
}

func TestKillErrors(t *testing.T) {
	h := running(t, setup{})
	h.exec("c1", "e2") // not started
	for _, c := range []struct {
		name, id, exec string
		class          error
	}{
		{"unknown", "nope", "", errdefs.ErrNotFound},
		{"unknown exec", "c1", "nope", errdefs.ErrNotFound},
		{"exec not started", "c1", "e2", errdefs.ErrFailedPrecondition},
	} {
		if _, err := h.s.Kill(h.ctx, &taskAPI.KillRequest{ID: c.id, ExecID: c.exec, Signal: 9}); !isClass(err, c.class) {
			t.Errorf("%s: %v, want %v", c.name, errClass(err), c.class)
		}
	}
	sb := h.vm()
	sb.Fail("SignalProcess", errGuestFailure)
	if _, err := h.s.Kill(h.ctx, &taskAPI.KillRequest{ID: "c1", Signal: 9}); !isClass(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "guest says no") {
		t.Errorf("Kill the guest refuses: %v, want its PermissionDenied", errClass(err))
	}
	// Once the VM is gone, the process is: NotFound, whether or not its
	// exit has been recorded yet.
	sb.Die(errors.New("qemu: killed"))
	if _, err := h.s.Kill(h.ctx, &taskAPI.KillRequest{ID: "c1", Signal: 9}); !isClass(err, errdefs.ErrNotFound) {
		t.Errorf("Kill in a dead VM: %v, want NotFound", errClass(err))
	}
}

// A created init can be killed before it starts: its exit is published
// (containerd's Delete WithProcessKill of a task never started).
func TestKillOfCreatedInit(t *testing.T) {
	h := newHarness(t, setup{})
	h.create("c1", "")
	if _, err := h.s.Kill(h.ctx, &taskAPI.KillRequest{ID: "c1", Signal: 9}); err != nil {
		t.Fatal(err)
	}
	if w := h.waitExit("c1", ""); w.ExitStatus != 137 {
		t.Errorf("exit %d, want 137", w.ExitStatus)
	}
	if exit := h.expect(topicCreate, topicExit)[1].(*eventstypes.TaskExit); exit.ID != "c1" || exit.ExitStatus != 137 {
		t.Errorf("TaskExit %+v", exit)
	}
}

func TestWait(t *testing.T) {
	h := running(t, setup{})
	done := make(chan *taskAPI.WaitResponse, 1)
	go func() {
		w, err := h.waitFor("c1", "")
		if err != nil {
			t.Error(err)
		}
		done <- w
	}()
	select {
	case w := <-done:
		t.Fatalf("Wait returned %+v while the process runs", w)
	case <-time.After(20 * time.Millisecond):
	}
	h.vm().Exit("c1", "", 7, false)
	select {
	case w := <-done:
		if w == nil || w.ExitStatus != 7 || w.ExitedAt == nil || w.ExitedAt.AsTime().IsZero() {
			t.Errorf("Wait %+v, want status 7 with its time", w)
		}
	case <-time.After(2 * wait):
		t.Fatal("Wait did not return at the exit")
	}

	ctx, cancel := context.WithCancel(h.ctx)
	cancel()
	if _, err := h.s.Wait(ctx, &taskAPI.WaitRequest{ID: "c1", ExecID: "e1"}); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait with its context canceled: %v", err)
	}
	if _, err := h.s.Wait(h.ctx, &taskAPI.WaitRequest{ID: "nope"}); !isClass(err, errdefs.ErrNotFound) {
		t.Errorf("Wait unknown: %v, want NotFound", errClass(err))
	}
}

func TestState(t *testing.T) {
	h := newHarness(t, setup{})
	r := h.request("c1", "")
	r.Stdin, r.Stdout, r.Stderr = "", "", ""
	r.Terminal = true
	if _, err := h.s.Create(h.ctx, r); err != nil {
		t.Fatal(err)
	}
	if s := h.state("c1", ""); !s.Terminal || s.Bundle != r.Bundle || s.ExitedAt != nil {
		t.Errorf("State %+v", s)
	}
	for _, c := range []struct{ id, exec string }{{"nope", ""}, {"c1", "nope"}} {
		if _, err := h.s.State(h.ctx, &taskAPI.StateRequest{ID: c.id, ExecID: c.exec}); !isClass(err, errdefs.ErrNotFound) {
			t.Errorf("State %v: %v, want NotFound", c, errClass(err))
		}
	}
}

func TestPids(t *testing.T) {
	h := running(t, setup{})
	resp, err := h.s.Pids(h.ctx, &taskAPI.PidsRequest{ID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Processes) != 2 || resp.Processes[0].Pid != 100 || resp.Processes[0].Info != nil || resp.Processes[1].Pid != 101 {
		t.Fatalf("Pids %+v, want the guest's 100 and 101", resp.Processes)
	}
	v, err := typeurl.UnmarshalAny(resp.Processes[1].Info)
	if d, ok := v.(*options.ProcessDetails); err != nil || !ok || d.ExecID != "e1" {
		t.Errorf("exec details %+v, %v, want exec e1", v, err)
	}
	if _, err := h.s.Pids(h.ctx, &taskAPI.PidsRequest{ID: "nope"}); !isClass(err, errdefs.ErrNotFound) {
		t.Errorf("Pids unknown: %v, want NotFound", errClass(err))
	}
	h.vm().Fail("ListPids", errGuestFailure)
	if _, err := h.s.Pids(h.ctx, &taskAPI.PidsRequest{ID: "c1"}); !isClass(err, errdefs.ErrPermissionDenied) {
		t.Errorf("Pids the guest refuses: %v", errClass(err))
	}
}

func TestStats(t *testing.T) {
	h := running(t, setup{})
	resp, err := h.s.Stats(h.ctx, &taskAPI.StatsRequest{ID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Stats.GetTypeUrl() != fakesandbox.StatsTypeURL || string(resp.Stats.GetValue()) != "c1" {
		t.Errorf("Stats %+v, want the guest's metrics of c1", resp.Stats)
	}
	if _, err := h.s.Stats(h.ctx, &taskAPI.StatsRequest{ID: "nope"}); !isClass(err, errdefs.ErrNotFound) {
		t.Errorf("Stats unknown: %v, want NotFound", errClass(err))
	}
	h.vm().Fail("Stats", errGuestFailure)
	if _, err := h.s.Stats(h.ctx, &taskAPI.StatsRequest{ID: "c1"}); !isClass(err, errdefs.ErrPermissionDenied) {
		t.Errorf("Stats the guest refuses: %v", errClass(err))
	}
}

func TestCloseIO(t *testing.T) {
	h := running(t, setup{})
	sb := h.vm()
	if _, err := h.s.CloseIO(h.ctx, &taskAPI.CloseIORequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	if n := len(sb.Calls("CloseStdin")); n != 0 {
		t.Errorf("CloseIO without stdin closed the guest's stdin")
	}
	if _, err := h.s.CloseIO(h.ctx, &taskAPI.CloseIORequest{ID: "c1", ExecID: "e1", Stdin: true}); err != nil {
		t.Fatal(err)
	}
	if _, closed, _ := sb.Stdin("c1", "e1"); !closed {
		t.Error("CloseIO did not close the exec's stdin in the guest")
	}
	if _, err := h.s.CloseIO(h.ctx, &taskAPI.CloseIORequest{ID: "nope", Stdin: true}); !isClass(err, errdefs.ErrNotFound) {
		t.Errorf("CloseIO unknown: %v, want NotFound", errClass(err))
	}
	sb.Fail("CloseStdin", errGuestFailure)
	if _, err := h.s.CloseIO(h.ctx, &taskAPI.CloseIORequest{ID: "c1", Stdin: true}); !isClass(err, errdefs.ErrPermissionDenied) {
		t.Errorf("CloseIO the guest refuses: %v", errClass(err))
	}
	// After the exit the guest's refusal does not matter.
	sb.Exit("c1", "", 0, false)
	h.waitExit("c1", "")
	if _, err := h.s.CloseIO(h.ctx, &taskAPI.CloseIORequest{ID: "c1", Stdin: true}); err != nil {
		t.Errorf("CloseIO of an exited process: %v", err)
	}
}

func TestResizePty(t *testing.T) {
	h := newHarness(t, setup{})
	r := h.request("c1", "p")
	r.Terminal = true
	if _, err := h.s.Create(h.ctx, r); err != nil {
		t.Fatal(err)
	}
	h.create("c2", "p")
	if _, err := h.s.ResizePty(h.ctx, &taskAPI.ResizePtyRequest{ID: "c1", Width: 80, Height: 24}); err != nil {
		t.Fatal(err)
	}
	sb := h.vm()
	if c := sb.Calls("ResizePty"); len(c) != 1 || c[0].Req.(*agent.ResizePtyRequest).Width != 80 || c[0].Req.(*agent.ResizePtyRequest).Height != 24 {
		t.Errorf("ResizePty reached the guest as %+v", c)
	}
	if c := sb.Calls("CreateContainer"); !c[0].Req.(*agent.CreateContainerRequest).Stdio.GetTerminal() {
		t.Error("the terminal was not asked of the guest")
	}
	if _, err := h.s.ResizePty(h.ctx, &taskAPI.ResizePtyRequest{ID: "c2", Width: 80, Height: 24}); !isClass(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("ResizePty without a terminal: %v, want FailedPrecondition", errClass(err))
	}
	if _, err := h.s.ResizePty(h.ctx, &taskAPI.ResizePtyRequest{ID: "nope"}); !isClass(err, errdefs.ErrNotFound) {
		t.Errorf("ResizePty unknown: %v, want NotFound", errClass(err))
	}
	sb.Fail("ResizePty", errGuestFailure)
	if _, err := h.s.ResizePty(h.ctx, &taskAPI.ResizePtyRequest{ID: "c1", Width: 1, Height: 1}); !isClass(err, errdefs.ErrPermissionDenied) {
		t.Errorf("ResizePty the guest refuses: %v", errClass(err))
	}
}

func TestConnectReportsTheTaskPid(t *testing.T) {
	h := newHarness(t, setup{})
	pid := h.create("c1", "")
	resp, err := h.s.Connect(h.ctx, &taskAPI.ConnectRequest{ID: "c1"})
	if err != nil || resp.TaskPid != pid || resp.ShimPid == 0 {
		t.Fatalf("Connect %+v, %v, want task pid %d", resp, err, pid)
	}
}

func TestNotImplemented(t *testing.T) {
	h := running(t, setup{})
	for name, call := range map[string]func() error{
		"Pause":      func() error { _, err := h.s.Pause(h.ctx, &taskAPI.PauseRequest{ID: "c1"}); return err },
		"Resume":     func() error { _, err := h.s.Resume(h.ctx, &taskAPI.ResumeRequest{ID: "c1"}); return err },
		"Checkpoint": func() error { _, err := h.s.Checkpoint(h.ctx, &taskAPI.CheckpointTaskRequest{ID: "c1"}); return err },
	} {
		if err := call(); !isClass(err, errdefs.ErrNotImplemented) {
			t.Errorf("%s: %v, want NotImplemented", name, errClass(err))
		}
	}
}

// A container whose pod VM is not (or no longer) the service's: calls
// that need the VM fail as a precondition.
func TestCallsWithoutAPodVM(t *testing.T) {
	ctx, sd := shutdown.WithShutdown(context.Background())
	defer sd.Shutdown()
	s := newService(ctx, &recorder{events: make(chan published, 16)}, sd, fakeHost{fakesandbox.NewHost()})
	s.conts["c1"] = &container{id: "c1", bundle: t.TempDir(), init: newProcess("c1", "", stdio.Stdio{Terminal: true}, nil), execs: map[string]*process{}}
	res := &anypb.Any{Value: []byte(`{"pids":{"limit":10}}`)}
	for name, call := range map[string]func() error{
		"Start":     func() error { _, err := s.Start(ctx, &taskAPI.StartRequest{ID: "c1"}); return err },
		"Kill":      func() error { _, err := s.Kill(ctx, &taskAPI.KillRequest{ID: "c1", Signal: 9}); return err },
		"Pids":      func() error { _, err := s.Pids(ctx, &taskAPI.PidsRequest{ID: "c1"}); return err },
		"Stats":     func() error { _, err := s.Stats(ctx, &taskAPI.StatsRequest{ID: "c1"}); return err },
		"CloseIO":   func() error { _, err := s.CloseIO(ctx, &taskAPI.CloseIORequest{ID: "c1", Stdin: true}); return err },
		"ResizePty": func() error { _, err := s.ResizePty(ctx, &taskAPI.ResizePtyRequest{ID: "c1"}); return err },
		"Update": func() error {
			_, err := s.Update(ctx, &taskAPI.UpdateTaskRequest{ID: "c1", Resources: res})
			return err
		},
	} {
		if err := call(); !isClass(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "pod VM is not running") {
			t.Errorf("%s: %v, want FailedPrecondition", name, errClass(err))
		}
	}
}

// updateRequest is an Update of c1 to res, as containerd sends it.
func updateRequest(t *testing.T, res *specs.LinuxResources) *taskAPI.UpdateTaskRequest {
	data, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	return &taskAPI.UpdateTaskRequest{ID: "c1", Resources: &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources", Value: data}}
}

func TestUpdate(t *testing.T) {
	h := running(t, setup{hypervisor: "default_maxvcpus = 4\ndefault_maxmemory = 2048"})
	sb := h.vm()
	sb.SetSize(vm.Size{VCPUs: 1, MaxVCPUs: 4, MemoryMiB: 512, MaxMemoryMiB: 2048})

	// Within the VM: applied in the guest only.
	if _, err := h.s.Update(h.ctx, updateRequest(t, &specs.LinuxResources{Pids: &specs.LinuxPids{Limit: 10}, Memory: memLimit(256).Memory})); err != nil {
		t.Fatal(err)
	}
	upd := sb.Calls("UpdateContainer")
	if len(upd) != 1 || len(sb.Calls("Grow")) != 0 {
		t.Fatalf("calls %+v, want one UpdateContainer and no growth", sb.Calls())
	}
	var applied specs.LinuxResources
	if err := json.Unmarshal(upd[0].Req.(*agent.UpdateContainerRequest).Resources, &applied); err != nil || applied.Pids == nil || applied.Pids.Limit != 10 || *applied.Memory.Limit != 256<<20 {
		t.Errorf("the guest applied %+v (%v)", applied, err)
	}

	// A quota of 2 CPUs grows the VM to 2 vCPUs first.
	if _, err := h.s.Update(h.ctx, updateRequest(t, quota(200000, 100000))); err != nil {
		t.Fatal(err)
	}
	if g := sb.Calls("Grow"); len(g) != 1 || g[0].Req != [2]uint32{2, 0} {
		t.Errorf("Grow calls %+v, want to 2 vCPUs", g)
	}
	if calls := sb.Calls("Grow", "UpdateContainer"); len(calls) != 3 || calls[2].Method != "UpdateContainer" {
		t.Errorf("calls %+v, want the growth before the update", calls)
	}
}

func TestUpdateErrors(t *testing.T) {
	h := running(t, setup{hypervisor: "default_maxvcpus = 4"})
	sb := h.vm()
	sb.SetSize(vm.Size{VCPUs: 1, MaxVCPUs: 4, MemoryMiB: 512, MaxMemoryMiB: 512})
	for _, c := range []struct {
		name  string
		r     *taskAPI.UpdateTaskRequest
		fail  string
		class error
		msg   string
	}{
		{"unknown", &taskAPI.UpdateTaskRequest{ID: "nope"}, "", errdefs.ErrNotFound, ""},
		{"no resources", &taskAPI.UpdateTaskRequest{ID: "c1"}, "", errdefs.ErrInvalidArgument, "no resources"},
		{"not JSON", &taskAPI.UpdateTaskRequest{ID: "c1", Resources: &anypb.Any{Value: []byte("{")}}, "", errdefs.ErrInvalidArgument, "decode"},
		{"devices", updateRequest(t, &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}}), "", errdefs.ErrInvalidArgument, "devices"},
		{"beyond the VM's maximum", updateRequest(t, quota(800000, 100000)), "", errdefs.ErrFailedPrecondition, "default_maxvcpus"},
		{"guest cannot grow", updateRequest(t, quota(200000, 100000)), "Grow", errdefs.ErrFailedPrecondition, "the guest cannot grow"},
		{"guest refuses", updateRequest(t, &specs.LinuxResources{Pids: &specs.LinuxPids{Limit: 10}}), "UpdateContainer", errdefs.ErrPermissionDenied, "guest says no"},
	} {
		switch c.fail {
		case "Grow":
			sb.Fail("Grow", sandbox.ErrGuestCannotGrow)
		case "UpdateContainer":
			sb.Fail("UpdateContainer", errGuestFailure)
		}
		_, err := h.s.Update(h.ctx, c.r)
		if !isClass(err, c.class) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want %v saying %q", c.name, errClass(err), c.class, c.msg)
		}
		if c.fail != "" {
			sb.Fail(c.fail, nil)
		}
	}
	if n := len(sb.Calls("UpdateContainer")); n != 1 {
		t.Errorf("%d refused updates reached the guest, want only the one it refused", n)
	}
	sb.Exit("c1", "", 0, false)
	h.waitExit("c1", "")
	if _, err := h.s.Update(h.ctx, updateRequest(t, &specs.LinuxResources{Pids: &specs.LinuxPids{Limit: 10}})); !isClass(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Update of an exited container: %v, want FailedPrecondition", errClass(err))
	}
}

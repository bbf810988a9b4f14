package task

import (
	"context"
	"fmt"
	"os"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/pkg/protobuf"
	"github.com/containerd/containerd/v2/pkg/stdio"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/types/known/emptypb"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// Exec registers an exec process; Start runs it.
func (s *service) Exec(ctx context.Context, r *taskAPI.ExecProcessRequest) (*emptypb.Empty, error) {
	c, err := s.get(r.ID)
	if err != nil {
		return nil, err
	}
	if r.ExecID == "" {
		return nil, fmt.Errorf("exec id is required: %w", errdefs.ErrInvalidArgument)
	}
	if r.Spec == nil || len(r.Spec.GetValue()) == 0 {
		return nil, fmt.Errorf("exec %q has no process spec: %w", r.ExecID, errdefs.ErrInvalidArgument)
	}
	if c.init.hasExited() {
		return nil, fmt.Errorf("container %q has exited: %w", r.ID, errdefs.ErrFailedPrecondition)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := c.execs[r.ExecID]; ok {
		return nil, fmt.Errorf("exec %q: %w", r.ExecID, errdefs.ErrAlreadyExists)
	}
	io := stdio.Stdio{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal}
	c.execs[r.ExecID] = newProcess(r.ID, r.ExecID, io, r.Spec.GetValue())
	s.send(&eventstypes.TaskExecAdded{ContainerID: r.ID, ExecID: r.ExecID})
	return &emptypb.Empty{}, nil
}

// State reports a process's status.
func (s *service) State(ctx context.Context, r *taskAPI.StateRequest) (*taskAPI.StateResponse, error) {
	c, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	st, pid, status, at := p.state()
	resp := &taskAPI.StateResponse{
		ID:       p.execID,
		Bundle:   c.bundle,
		Pid:      pid,
		Status:   st,
		Stdin:    p.stdio.Stdin,
		Stdout:   p.stdio.Stdout,
		Stderr:   p.stdio.Stderr,
		Terminal: p.stdio.Terminal,
		ExecID:   p.execID,
	}
	if resp.ID == "" {
		resp.ID = c.id
	}
	if st == task.Status_STOPPED {
		resp.ExitStatus = status
		resp.ExitedAt = protobuf.ToTimestamp(at)
	}
	return resp, nil
}

// Kill signals a process, or with All every process of the container.
// A process that has already exited is not found, as with runc's shim
// (containerd's clients expect that: WithProcessKill then just waits).
func (s *service) Kill(ctx context.Context, r *taskAPI.KillRequest) (*emptypb.Empty, error) {
	_, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if p.hasExited() {
		return nil, fmt.Errorf("process %q of %q: process already finished: %w", r.ExecID, r.ID, errdefs.ErrNotFound)
	}
	if st, _, _, _ := p.state(); st == task.Status_CREATED && r.ExecID != "" {
		return nil, fmt.Errorf("exec %q has not started: %w", r.ExecID, errdefs.ErrFailedPrecondition)
	}
	sb, err := s.sandbox()
	if err != nil {
		return nil, err
	}
	if _, err := sb.Agent().SignalProcess(ctx, &agent.SignalProcessRequest{
		ContainerId: r.ID, ExecId: r.ExecID, Signal: r.Signal, All: r.All,
	}); err != nil {
		if p.hasExited() || vmGone(sb) {
			return nil, fmt.Errorf("process %q of %q: process already finished: %w", r.ExecID, r.ID, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("signal %d to %q: %w", r.Signal, r.ID, fromAgent(err))
	}
	return &emptypb.Empty{}, nil
}

// Wait blocks until the process has exited.
func (s *service) Wait(ctx context.Context, r *taskAPI.WaitRequest) (*taskAPI.WaitResponse, error) {
	_, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	select {
	case <-p.exited:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	_, _, status, at := p.state()
	return &taskAPI.WaitResponse{ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at)}, nil
}

// Pids lists the container's processes (guest pids).
func (s *service) Pids(ctx context.Context, r *taskAPI.PidsRequest) (*taskAPI.PidsResponse, error) {
	if _, err := s.get(r.ID); err != nil {
		return nil, err
	}
	sb, err := s.sandbox()
	if err != nil {
		return nil, err
	}
	resp, err := sb.Agent().ListPids(ctx, &agent.ListPidsRequest{ContainerId: r.ID})
	if err != nil {
		return nil, fmt.Errorf("list processes of %q: %w", r.ID, fromAgent(err))
	}
	out := &taskAPI.PidsResponse{}
	for _, pi := range resp.Processes {
		info := &task.ProcessInfo{Pid: pi.Pid}
		if pi.ExecId != "" {
			d, err := typeurl.MarshalAnyToProto(&options.ProcessDetails{ExecID: pi.ExecId})
			if err != nil {
				return nil, err
			}
			info.Info = d
		}
		out.Processes = append(out.Processes, info)
	}
	return out, nil
}

// CloseIO closes a process's stdin once what was written has been
// forwarded.
func (s *service) CloseIO(ctx context.Context, r *taskAPI.CloseIORequest) (*emptypb.Empty, error) {
	_, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if !r.Stdin {
		return &emptypb.Empty{}, nil
	}
	sb, err := s.sandbox()
	if err != nil {
		return nil, err
	}
	if err := p.closeStdin(ctx, sb.Agent()); err != nil && !p.hasExited() {
		return nil, fmt.Errorf("close stdin of %q: %w", r.ID, fromAgent(err))
	}
	return &emptypb.Empty{}, nil
}

// ResizePty resizes a process's terminal.
func (s *service) ResizePty(ctx context.Context, r *taskAPI.ResizePtyRequest) (*emptypb.Empty, error) {
	_, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if !p.stdio.Terminal {
		return nil, fmt.Errorf("process %q of %q has no terminal: %w", r.ExecID, r.ID, errdefs.ErrFailedPrecondition)
	}
	sb, err := s.sandbox()
	if err != nil {
		return nil, err
	}
	if _, err := sb.Agent().ResizePty(ctx, &agent.ResizePtyRequest{
		ContainerId: r.ID, ExecId: r.ExecID, Width: r.Width, Height: r.Height,
	}); err != nil {
		return nil, fmt.Errorf("resize terminal of %q: %w", r.ID, fromAgent(err))
	}
	return &emptypb.Empty{}, nil
}

// Stats returns the container's cgroup metrics from inside the VM.
func (s *service) Stats(ctx context.Context, r *taskAPI.StatsRequest) (*taskAPI.StatsResponse, error) {
	if _, err := s.get(r.ID); err != nil {
		return nil, err
	}
	sb, err := s.sandbox()
	if err != nil {
		return nil, err
	}
	resp, err := sb.Agent().Stats(ctx, &agent.StatsRequest{ContainerId: r.ID})
	if err != nil {
		return nil, fmt.Errorf("stats of %q: %w", r.ID, fromAgent(err))
	}
	return &taskAPI.StatsResponse{Stats: resp.Stats}, nil
}

// Connect returns the shim's pid and the task's (guest) pid. With no ID it
// answers for the shim alone, as runc's shim does (CRI asks so).
func (s *service) Connect(ctx context.Context, r *taskAPI.ConnectRequest) (*taskAPI.ConnectResponse, error) {
	if r.ID == "" {
		return &taskAPI.ConnectResponse{ShimPid: uint32(os.Getpid())}, nil
	}
	c, err := s.get(r.ID)
	if err != nil {
		return nil, err
	}
	_, pid, _, _ := c.init.state()
	return &taskAPI.ConnectResponse{ShimPid: uint32(os.Getpid()), TaskPid: pid}, nil
}

// createCleanupWait bounds how long Shutdown waits for the Creates it
// cancelled to undo their work.
const createCleanupWait = time.Minute

// Shutdown ends the shim once it serves no container. A Create still
// booting the pod VM (containerd gave up on it) is cancelled first and
// undoes what it made: the shim must not exit under it and leave its
// state dir, taps and layer references behind.
func (s *service) Shutdown(ctx context.Context, r *taskAPI.ShutdownRequest) (*emptypb.Empty, error) {
	// One at a time: each waits for the Creates it cancelled, and only
	// then may another reopen the shim to Creates (WaitGroup reuse).
	s.shutdownMu.Lock()
	defer s.shutdownMu.Unlock()
	s.mu.Lock()
	if len(s.conts) > 0 {
		s.mu.Unlock()
		return &emptypb.Empty{}, nil
	}
	s.closing = true
	stop := s.stopCreates
	s.mu.Unlock()
	stop()
	// Past containerd's deadline for the Shutdown (3 s, less than a
	// booted VM's stop may take): it then runs `shim delete`, and the
	// shim exits by itself once the Create has undone its work. Bounded,
	// so that a cleanup that hangs does not keep the shim for ever.
	waited := make(chan struct{})
	go func() { s.creating.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(createCleanupWait):
		log.G(ctx).Warnf("shutting down before a cancelled Create has cleaned up (%v)", createCleanupWait)
		s.sd.Shutdown()
		return &emptypb.Empty{}, nil
	}
	s.mu.Lock()
	if len(s.conts) > 0 {
		// A Create ended first: the shim serves its container.
		s.closing = false
		s.creates, s.stopCreates = context.WithCancel(context.Background())
		s.mu.Unlock()
		return &emptypb.Empty{}, nil
	}
	s.mu.Unlock()
	log.G(ctx).Debug("no containers left: shutting the shim down")
	s.sd.Shutdown()
	return &emptypb.Empty{}, nil
}

// Pause is not supported: a paused VM would stop every container of the pod.
func (s *service) Pause(context.Context, *taskAPI.PauseRequest) (*emptypb.Empty, error) {
	return nil, fmt.Errorf("pause: %w", errdefs.ErrNotImplemented)
}

// Resume is not supported; see Pause.
func (s *service) Resume(context.Context, *taskAPI.ResumeRequest) (*emptypb.Empty, error) {
	return nil, fmt.Errorf("resume: %w", errdefs.ErrNotImplemented)
}

// Checkpoint is not supported: confidential memory cannot be dumped.
func (s *service) Checkpoint(context.Context, *taskAPI.CheckpointTaskRequest) (*emptypb.Empty, error) {
	return nil, fmt.Errorf("checkpoint: %w", errdefs.ErrNotImplemented)
}

// Update changes a container's CPU, memory and pids limits in the guest,
// growing the pod VM by hot-plug where it must and can (update.go).
func (s *service) Update(ctx context.Context, r *taskAPI.UpdateTaskRequest) (*emptypb.Empty, error) {
	if err := s.update(ctx, r); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

package fakesandbox

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// The guest: c8s-agent's containers and processes, kept in memory. A
// process exits when a test calls Exit, when it gets SIGKILL or SIGTERM
// (128+signal, as with their default action), or when its container is
// removed (137).

// StatsTypeURL is the type of the metrics Stats returns; their value is
// the container's id.
const StatsTypeURL = "fakesandbox/stats"

type container struct {
	req   *agent.CreateContainerRequest
	init  *process
	execs map[string]*process
}

type process struct {
	pid     uint32
	stdio   *agent.Stdio
	spec    []byte
	started bool
	exited  chan struct{}
	status  uint32
	oom     bool
	at      time.Time
	// stdout and stderr are output not read yet; stdin is what was
	// written, until stdinClosed.
	stdout, stderr []byte
	stdin          []byte
	stdinClosed    bool
	// changed is closed and replaced when output arrives or the process
	// exits.
	changed chan struct{}
}

func (p *process) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

func (p *process) wake() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// exit ends p once; s.mu is held.
func (p *process) exit(status uint32, oom bool) {
	if p.hasExited() {
		return
	}
	p.status, p.oom, p.at = status, oom, time.Now()
	close(p.exited)
	p.wake()
}

func (s *Sandbox) newProcess(stdio *agent.Stdio, spec []byte) *process {
	p := &process{pid: s.nextPid, stdio: stdio, spec: spec, exited: make(chan struct{}), changed: make(chan struct{})}
	s.nextPid++
	return p
}

// process finds a process; s.mu is held.
func (s *Sandbox) process(id, execID string) (*container, *process, error) {
	c, ok := s.containers[id]
	if !ok {
		return nil, nil, fmt.Errorf("container %q: %w", id, errdefs.ErrNotFound)
	}
	if execID == "" {
		return c, c.init, nil
	}
	p, ok := c.execs[execID]
	if !ok {
		return nil, nil, fmt.Errorf("exec %q of container %q: %w", execID, id, errdefs.ErrNotFound)
	}
	return c, p, nil
}

// Exit makes a process exit with status, killed by the OOM killer if oom.
func (s *Sandbox) Exit(id, execID string, status uint32, oom bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, p, err := s.process(id, execID)
	if err != nil {
		return err
	}
	p.exit(status, oom)
	return nil
}

// Output queues output for a process to read.
func (s *Sandbox) Output(id, execID, stdout, stderr string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, p, err := s.process(id, execID)
	if err != nil {
		return err
	}
	p.stdout = append(p.stdout, stdout...)
	p.stderr = append(p.stderr, stderr...)
	p.wake()
	return nil
}

// Stdin returns what was written to a process's stdin, and whether it
// was closed.
func (s *Sandbox) Stdin(id, execID string) (string, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, p, err := s.process(id, execID)
	if err != nil {
		return "", false, err
	}
	return string(p.stdin), p.stdinClosed, nil
}

// Containers lists the ids of the containers in the guest.
func (s *Sandbox) Containers() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id := range s.containers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Agent is the agent service of the guest.
func (s *Sandbox) Agent() agent.AgentService { return guestAgent{s: s} }

// IO is the IO service of the guest.
func (s *Sandbox) IO() agent.IOService { return guestIO{s} }

// guestAgent is the fake's agent.AgentService; calls the fake does not
// implement panic (nil embedded interface).
type guestAgent struct {
	agent.AgentService
	s *Sandbox
}

func (a guestAgent) CreateContainer(_ context.Context, r *agent.CreateContainerRequest) (*agent.CreateContainerResponse, error) {
	s := a.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.agentErr("CreateContainer", r); err != nil {
		return nil, err
	}
	if _, ok := s.containers[r.ContainerId]; ok {
		return nil, s.wire(fmt.Errorf("container %q: %w", r.ContainerId, errdefs.ErrAlreadyExists))
	}
	c := &container{req: r, init: s.newProcess(r.Stdio, nil), execs: map[string]*process{}}
	s.containers[r.ContainerId] = c
	return &agent.CreateContainerResponse{Pid: c.init.pid}, nil
}

func (a guestAgent) StartContainer(_ context.Context, r *agent.StartContainerRequest) (*agent.StartContainerResponse, error) {
	s := a.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.agentErr("StartContainer", r); err != nil {
		return nil, err
	}
	_, p, err := s.process(r.ContainerId, "")
	if err != nil {
		return nil, s.wire(err)
	}
	if p.started || p.hasExited() {
		return nil, s.wire(fmt.Errorf("container %q was started already: %w", r.ContainerId, errdefs.ErrFailedPrecondition))
	}
	p.started = true
	return &agent.StartContainerResponse{Pid: p.pid}, nil
}

func (a guestAgent) ExecProcess(_ context.Context, r *agent.ExecProcessRequest) (*agent.ExecProcessResponse, error) {
	s := a.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.agentErr("ExecProcess", r); err != nil {
		return nil, err
	}
	c, _, err := s.process(r.ContainerId, "")
	if err != nil {
		return nil, s.wire(err)
	}
	if _, ok := c.execs[r.ExecId]; ok {
		return nil, s.wire(fmt.Errorf("exec %q: %w", r.ExecId, errdefs.ErrAlreadyExists))
	}
	p := s.newProcess(r.Stdio, r.Process)
	p.started = true
	c.execs[r.ExecId] = p
	return &agent.ExecProcessResponse{Pid: p.pid}, nil
}

func (a guestAgent) WaitProcess(ctx context.Context, r *agent.ProcessRequest) (*agent.WaitProcessResponse, error) {
	s := a.s
	s.mu.Lock()
	if err := s.agentErr("WaitProcess", r); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	_, p, err := s.process(r.ContainerId, r.ExecId)
	s.mu.Unlock()
	if err != nil {
		return nil, s.wire(err)
	}
	select {
	case <-p.exited:
	case <-s.done:
		return nil, ErrConnClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return &agent.WaitProcessResponse{ExitStatus: p.status, ExitedAt: timestamppb.New(p.at), OomKilled: p.oom}, nil
}

func (a guestAgent) SignalProcess(_ context.Context, r *agent.SignalProcessRequest) (*agent.Empty, error) {
	s := a.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.agentErr("SignalProcess", r); err != nil {
		return nil, err
	}
	c, p, err := s.process(r.ContainerId, r.ExecId)
	if err != nil {
		return nil, s.wire(err)
	}
	if p.hasExited() {
		return nil, s.wire(fmt.Errorf("process already finished: %w", errdefs.ErrNotFound))
	}
	targets := []*process{p}
	if r.All {
		targets = append(targets, c.init)
		for _, e := range c.execs {
			targets = append(targets, e)
		}
	}
	if r.Signal == 9 || r.Signal == 15 {
		for _, t := range targets {
			t.exit(128+r.Signal, false)
		}
	}
	return &agent.Empty{}, nil
}

func (a guestAgent) DeleteProcess(_ context.Context, r *agent.ProcessRequest) (*agent.Empty, error) {
	s := a.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.agentErr("DeleteProcess", r); err != nil {
		return nil, err
	}
	c, p, err := s.process(r.ContainerId, r.ExecId)
	if err != nil {
		return nil, s.wire(err)
	}
	if r.ExecId == "" || !p.hasExited() {
		return nil, s.wire(fmt.Errorf("delete process %q of %q: %w", r.ExecId, r.ContainerId, errdefs.ErrFailedPrecondition))
	}
	delete(c.execs, r.ExecId)
	return &agent.Empty{}, nil
}

func (a guestAgent) RemoveContainer(_ context.Context, r *agent.RemoveContainerRequest) (*agent.Empty, error) {
	s := a.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.agentErr("RemoveContainer", r); err != nil {
		return nil, err
	}
	c, _, err := s.process(r.ContainerId, "")
	if err != nil {
		return nil, s.wire(err)
	}
	c.init.exit(137, false)
	for _, e := range c.execs {
		e.exit(137, false)
	}
	delete(s.containers, r.ContainerId)
	return &agent.Empty{}, nil
}

func (a guestAgent) ResizePty(_ context.Context, r *agent.ResizePtyRequest) (*agent.Empty, error) {
	return a.record("ResizePty", r.ContainerId, r.ExecId, r)
}

func (a guestAgent) CloseStdin(_ context.Context, r *agent.ProcessRequest) (*agent.Empty, error) {
	s := a.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.agentErr("CloseStdin", r); err != nil {
		return nil, err
	}
	_, p, err := s.process(r.ContainerId, r.ExecId)
	if err != nil {
		return nil, s.wire(err)
	}
	p.stdinClosed = true
	return &agent.Empty{}, nil
}

func (a guestAgent) UpdateContainer(_ context.Context, r *agent.UpdateContainerRequest) (*agent.Empty, error) {
	return a.record("UpdateContainer", r.ContainerId, "", r)
}

// record answers a call that only needs its process to exist.
func (a guestAgent) record(method, id, execID string, r any) (*agent.Empty, error) {
	s := a.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.agentErr(method, r); err != nil {
		return nil, err
	}
	if _, _, err := s.process(id, execID); err != nil {
		return nil, s.wire(err)
	}
	return &agent.Empty{}, nil
}

func (a guestAgent) ListPids(_ context.Context, r *agent.ListPidsRequest) (*agent.ListPidsResponse, error) {
	s := a.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.agentErr("ListPids", r); err != nil {
		return nil, err
	}
	c, _, err := s.process(r.ContainerId, "")
	if err != nil {
		return nil, s.wire(err)
	}
	resp := &agent.ListPidsResponse{}
	if c.init.started && !c.init.hasExited() {
		resp.Processes = append(resp.Processes, &agent.ProcessInfo{Pid: c.init.pid})
	}
	var ids []string
	for id := range c.execs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if e := c.execs[id]; !e.hasExited() {
			resp.Processes = append(resp.Processes, &agent.ProcessInfo{Pid: e.pid, ExecId: id})
		}
	}
	return resp, nil
}

func (a guestAgent) Stats(_ context.Context, r *agent.StatsRequest) (*agent.StatsResponse, error) {
	s := a.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.agentErr("Stats", r); err != nil {
		return nil, err
	}
	if _, _, err := s.process(r.ContainerId, ""); err != nil {
		return nil, s.wire(err)
	}
	return &agent.StatsResponse{Stats: &anypb.Any{TypeUrl: StatsTypeURL, Value: []byte(r.ContainerId)}}, nil
}

// guestIO is the fake's agent.IOService.
type guestIO struct{ s *Sandbox }

func (g guestIO) ReadStdout(ctx context.Context, r *agent.ReadStreamRequest) (*agent.ReadStreamResponse, error) {
	return g.read(ctx, "ReadStdout", r, func(p *process) *[]byte { return &p.stdout })
}

func (g guestIO) ReadStderr(ctx context.Context, r *agent.ReadStreamRequest) (*agent.ReadStreamResponse, error) {
	return g.read(ctx, "ReadStderr", r, func(p *process) *[]byte { return &p.stderr })
}

// read returns the stream's pending output, waiting for some; at the
// process's exit, once all is read, it reports EOF.
func (g guestIO) read(ctx context.Context, method string, r *agent.ReadStreamRequest, stream func(*process) *[]byte) (*agent.ReadStreamResponse, error) {
	s := g.s
	s.mu.Lock()
	if err := s.agentErr(method, r); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	_, p, err := s.process(r.ContainerId, r.ExecId)
	if err != nil {
		s.mu.Unlock()
		return nil, s.wire(err)
	}
	for {
		buf := stream(p)
		if len(*buf) > 0 {
			n := min(len(*buf), int(max(r.MaxBytes, 1)))
			data := append([]byte(nil), (*buf)[:n]...)
			*buf = (*buf)[n:]
			s.mu.Unlock()
			return &agent.ReadStreamResponse{Data: data}, nil
		}
		if p.hasExited() {
			s.mu.Unlock()
			return &agent.ReadStreamResponse{Eof: true}, nil
		}
		changed := p.changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-s.done:
			return nil, ErrConnClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		s.mu.Lock()
	}
}

func (g guestIO) WriteStdin(_ context.Context, r *agent.WriteStdinRequest) (*agent.WriteStdinResponse, error) {
	s := g.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.agentErr("WriteStdin", r); err != nil {
		return nil, err
	}
	_, p, err := s.process(r.ContainerId, r.ExecId)
	if err != nil {
		return nil, s.wire(err)
	}
	if p.stdinClosed {
		return nil, s.wire(fmt.Errorf("stdin of %q is closed: %w", r.ExecId, errdefs.ErrFailedPrecondition))
	}
	p.stdin = append(p.stdin, r.Data...)
	return &agent.WriteStdinResponse{Written: uint32(len(r.Data))}, nil
}

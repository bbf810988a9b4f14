package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/containerd/console"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/ociruntime"
	"github.com/c8s-dev/c8s/guest/policy"
	"github.com/c8s-dev/c8s/guest/reaper"
	"github.com/c8s-dev/c8s/guest/spec"
)

// process is a container's init or exec process.
type process struct {
	execID  string
	pid     int
	io      *ociruntime.ProcessIO
	console console.Console
	stdin   *stdin
	stdout  *stream
	stderr  *stream

	// claim is the reaper's claim of the process's exit: signals go
	// through it, never to a pid reaped since.
	claim <-chan reaper.Exit

	done     chan struct{} // closed at exit
	mu       sync.Mutex
	status   int
	exitedAt time.Time
}

// newProcess starts buffering a created process's output and waiting for its
// exit. Without output (the pod's policy keeps a container's logs from the
// host), the output is read and discarded: the process never blocks on it,
// and nothing of it is kept for the host.
func newProcess(containerID, execID string, rp *ociruntime.Process, stdio ociruntime.Stdio, output bool) *process {
	p := &process{
		execID:  execID,
		pid:     rp.Pid,
		claim:   rp.Exit,
		io:      rp.IO,
		console: rp.IO.Console,
		stdin:   newStdin(rp.IO.Stdin),
		stdout:  closedStream(),
		stderr:  closedStream(),
		done:    make(chan struct{}),
	}
	switch {
	case !output:
		for _, r := range []io.Reader{rp.IO.Stdout, rp.IO.Stderr} {
			if r != nil {
				go discard(r)
			}
		}
	default:
		if rp.IO.Stdout != nil && (stdio.Stdout || stdio.Terminal) {
			p.stdout = newStream()
			go p.stdout.fill(rp.IO.Stdout)
		}
		if rp.IO.Stderr != nil {
			p.stderr = newStream()
			go p.stderr.fill(rp.IO.Stderr)
		}
	}
	go func() {
		e := <-rp.Exit
		p.mu.Lock()
		p.status, p.exitedAt = e.Status, e.Timestamp
		p.mu.Unlock()
		close(p.done)
		log.L.WithField("container", containerID).WithField("exec", execID).
			WithField("pid", e.Pid).WithField("status", e.Status).Debug("process exited")
	}()
	return p
}

func (p *process) name(containerID string) string {
	if p.execID == "" {
		return fmt.Sprintf("container %q", containerID)
	}
	return fmt.Sprintf("exec %q of container %q", p.execID, containerID)
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// release frees the process's stdio once it is forgotten. Buffered output is
// dropped (and given back to the agent's output budget); readers still
// blocked get eof.
func (p *process) release() {
	_ = p.stdin.close(0)
	_ = p.io.Close()
	p.stdout.drop()
	p.stderr.drop()
}

// ExecProcess runs an additional process in a running container.
func (s *Service) ExecProcess(ctx context.Context, req *agentapi.ExecProcessRequest) (*agentapi.ExecProcessResponse, error) {
	execID := req.GetExecId()
	if err := validID("exec id", execID); err != nil {
		return nil, err
	}
	// Before the lookup: until the policy is in force the host is refused
	// whether or not the container exists.
	if err := s.requirePolicy(ctx, fmt.Sprintf("exec %q", execID)); err != nil {
		return nil, err
	}
	c, err := s.lookup(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	if !s.execAllowed() {
		return nil, fmt.Errorf("exec %q refused: the pod's measured policy forbids exec (agent_policy.allow_exec = false): %w", execID, errdefs.ErrPermissionDenied)
	}
	proc, err := spec.AdaptProcess(req.GetProcess(), req.GetStdio().GetTerminal())
	if err != nil {
		return nil, fmt.Errorf("exec %q: %w: %w", execID, err, errdefs.ErrInvalidArgument)
	}
	// Under a policy, what the host left out is the container's: its
	// working directory, its user.
	c.policy().ExecDefaults(proc, hasUser(req.GetProcess()))
	// The process the guest will run, as adapted, is what the policy
	// judges.
	if err := s.evaluator().Exec(c.policy(), &policy.Exec{
		ExecID: execID, Process: proc, Stdin: req.GetStdio().GetStdin(), Terminal: req.GetStdio().GetTerminal(),
	}); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.init == nil || c.init.exited() {
		c.mu.Unlock()
		return nil, fmt.Errorf("container %q is not running: %w", c.id, errdefs.ErrFailedPrecondition)
	}
	if _, ok := c.execs[execID]; ok {
		c.mu.Unlock()
		return nil, fmt.Errorf("exec %q in container %q: %w", execID, c.id, errdefs.ErrAlreadyExists)
	}
	c.execs[execID] = nil // reserved while the OCI runtime runs
	c.mu.Unlock()

	if err := s.layersCorrupted(ctx, c.heldLayers()); err != nil {
		c.mu.Lock()
		delete(c.execs, execID)
		c.mu.Unlock()
		return nil, fmt.Errorf("exec %q in container %q refused: %w", execID, c.id, err)
	}
	stdio := stdioOf(req.GetStdio())
	var p *process
	// The runtime finds the container by its id: the policy decided for
	// c, and the exec must not reach a container that took c's id after
	// c's removal. The exec is c's (or failed) before RemoveContainer
	// goes on.
	err = c.byID(func() error {
		rp, err := s.cfg.Runtime.Exec(ctx, c.id, execID, c.bundle, proc, stdio)
		if err != nil {
			err = s.layerFailure(ctx, c, err)
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if err != nil {
			delete(c.execs, execID)
			return err
		}
		// An exec's output is what the host allowed it for.
		p = newProcess(c.id, execID, rp, stdio, true)
		c.execs[execID] = p
		return nil
	})
	if err != nil {
		c.mu.Lock()
		if q, ok := c.execs[execID]; ok && q == nil {
			delete(c.execs, execID) // refused by byID: still reserved
		}
		c.mu.Unlock()
		return nil, err
	}
	return &agentapi.ExecProcessResponse{Pid: uint32(p.pid)}, nil
}

// WaitProcess blocks until the process exits or the request is cancelled.
func (s *Service) WaitProcess(ctx context.Context, req *agentapi.ProcessRequest) (*agentapi.WaitProcessResponse, error) {
	c, p, err := s.process(req.GetContainerId(), req.GetExecId())
	if err != nil {
		return nil, err
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	// The container's cgroup stays until it is deleted, after this answer.
	oom := false
	if p.execID == "" {
		// Not once removed: the cgroup path may name a new container.
		_ = c.byID(func() error { oom = oomKilled(c.cgroupPath()); return nil })
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return &agentapi.WaitProcessResponse{ExitStatus: uint32(p.status), ExitedAt: timestamppb.New(p.exitedAt), OomKilled: oom}, nil
}

// SignalProcess signals a process, or with all every process of the
// container's cgroup. Signalling a process that has already exited
// succeeds; the shim decides what its caller sees.
func (s *Service) SignalProcess(ctx context.Context, req *agentapi.SignalProcessRequest) (*agentapi.Empty, error) {
	c, p, err := s.process(req.GetContainerId(), req.GetExecId())
	if err != nil {
		return nil, err
	}
	sig := int(req.GetSignal())
	if sig <= 0 || sig > 64 {
		return nil, fmt.Errorf("signal %d: %w", sig, errdefs.ErrInvalidArgument)
	}
	if err := s.evaluator().Signal(c.policy(), req.GetExecId(), sig, req.GetAll()); err != nil {
		return nil, err
	}
	if req.GetAll() {
		// The container's cgroup holds every process of it, created or
		// running, init exited or not; `crun kill --all` refuses a stopped
		// container whose leftovers still run.
		if err := c.byID(func() error { return signalCgroup(c.cgroupPath(), unix.Signal(sig)) }); err != nil {
			return nil, err
		}
		return &agentapi.Empty{}, nil
	}
	if p.exited() {
		return &agentapi.Empty{}, nil
	}
	if p.execID == "" {
		// crun kill also handles a created-but-not-started container.
		if err := c.byID(func() error { return s.cfg.Runtime.Kill(ctx, c.id, c.bundle, sig, false) }); err != nil {
			if errors.Is(err, errRemoved) || p.exited() {
				// Removed: the runtime's delete kills it.
				return &agentapi.Empty{}, nil
			}
			// The init of a created container is crun's own process
			// waiting to exec the container's: it can be signalled as any.
			if kerr := s.cfg.Runtime.Reaper.Signal(p.pid, p.claim, unix.Signal(sig)); kerr != nil && !errors.Is(kerr, unix.ESRCH) {
				return nil, err
			}
		}
		return &agentapi.Empty{}, nil
	}
	// Through the reaper: the pid is signalled only until it is reaped,
	// never once the kernel may have given it to another process.
	if err := s.cfg.Runtime.Reaper.Signal(p.pid, p.claim, unix.Signal(sig)); err != nil && !errors.Is(err, unix.ESRCH) {
		return nil, fmt.Errorf("signal %d %s (pid %d): %w", sig, p.name(c.id), p.pid, err)
	}
	return &agentapi.Empty{}, nil
}

// DeleteProcess forgets an exited exec process.
func (s *Service) DeleteProcess(ctx context.Context, req *agentapi.ProcessRequest) (*agentapi.Empty, error) {
	if req.GetExecId() == "" {
		return nil, fmt.Errorf("the init process of container %q is deleted with RemoveContainer: %w", req.GetContainerId(), errdefs.ErrInvalidArgument)
	}
	c, p, err := s.process(req.GetContainerId(), req.GetExecId())
	if err != nil {
		return nil, err
	}
	if !p.exited() {
		return nil, fmt.Errorf("%s (pid %d) is still running; signal it and wait for it first: %w", p.name(c.id), p.pid, errdefs.ErrFailedPrecondition)
	}
	c.mu.Lock()
	delete(c.execs, p.execID)
	c.mu.Unlock()
	p.release()
	return &agentapi.Empty{}, nil
}

// ResizePty resizes a process's terminal.
func (s *Service) ResizePty(ctx context.Context, req *agentapi.ResizePtyRequest) (*agentapi.Empty, error) {
	c, p, err := s.process(req.GetContainerId(), req.GetExecId())
	if err != nil {
		return nil, err
	}
	if err := s.evaluator().Resize(c.policy(), req.GetExecId()); err != nil {
		return nil, err
	}
	if p.console == nil {
		return nil, fmt.Errorf("%s has no terminal: %w", p.name(c.id), errdefs.ErrFailedPrecondition)
	}
	ws := console.WinSize{Width: uint16(req.GetWidth()), Height: uint16(req.GetHeight())}
	if err := p.console.Resize(ws); err != nil {
		return nil, fmt.Errorf("resize the terminal of %s: %w", p.name(c.id), err)
	}
	return &agentapi.Empty{}, nil
}

// CloseStdin closes the process's stdin after writes in progress. With a
// terminal the pty stays open and further writes are refused.
func (s *Service) CloseStdin(ctx context.Context, req *agentapi.ProcessRequest) (*agentapi.Empty, error) {
	c, p, err := s.process(req.GetContainerId(), req.GetExecId())
	if err != nil {
		return nil, err
	}
	if err := p.stdin.close(stdinCloseWait); err != nil {
		return nil, fmt.Errorf("close stdin of %s: %w", p.name(c.id), err)
	}
	return &agentapi.Empty{}, nil
}

// discard reads r to its end (EOF, or EIO of a pty) and drops what it
// reads.
func discard(r io.Reader) { _, _ = io.Copy(io.Discard, r) }

// hasUser reports whether an OCI process (JSON) states its user.
func hasUser(raw []byte) bool {
	var p struct {
		User *json.RawMessage `json:"user"`
	}
	return json.Unmarshal(raw, &p) == nil && p.User != nil && string(*p.User) != "null"
}

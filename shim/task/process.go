package task

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/pkg/stdio"
	"github.com/containerd/errdefs"
	"github.com/containerd/fifo"
	"github.com/containerd/log"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// ioDrainTimeout bounds how long an exit waits for the process's output to
// be copied: a background child that inherited stdout can keep the stream
// open after the process itself has exited.
const ioDrainTimeout = 2 * time.Second

// readStreamBytes is the most output one read from the guest returns (the
// agent's own cap, well below ttrpc's message limit).
const readStreamBytes = 1 << 20

// stdinDrainTimeout bounds how long CloseIO waits for the stdin copy to
// reach the end of what the client wrote (a variable for tests).
var stdinDrainTimeout = 5 * time.Second

// container is one containerd task: its init process, its execs and its
// root (root.go).
type container struct {
	id     string
	bundle string
	root   *containerRoot
	init   *process
	execs  map[string]*process
	// hostPid, when not zero, is the pid reported for every process of
	// the container instead of its guest pid (criview.go).
	hostPid uint32
}

func (c *container) process(execID string) (*process, error) {
	if execID == "" {
		return c.init, nil
	}
	p, ok := c.execs[execID]
	if !ok {
		return nil, fmt.Errorf("exec %q of container %q: %w", execID, c.id, errdefs.ErrNotFound)
	}
	return p, nil
}

// reported is the pid containerd is told for a process of c whose guest
// pid is guest.
func (c *container) reported(guest uint32) uint32 {
	if c.hostPid != 0 {
		return c.hostPid
	}
	return guest
}

// process is a container's init process or one of its execs, as the shim
// tracks it. Its pid is the one reported to containerd: the guest pid, or
// for a container CRI made the pod's host pid (container.reported).
type process struct {
	containerID string
	execID      string
	stdio       stdio.Stdio
	// spec is an exec's OCI process spec (JSON); empty for init.
	spec []byte

	mu         sync.Mutex
	pid        uint32
	status     task.Status
	exitStatus uint32
	exitedAt   time.Time
	exited     chan struct{}

	stdin     io.ReadCloser
	stdinDone chan struct{}
	// stopStdin ends the stdin copy's call in flight: a write the guest
	// cannot complete (nothing reads the process's stdin) must not hold
	// CloseIO up.
	stopStdin context.CancelFunc
	// stdinForwardedEOF is set once the copy has closed the guest's stdin.
	stdinForwardedEOF atomic.Bool
	outputs           sync.WaitGroup
	// stopOutputs ends the output copies, which closes containerd's
	// FIFOs; set by startIO.
	stopOutputs context.CancelFunc
	closeIO     sync.Once
}

func newProcess(containerID, execID string, io stdio.Stdio, spec []byte) *process {
	return &process{
		containerID: containerID,
		execID:      execID,
		stdio:       io,
		spec:        spec,
		status:      task.Status_CREATED,
		exited:      make(chan struct{}),
	}
}

func (p *process) agentStdio() *agent.Stdio {
	return &agent.Stdio{
		Terminal: p.stdio.Terminal,
		Stdin:    p.stdio.Stdin != "",
		Stdout:   p.stdio.Stdout != "",
		Stderr:   p.stdio.Stderr != "" && !p.stdio.Terminal,
	}
}

func (p *process) state() (task.Status, uint32, uint32, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status, p.pid, p.exitStatus, p.exitedAt
}

func (p *process) setRunning(pid uint32) {
	p.mu.Lock()
	p.pid = pid
	if p.status == task.Status_CREATED {
		p.status = task.Status_RUNNING
	}
	p.mu.Unlock()
}

// setExited records the exit once; it reports whether this call did.
func (p *process) setExited(status uint32, at time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.status == task.Status_STOPPED {
		return false
	}
	p.status = task.Status_STOPPED
	p.exitStatus = status
	p.exitedAt = at
	close(p.exited)
	return true
}

func (p *process) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// startIO opens containerd's FIFOs and starts copying between them and the
// agent's IO service. The output copies end at the guest stream's EOF, or
// when ctx ends.
func (p *process) startIO(ctx context.Context, ioc agent.IOService, ac agent.AgentService) error {
	outCtx, stop := context.WithCancel(ctx)
	p.stopOutputs = stop
	open := func(path string, flag int) (io.ReadWriteCloser, error) {
		return fifo.OpenFifo(ctx, path, flag, 0)
	}
	if p.stdio.Stdin != "" {
		f, err := open(p.stdio.Stdin, syscall.O_RDONLY|syscall.O_NONBLOCK)
		if err != nil {
			return err
		}
		p.stdin = f
		p.stdinDone = make(chan struct{})
	}
	outs := []struct {
		path string
		read func(context.Context, *agent.ReadStreamRequest) (*agent.ReadStreamResponse, error)
	}{{p.stdio.Stdout, ioc.ReadStdout}}
	if !p.stdio.Terminal {
		outs = append(outs, struct {
			path string
			read func(context.Context, *agent.ReadStreamRequest) (*agent.ReadStreamResponse, error)
		}{p.stdio.Stderr, ioc.ReadStderr})
	}
	var writers []io.WriteCloser
	for _, o := range outs {
		if o.path == "" {
			continue
		}
		w, err := open(o.path, syscall.O_WRONLY)
		if err != nil {
			for _, w := range writers {
				w.Close()
			}
			if p.stdin != nil {
				// No copy runs: CloseIO has nothing to wait for.
				p.stdin.Close()
				p.stdin, p.stdinDone = nil, nil
			}
			return err
		}
		writers = append(writers, w)
		p.outputs.Add(1)
		go p.copyOut(outCtx, o.read, w)
	}
	if p.stdin != nil {
		inCtx, stopIn := context.WithCancel(ctx)
		p.stopStdin = stopIn
		go p.copyIn(inCtx, ioc, ac)
	}
	return nil
}

func (p *process) copyOut(ctx context.Context, read func(context.Context, *agent.ReadStreamRequest) (*agent.ReadStreamResponse, error), w io.WriteCloser) {
	defer p.outputs.Done()
	defer w.Close()
	// Take whatever the guest has buffered, up to its cap: output that piled
	// up during one round trip comes back in the next, not 32 KiB at a time.
	req := &agent.ReadStreamRequest{ContainerId: p.containerID, ExecId: p.execID, MaxBytes: readStreamBytes}
	for {
		resp, err := read(ctx, req)
		if err != nil {
			if ctx.Err() == nil {
				log.G(ctx).WithError(err).WithField("exec", p.execID).Debug("output stream ended")
			}
			return
		}
		if len(resp.Data) > 0 {
			if _, err := w.Write(resp.Data); err != nil {
				log.G(ctx).WithError(err).Warn("write container output to its FIFO")
				return
			}
		}
		if resp.Eof {
			return
		}
	}
}

func (p *process) copyIn(ctx context.Context, ioc agent.IOService, ac agent.AgentService) {
	defer close(p.stdinDone)
	buf := make([]byte, 32<<10)
	for {
		n, err := p.stdin.Read(buf)
		if n > 0 {
			if _, werr := ioc.WriteStdin(ctx, &agent.WriteStdinRequest{
				ContainerId: p.containerID, ExecId: p.execID, Data: buf[:n],
			}); werr != nil {
				log.G(ctx).WithError(werr).Debug("stdin copy ended")
				return
			}
		}
		if err != nil {
			if err == io.EOF {
				// The client closed its end: pass that on.
				if _, err := ac.CloseStdin(ctx, &agent.ProcessRequest{ContainerId: p.containerID, ExecId: p.execID}); err == nil {
					p.stdinForwardedEOF.Store(true)
				}
			}
			return
		}
	}
}

// closeStdin ends stdin after whatever was written has been forwarded.
// containerd's client calls CloseIO once it has written everything and
// closed its end of the FIFO, so the copy normally ends on its own at EOF
// (and closes the guest's stdin then); closing the FIFO is the fallback
// for a client that keeps it open.
func (p *process) closeStdin(ctx context.Context, ac agent.AgentService) error {
	if p.stdin == nil {
		_, err := ac.CloseStdin(ctx, &agent.ProcessRequest{ContainerId: p.containerID, ExecId: p.execID})
		return err
	}
	select {
	case <-p.stdinDone:
	case <-time.After(stdinDrainTimeout):
		// The client keeps the FIFO open, or the guest does not take what
		// was written: end the copy, then close the guest's stdin, which
		// ends a write it has in progress.
		p.closeIO.Do(func() { p.stdin.Close() })
		if p.stopStdin != nil {
			p.stopStdin()
		}
		<-p.stdinDone
	}
	if p.stdinForwardedEOF.Load() {
		return nil
	}
	_, err := ac.CloseStdin(ctx, &agent.ProcessRequest{ContainerId: p.containerID, ExecId: p.execID})
	return err
}

// drainOutputs waits, within ioDrainTimeout, for the output copies to
// reach the end of the guest's streams, then ends whatever copy is left, so
// that containerd's FIFOs are closed: containerd finishes handling an exit
// only once they are (CRI's StopContainer and RemoveContainer wait for it),
// and something that still holds the stream open in the guest must not
// hold the container up on the host.
func (p *process) drainOutputs() {
	done := make(chan struct{})
	go func() { p.outputs.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(ioDrainTimeout):
	}
	if p.stopOutputs != nil {
		p.stopOutputs()
	}
	<-done
}

// releaseIO closes what startIO opened on the host side.
func (p *process) releaseIO() {
	if p.stopOutputs != nil {
		p.stopOutputs()
	}
	if p.stopStdin != nil {
		p.stopStdin()
	}
	if p.stdin != nil {
		p.closeIO.Do(func() { p.stdin.Close() })
	}
}

// Package task is the containerd task service (shim API v3) of c8s. One
// shim serves every container of a pod; the pod runs in one VM, and each
// call is carried to c8s-agent inside it. Errors are containerd errdefs
// inside the package and become gRPC status only at the ttrpc edge.
package task

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/protobuf"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/containerd/v2/pkg/stdio"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/layercache"
	adminapi "github.com/c8s-dev/c8s/shim/api/admin/v1"
)

var _ shim.TTRPCService = (*service)(nil)

type service struct {
	ctx       context.Context
	cancel    context.CancelFunc
	publisher shim.Publisher
	events    chan interface{}
	forwarded chan struct{} // closed once events is drained
	sd        shutdown.Service

	// eventsMu orders send against the close of events at shutdown;
	// eventsClosed says events is closed.
	eventsMu     sync.Mutex
	eventsClosed bool

	// host builds root disks and starts the pod VM (sandbox.go).
	host Host

	// startMu serializes pod VM start-up.
	startMu sync.Mutex
	// creating counts the Creates in flight, and creates cancels them
	// (stopCreates) when the shim shuts down under one still booting
	// the pod VM (Shutdown); closing refuses new ones meanwhile. Under mu.
	shutdownMu  sync.Mutex
	creating    sync.WaitGroup
	creates     context.Context
	stopCreates context.CancelFunc
	closing     bool
	mu          sync.Mutex
	sb          Sandbox
	pod         *podState
	conts       map[string]*container
	// trace follows the container that started the pod VM (trace.go).
	trace *podTrace
}

// New returns the task service. It is registered as the shim's "task"
// ttrpc plugin; containerd is containerd's gRPC address, where the
// service reads container images (layer mode).
func New(ctx context.Context, publisher shim.Publisher, sd shutdown.Service, containerd string) (taskAPI.TTRPCTaskService, error) {
	return newService(ctx, publisher, sd, hostVMs{address: containerd}), nil
}

// newService returns the task service running its pod VM on host.
func newService(ctx context.Context, publisher shim.Publisher, sd shutdown.Service, host Host) *service {
	ctx, cancel := context.WithCancel(ctx)
	s := &service{
		ctx:       ctx,
		cancel:    cancel,
		host:      host,
		publisher: publisher,
		events:    make(chan interface{}, 128),
		forwarded: make(chan struct{}),
		sd:        sd,
		conts:     map[string]*container{},
	}
	s.creates, s.stopCreates = context.WithCancel(context.Background())
	go s.forward()
	sd.RegisterCallback(func(ctx context.Context) error {
		s.stopSandbox(ctx)
		s.eventsMu.Lock()
		s.eventsClosed = true
		close(s.events)
		s.eventsMu.Unlock()
		// Publish what is queued (TaskDelete of the last container) before
		// the shim exits.
		select {
		case <-s.forwarded:
		case <-time.After(5 * time.Second):
			log.G(ctx).Warn("events not published before shutdown")
		}
		s.cancel()
		return nil
	})
	return s
}

// RegisterTTRPC registers the task service on the shim's server.
func (s *service) RegisterTTRPC(server *ttrpc.Server) error {
	taskAPI.RegisterTTRPCTaskService(server, s)
	adminapi.RegisterAdminService(server, admin{s})
	return nil
}

func (s *service) forward() {
	defer close(s.forwarded)
	ns, _ := namespaces.Namespace(s.ctx)
	ctx := namespaces.WithNamespace(context.WithoutCancel(s.ctx), ns)
	for e := range s.events {
		if err := s.publisher.Publish(ctx, runtime.GetTopic(e), e); err != nil {
			log.G(ctx).WithError(err).Error("publish event")
		}
	}
	s.publisher.Close()
}

// send queues e for publishing. Once shutdown has closed events, e is
// dropped: the shim is exiting. A send blocked on a full queue holds
// eventsMu until forward takes an event, so the close waits for it.
func (s *service) send(e interface{}) {
	s.eventsMu.Lock()
	defer s.eventsMu.Unlock()
	if s.eventsClosed {
		return
	}
	s.events <- e
}

func (s *service) get(id string) (*container, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.conts[id]
	if !ok {
		return nil, fmt.Errorf("container %q: %w", id, errdefs.ErrNotFound)
	}
	return c, nil
}

func (s *service) getProcess(id, execID string) (*container, *process, error) {
	c, err := s.get(id)
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := c.process(execID)
	return c, p, err
}

// podTrace returns the trace of the pod's start (nil before the VM runs).
func (s *service) podTrace() *podTrace {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.trace
}

func (s *service) sandbox() (Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sb == nil {
		return nil, fmt.Errorf("pod VM is not running: %w", errdefs.ErrFailedPrecondition)
	}
	return s.sb, nil
}

// beginCreate counts a Create in flight and returns its context, which a
// shutdown of the shim cancels, and done, which ends it.
func (s *service) beginCreate(ctx context.Context) (context.Context, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return nil, nil, fmt.Errorf("the shim is shutting down: %w", errdefs.ErrUnavailable)
	}
	s.creating.Add(1)
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.creates, cancel)
	return ctx, func() {
		stop()
		cancel()
		s.creating.Done()
	}, nil
}

// Create boots the pod VM on the pod's first container, attaches the
// container's root (its image layers or a copy, root.go) and creates its
// init process in the guest.
func (s *service) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (_ *taskAPI.CreateTaskResponse, retErr error) {
	if err := validID(r.ID); err != nil {
		return nil, err
	}
	ctx, done, err := s.beginCreate(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	// Kept (and logged) only if this container starts the pod VM.
	tr := newTrace()
	tr.container = r.ID
	s.mu.Lock()
	_, exists := s.conts[r.ID]
	s.mu.Unlock()
	if exists {
		return nil, fmt.Errorf("container %q: %w", r.ID, errdefs.ErrAlreadyExists)
	}
	specJSON, spec, err := readSpec(r.Bundle)
	if err != nil {
		return nil, err
	}
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	pod, err := s.podFor(ctx, ns, r, spec)
	if err != nil {
		return nil, err
	}
	if specJSON, err = s.withNodeUTS(r.ID, pod, specJSON, spec); err != nil {
		return nil, err
	}
	tr.mark("config")

	// What `shim delete` undoes if the shim dies from here on, before
	// anything is made: a copied root disk, the pod's layer references.
	pre := BundleState{Sandbox: pod.id, StateDir: pod.stateDir, Disk: copyDiskPath(pod, r.ID), NetNS: pod.netns}
	if ref, err := layercache.PodRef(ns, pod.id, pod.stateDir); err == nil && pod.cfg.Runtime.Rootfs != config.RootfsCopy {
		pre.LayerCache, pre.LayerRef = pod.cfg.LayerCachePath(), ref.Name
	}
	if err := writeBundleState(r.Bundle, pre); err != nil {
		return nil, err
	}
	t0 := time.Now()
	root, err := s.prepareRoot(ctx, pod, ns, r)
	if err != nil {
		return nil, err
	}
	// attached is the VM the root went into, if this call did not start
	// it (one it started goes with its disks).
	var attached Machine
	defer func() {
		if retErr != nil {
			s.releaseRoot(context.WithoutCancel(ctx), pod, attached, r.ID, root)
		}
	}()
	st := BundleState{Sandbox: pod.id, StateDir: pod.stateDir, Disk: root.disk.Path, NetNS: pod.netns}
	if root.layered {
		st.LayerCache, st.LayerRef = pod.cfg.LayerCachePath(), pod.heldLayers().RefName()
	}
	if err := writeBundleState(r.Bundle, st); err != nil {
		return nil, err
	}
	tr.mark("rootfs")

	sb, started, err := s.ensureSandbox(ctx, pod, root.bootDisks(), tr)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil && started {
			s.stopSandbox(context.WithoutCancel(ctx))
		}
	}()
	if !started {
		attached = sb
	}
	rootfs, err := s.attachRoot(ctx, pod, sb, r.ID, root)
	if err != nil {
		return nil, err
	}

	files := sharedFiles(ctx, spec)
	shared, err := s.shareMounts(ctx, pod, r.ID, spec, files)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			s.unshare(context.WithoutCancel(ctx), pod, r.ID)
		}
	}()
	tr.mark("attach")
	io := stdio.Stdio{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal}
	init := newProcess(r.ID, "", io, nil)
	resp, err := sb.Agent().CreateContainer(ctx, &agent.CreateContainerRequest{
		ContainerId:  r.ID,
		Spec:         specJSON,
		Rootfs:       rootfs,
		Stdio:        init.agentStdio(),
		Files:        files,
		SandboxId:    pod.id,
		Network:      podNetworkFor(started, pod),
		SharedMounts: shared,
	})
	if err != nil {
		// Without the agent's answer (containerd's deadline, the
		// connection lost) the guest may have made it: its root goes
		// below, so it goes too. A refusal made nothing.
		if !refused(err) {
			if _, rerr := sb.Agent().RemoveContainer(context.WithoutCancel(ctx), &agent.RemoveContainerRequest{ContainerId: r.ID}); rerr != nil && !errdefs.IsNotFound(fromAgent(rerr)) {
				log.G(ctx).WithError(rerr).WithField("container", r.ID).Warn("remove the container a failed create may have left in the pod VM")
			}
		}
		return nil, fmt.Errorf("create container %q in the pod VM: %w", r.ID, fromAgent(err))
	}
	log.G(ctx).WithField("container", r.ID).WithField("took", time.Since(t0).Round(time.Millisecond)).Info("container created in the pod VM")
	c := &container{id: r.ID, bundle: r.Bundle, root: root, init: init, execs: map[string]*process{}, hostPid: criHostPid(spec, sb.Pid())}
	pid := c.reported(resp.Pid)
	init.mu.Lock()
	init.pid = pid
	init.mu.Unlock()
	if err := init.startIO(s.ctx, sb.IO(), sb.Agent()); err != nil {
		sb.Agent().RemoveContainer(context.WithoutCancel(ctx), &agent.RemoveContainerRequest{ContainerId: r.ID})
		return nil, fmt.Errorf("open the stdio FIFOs of container %q: %w", r.ID, err)
	}

	s.mu.Lock()
	s.conts[r.ID] = c
	s.mu.Unlock()
	// A created init can exit before it is started: killed (containerd's
	// Kill or Delete WithProcessKill of a task never started), or its VM
	// lost. Its exit is published like any other.
	go s.wait(sb, init)
	tr.mark("create")

	s.send(&eventstypes.TaskCreate{
		ContainerID: r.ID,
		Bundle:      r.Bundle,
		Rootfs:      r.Rootfs,
		IO:          &eventstypes.TaskIO{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal},
		Checkpoint:  r.Checkpoint,
		Pid:         pid,
	})
	return &taskAPI.CreateTaskResponse{Pid: pid}, nil
}

// Start starts a container's init process or an exec added by Exec.
func (s *service) Start(ctx context.Context, r *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	c, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	sb, err := s.sandbox()
	if err != nil {
		return nil, err
	}
	if st, _, _, _ := p.state(); st != task.Status_CREATED {
		return nil, fmt.Errorf("process %q of %q is %s: %w", r.ExecID, r.ID, st, errdefs.ErrFailedPrecondition)
	}
	var pid uint32
	if r.ExecID == "" {
		tr := s.podTrace()
		tr.markFor(r.ID, "create_to_start")
		resp, err := sb.Agent().StartContainer(ctx, &agent.StartContainerRequest{ContainerId: r.ID})
		if err != nil {
			return nil, fmt.Errorf("start container %q: %w", r.ID, fromAgent(err))
		}
		tr.markFor(r.ID, "start")
		pid = c.reported(resp.Pid)
	} else {
		// The agent buffers the exec's output from its start, so the copies
		// can begin once it exists.
		resp, err := sb.Agent().ExecProcess(ctx, &agent.ExecProcessRequest{
			ContainerId: r.ID, ExecId: r.ExecID, Process: p.spec, Stdio: p.agentStdio(),
		})
		if err != nil {
			return nil, fmt.Errorf("exec %q in container %q: %w", r.ExecID, r.ID, fromAgent(err))
		}
		if err := p.startIO(s.ctx, sb.IO(), sb.Agent()); err != nil {
			sb.Agent().SignalProcess(ctx, &agent.SignalProcessRequest{ContainerId: r.ID, ExecId: r.ExecID, Signal: 9})
			return nil, fmt.Errorf("open the stdio FIFOs of exec %q: %w", r.ExecID, err)
		}
		pid = c.reported(resp.Pid)
	}
	p.setRunning(pid)
	if r.ExecID != "" {
		go s.wait(sb, p) // an init's waiter runs from its Create on
	}
	if r.ExecID == "" {
		s.send(&eventstypes.TaskStart{ContainerID: c.id, Pid: pid})
	} else {
		s.send(&eventstypes.TaskExecStarted{ContainerID: c.id, ExecID: r.ExecID, Pid: pid})
	}
	return &taskAPI.StartResponse{Pid: pid}, nil
}

// wait follows a started process until the guest reports its exit.
func (s *service) wait(sb Sandbox, p *process) {
	resp, err := sb.Agent().WaitProcess(s.ctx, &agent.ProcessRequest{ContainerId: p.containerID, ExecId: p.execID})
	if err != nil {
		// The VM is gone or the shim is shutting down; watchSandbox reports
		// exits of a lost VM.
		select {
		case <-sb.Done():
		case <-s.ctx.Done():
		}
		s.exited(p, exitStatusVMLost, time.Now())
		return
	}
	at := time.Now()
	if resp.ExitedAt != nil {
		at = resp.ExitedAt.AsTime()
	}
	if resp.OomKilled && !p.hasExited() {
		// As runc's shim does: CRI then reports reason OOMKilled.
		s.send(&eventstypes.TaskOOM{ContainerID: p.containerID})
	}
	s.exited(p, resp.ExitStatus, at)
}

// exited records an exit once, after the process's output has been copied,
// and publishes TaskExit.
func (s *service) exited(p *process, status uint32, at time.Time) {
	if p.hasExited() {
		return
	}
	p.drainOutputs()
	if !p.setExited(status, at) {
		return
	}
	if p.execID == "" {
		s.podTrace().markFor(p.containerID, "run")
	}
	_, pid, _, _ := p.state()
	id := p.execID
	if id == "" {
		id = p.containerID
	}
	s.send(&eventstypes.TaskExit{
		ContainerID: p.containerID,
		ID:          id,
		Pid:         pid,
		ExitStatus:  status,
		ExitedAt:    protobuf.ToTimestamp(at),
	})
}

// Delete removes an exited exec, or a container with its root (the
// layers no other container of the pod uses, or its copy). The pod VM
// goes away with its last container.
func (s *service) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	c, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	st, pid, status, at := p.state()
	if st == task.Status_RUNNING {
		return nil, fmt.Errorf("process %q of container %q is running: %w", r.ExecID, r.ID, errdefs.ErrFailedPrecondition)
	}
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	if r.ExecID == "" {
		s.podTrace().markFor(r.ID, "exit_to_delete")
	}
	if r.ExecID != "" {
		if sb != nil && st == task.Status_STOPPED {
			if _, err := sb.Agent().DeleteProcess(ctx, &agent.ProcessRequest{ContainerId: r.ID, ExecId: r.ExecID}); err != nil && !vmGone(sb) {
				log.G(ctx).WithError(err).Warn("release exec in the guest")
			}
		}
		p.releaseIO()
		s.mu.Lock()
		delete(c.execs, r.ExecID)
		s.mu.Unlock()
		return &taskAPI.DeleteResponse{Pid: pid, ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at)}, nil
	}

	if st == task.Status_CREATED {
		// Never started: removing it below kills it in the guest, and
		// its waiter must not publish that exit after TaskDelete.
		at = time.Now()
		p.setExited(status, at)
	}
	s.mu.Lock()
	last := len(s.conts) == 1
	s.mu.Unlock()
	// The pod's last container goes with its VM: nothing in the guest needs
	// undoing first.
	var attached Machine
	if sb != nil && !vmGone(sb) && !last {
		if _, err := sb.Agent().RemoveContainer(ctx, &agent.RemoveContainerRequest{ContainerId: r.ID}); err != nil && !vmGone(sb) {
			return nil, fmt.Errorf("remove container %q from the pod VM: %w", r.ID, fromAgent(err))
		}
		attached = sb
	}
	c.init.releaseIO()
	for _, e := range c.execs {
		e.releaseIO()
	}
	s.releaseRoot(ctx, s.pod, attached, r.ID, c.root)
	s.unshare(ctx, s.pod, r.ID)
	s.mu.Lock()
	delete(s.conts, r.ID)
	last = len(s.conts) == 0
	s.mu.Unlock()
	if last {
		s.stopSandbox(ctx)
	}
	s.send(&eventstypes.TaskDelete{ContainerID: r.ID, Pid: pid, ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at)})
	return &taskAPI.DeleteResponse{Pid: pid, ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at)}, nil
}

func readSpec(bundle string) ([]byte, *specs.Spec, error) {
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, nil, fmt.Errorf("read the OCI spec of the bundle: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, nil, fmt.Errorf("parse %s: %w: %w", filepath.Join(bundle, "config.json"), err, errdefs.ErrInvalidArgument)
	}
	return data, &spec, nil
}

func validID(id string) error {
	if id == "" || id != filepath.Base(id) || id == "." || id == ".." {
		return fmt.Errorf("container id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// diskID names a container's root disk in QEMU. QEMU ids are limited in
// length and characters, so long container ids are shortened.
func diskID(id string) string {
	if len(id) > 24 {
		id = id[:24]
	}
	return "rootfs-" + id
}

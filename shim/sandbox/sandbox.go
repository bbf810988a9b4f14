// Package sandbox runs the pod VM behind one shim: it boots the VM through
// the launcher, connects to c8s-agent inside it over ttrpc (one
// connection carrying every agent service), and attaches the containers'
// root disks.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/launcher/vm/accel"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
	"github.com/c8s-dev/c8s/shim/portfwd"
)

// DefaultAgentTimeout bounds how long Start waits for the agent to answer
// after QEMU has started. TCG boots take seconds; this leaves room for a
// loaded node without hiding a guest that never comes up.
const DefaultAgentTimeout = 60 * time.Second

// Options describe the pod VM to start.
type Options struct {
	// ID is the sandbox id: the pod's sandbox id, or the container id of a
	// container that has none.
	ID string
	// StateDir is the VM's own directory (sockets, console log, pid file),
	// named with launcher/config/statedir; Start creates it and Stop removes it.
	StateDir string
	// Config is the node configuration with the pod's annotations applied.
	Config config.Config
	// Disks are attached at boot.
	Disks []vm.Disk
	// AgentTimeout overrides DefaultAgentTimeout.
	AgentTimeout time.Duration
	// InitData is the pod's init data (guest/api/initdata); its digest is
	// measured into the VM at launch (HOST_DATA).
	InitData []byte
	// NICs wire the VM to the pod's network (shim/podnet).
	NICs []vm.NetDevice
	// SharedFS is the pod's virtio-fs share (shim/sharedfs), if any.
	SharedFS *vm.SharedFS
	// PortForward mirrors the ports the pod listens on for CRI
	// port-forward (shim/portfwd) into NetNS, the pod's network namespace
	// on the host, or with NetNS "" onto the loopback of the shim's own
	// (a host-network pod's: the node's).
	PortForward bool
	NetNS       string
	// VFIO are the pod's host devices (its confidential GPUs), cold-plugged
	// at boot (launcher/vm, vfio.go).
	VFIO []vm.VFIODevice
}

// Sandbox is a running pod VM and its agent connection.
//
// Agent and IO follow the VM when it migrates (see migrate.go): a call
// that the move cut off is retried on the destination.
type Sandbox struct {
	ID    string
	Agent agent.AgentService
	IO    agent.IOService
	Info  *agent.GetInfoResponse

	initData []byte

	// mu guards vm, cur, epoch, moving, stopHost and exitErr: a
	// migration replaces them.
	mu       sync.Mutex
	vm       machine
	cur      *agentConn
	epoch    uint64
	moving   chan struct{} // closed when the running migration ends
	stopHost context.CancelFunc
	done     chan struct{} // closed when the pod's VM, wherever it runs, exits
	exitErr  error
	migMu    sync.Mutex // one migration at a time
	// movedChip is the chip the pod runs on after a migration (nil
	// before): re-attestation then trusts the pool's roots.
	movedChip []byte
	// handoffDir is the source state dir holding migrate.HandoffFile.
	handoffDir string
	progress   progressState

	// forward mirrors the pod's ports for CRI port-forward (nil without
	// a pod network namespace).
	forward *portfwd.Forwarder

	stopOnce sync.Once
	stopErr  error

	// boot is how Start went, for the pod's start trace.
	boot BootTimes
}

// Start boots the pod VM and waits until its agent answers. On error
// nothing is left behind.
func Start(ctx context.Context, opts Options) (_ *Sandbox, retErr error) {
	tBegin := time.Now()
	cfg := opts.Config
	h := cfg.Hypervisor
	qemu, err := h.QEMUBinary()
	if err != nil {
		return nil, err
	}
	choice, err := accel.Choose(ctx, h.Accel, qemu, h.Kernel, cfg.CachePath())
	if err != nil {
		return nil, fmt.Errorf("choose accelerator: %w", err)
	}
	root, err := vm.RootFor(&cfg)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	// The VM's state dir records the pod's namespace (the one the
	// shim's request carries) and ID in full: its name may be shortened.
	ns, _ := namespaces.Namespace(ctx)
	spec := VMSpec(opts, root, choice.Accel, ns)
	// The sim TEE's secure processor is simulated on the host: it
	// measures the files QEMU is handed and serves the VM's reports.
	// Hardware TEEs need no host part (the guest talks to the real one).
	// The measurement (hashing the kernel and initrd) runs while QEMU
	// starts: the guest asks for a report only once it has booted, and
	// its request waits on the port until the secure processor attaches.
	var sims *simStart
	if h.TEE == "sim" {
		argv, err := vm.Args(spec, sim.Backend{})
		if err != nil {
			return nil, err
		}
		sims = startSimHost(argv, statedir.SimSP(cfg.Runtime.StateDir), initdata.Digest(opts.InitData))
	}
	tSpawn := time.Now()
	v, err := vm.Start(ctx, spec)
	if err != nil {
		sims.wait()
		return nil, fmt.Errorf("start pod VM: %w", err)
	}
	tSpawned := time.Now()
	hostCtx, stopHost := context.WithCancel(context.WithoutCancel(ctx))
	s := &Sandbox{ID: opts.ID, vm: v, stopHost: stopHost, initData: opts.InitData, done: make(chan struct{})}
	s.Agent, s.IO = movingAgent{s}, movingIO{s}
	go s.follow()
	defer func() {
		if retErr != nil {
			s.Stop(context.WithoutCancel(ctx))
		}
	}()
	if sims != nil {
		simHost, err := sims.wait()
		if err != nil {
			return nil, err
		}
		if err := simHost.Attach(hostCtx, v); err != nil {
			return nil, fmt.Errorf("start the host side of TEE %s: %w", h.TEE, err)
		}
	}
	if err := startKBSRelay(hostCtx, v, opts.InitData); err != nil {
		return nil, err
	}
	// `shim delete` uses the pid file to stop a VM whose shim died.
	if err := os.WriteFile(filepath.Join(v.StateDir(), statedir.PidFile), []byte(fmt.Sprint(v.Pid())), 0o600); err != nil {
		return nil, fmt.Errorf("record QEMU pid: %w", err)
	}
	tQEMU := time.Since(t0)
	tHost := time.Now()
	timeout := opts.AgentTimeout
	if timeout == 0 {
		timeout = DefaultAgentTimeout
	}
	if err := s.connect(ctx, timeout); err != nil {
		return nil, err
	}
	s.boot = BootTimes{
		Prepare:    tSpawn.Sub(tBegin),
		Spawn:      tSpawned.Sub(tSpawn),
		HostSide:   tHost.Sub(tSpawned),
		AgentReady: time.Since(tSpawn),
		Guest:      readGuestBoot(v.ConsolePath()),
	}
	if opts.PortForward {
		s.forward = portfwd.Start(hostCtx, opts.NetNS, movingPortForward{s})
	}
	log.G(ctx).WithFields(log.Fields{
		"sandbox": opts.ID, "accel": choice.Accel, "qemu_pid": v.Pid(),
		"guest_kernel": s.Info.KernelRelease, "channel": s.Info.Channel,
		"qemu_ready": tQEMU.Round(time.Millisecond), "agent_ready": time.Since(t0).Round(time.Millisecond),
	}).Info("pod VM is up")
	return s, nil
}

// connect dials the agent channel and waits for GetInfo to answer. Over
// virtio-serial the host side of the channel accepts before the guest has
// opened its port; a request sent early waits in the channel, so each
// attempt is short and retried until the deadline.
//
// timeout counts the time QEMU could run (bootwait.go), so that a node
// starting many pods at once does not fail the ones its CPUs are slow to.
func (s *Sandbox) connect(ctx context.Context, timeout time.Duration) error {
	m := s.machine()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go newBootClock("/proc", m.Pid()).watch(ctx, cancel, timeout, 250*time.Millisecond)
	c, info, err := dialAgent(ctx, m, bootWaitCap*timeout)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
			return fmt.Errorf("%w (%v)", cause, err)
		}
		return err
	}
	s.mu.Lock()
	s.cur = c
	s.mu.Unlock()
	s.Info = info
	return nil
}

// dialAgent dials m's agent channel and waits for GetInfo to answer.
func dialAgent(ctx context.Context, m machine, timeout time.Duration) (*agentConn, *agent.GetInfoResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var conn net.Conn
	for {
		c, err := m.DialAgent(ctx)
		if err == nil {
			conn = c
			break
		}
		if werr := waitRetry(ctx, m, 50*time.Millisecond); werr != nil {
			return nil, nil, fmt.Errorf("connect to the guest agent: %w (last dial error: %v)", werr, err)
		}
	}
	c := newAgentConn(conn)
	for {
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		info, err := c.agent.GetInfo(actx, &agent.GetInfoRequest{})
		acancel()
		if err == nil {
			return c, info, nil
		}
		if werr := waitRetry(ctx, m, 0); werr != nil {
			c.client.Close()
			return nil, nil, fmt.Errorf("the guest agent did not answer: %w (last error: %v)", werr, err)
		}
	}
}

// waitRetry waits d before another attempt, and reports why not to retry:
// the VM died, or the deadline passed.
func waitRetry(ctx context.Context, m machine, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-m.Done():
		return fmt.Errorf("QEMU exited during boot: %v%s", m.Err(), consoleTail(m))
	case <-ctx.Done():
		return fmt.Errorf("no answer from the guest agent: %w%s", ctx.Err(), consoleTail(m))
	case <-t.C:
		return nil
	}
}

// consoleTail returns the end of the guest console log, for errors.
func consoleTail(m machine) string {
	data, err := os.ReadFile(m.ConsolePath())
	if err != nil || len(data) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return "\nguest console (last lines):\n" + strings.Join(lines, "\n")
}

// AttachDisk makes d visible to the guest and returns where: disks given at
// boot are already there, others are hot-plugged.
func (s *Sandbox) AttachDisk(ctx context.Context, d vm.Disk) (vm.DiskAddress, error) {
	m := s.machine()
	if addr, ok := m.DiskAddress(d.ID); ok {
		return addr, nil
	}
	return m.AddDisk(ctx, d)
}

// DetachDisk unplugs a disk. A VM that is gone has no disks to unplug.
func (s *Sandbox) DetachDisk(ctx context.Context, id string) error {
	select {
	case <-s.done:
		return nil
	default:
	}
	return s.machine().RemoveDisk(ctx, id)
}

// Done is closed when the VM has exited (wherever it runs after a
// migration; the source VM's end after a migration does not count).
func (s *Sandbox) Done() <-chan struct{} { return s.done }

// Err says why the VM exited.
func (s *Sandbox) Err() error {
	select {
	case <-s.done:
	default:
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exitErr
}

// Pid is a live host process that stands for the pod: its QEMU, or once
// the pod moved to another node, this shim, which manages it there (that
// node's QEMU pid names nothing here, or another process; the exited
// local QEMU's may be reused). Killing either ends the pod.
func (s *Sandbox) Pid() int {
	if m, local := s.machine().(*vm.VM); local {
		return m.Pid()
	}
	return os.Getpid()
}

// follow closes done when the current machine exits.
func (s *Sandbox) follow() {
	for {
		m := s.machine()
		<-m.Done()
		s.mu.Lock()
		if s.vm != m {
			// The pod moved; the old VM's end is the source's teardown.
			s.mu.Unlock()
			continue
		}
		s.exitErr = m.Err()
		s.mu.Unlock()
		close(s.done)
		return
	}
}

// Stop closes the agent connection and tears the VM down, removing its
// sockets and state dir. It is idempotent.
func (s *Sandbox) Stop(ctx context.Context) error {
	s.stopOnce.Do(func() {
		var errs []error
		s.mu.Lock()
		stopHost, cur, m, handoffDir := s.stopHost, s.cur, s.vm, s.handoffDir
		s.mu.Unlock()
		if stopHost != nil {
			stopHost()
		}
		if s.forward != nil {
			s.forward.Close()
		}
		if cur != nil {
			if err := cur.client.Close(); err != nil && !errors.Is(err, ttrpc.ErrClosed) {
				errs = append(errs, err)
			}
		}
		if err := m.Stop(ctx); err != nil {
			errs = append(errs, err)
		} else if handoffDir != "" {
			if err := os.RemoveAll(handoffDir); err != nil {
				errs = append(errs, err)
			}
		}
		s.stopErr = errors.Join(errs...)
	})
	return s.stopErr
}

// simStart is the sim TEE's host part being measured in the background.
type simStart struct {
	done chan struct{}
	host *sim.Host
	err  error
}

func startSimHost(argv []string, spDir string, hostData [32]byte) *simStart {
	st := &simStart{done: make(chan struct{})}
	go func() {
		defer close(st.done)
		st.host, st.err = sim.NewHost(argv, spDir, hostData)
	}()
	return st
}

// wait returns the measured host part (a nil simStart waits for nothing).
func (st *simStart) wait() (*sim.Host, error) {
	if st == nil {
		return nil, nil
	}
	<-st.done
	return st.host, st.err
}

// VMSpec is the VM Start launches for opts, with the resolved root disk,
// accelerator and the pod's containerd namespace.
func VMSpec(opts Options, root *vm.RootDisk, accel, namespace string) vm.Spec {
	return vm.Spec{
		Root:      root,
		ID:        opts.ID,
		StateDir:  opts.StateDir,
		Namespace: namespace,
		// A shim killed mid-create takes its VM with it (vm.Spec).
		DieWithParent: true,
		Hypervisor:    opts.Config.Hypervisor,
		Accel:         accel,
		Disks:         opts.Disks,
		NICs:          opts.NICs,
		SharedFS:      opts.SharedFS,
		VFIO:          opts.VFIO,
	}
}

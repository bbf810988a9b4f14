// Package vm builds the QEMU command line for one pod VM and runs it: start,
// wait for QMP, connect to the guest agent, hotplug disks, and stop without
// leaving anything behind.
//
// The VM is a q35 machine booted directly from the configured kernel and
// initrd, with a virtio-scsi controller (scsi0) for disks, virtio-rng, the
// serial console in <StateDir>/console.log and QMP on <StateDir>/qmp.sock.
// The guest agent channel is a virtio-serial port named c8s.agent backed by
// <StateDir>/agent.sock, or vhost-vsock (port 1024) where the host has
// /dev/vhost-vsock; DialAgent hides which.
package vm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/internal/child"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/vm/tee"

	// The sim TEE's backend lives with the rest of its host side and
	// registers itself; every user of vm can start a sim VM.
	_ "github.com/c8s-dev/c8s/launcher/vm/tee/sim"
)

// Timeouts. Start's QMP wait is bounded by its context only.
const (
	// qmpTimeout bounds Start's wait for QMP when ctx has no deadline.
	qmpTimeout = 30 * time.Second
	// stopGrace is how long Stop waits after QMP quit before SIGKILL.
	stopGrace = 3 * time.Second
	// stderrLines is how many lines of QEMU's stderr errors carry.
	stderrLines = 20
)

// vhostVsockDevice enables vsock for the agent channel when present (a
// variable so tests can force virtio-serial).
var vhostVsockDevice = "/dev/vhost-vsock"

// VM is one running QEMU process.
type VM struct {
	spec   Spec
	argv   []string
	cmd    *exec.Cmd
	output *tailBuffer
	qmp    *QMP

	done    chan struct{}
	waitErr error // cmd.Wait's result, set before done is closed
	exitErr error // waitErr explained, set before done is closed

	stopMu   sync.Mutex // serialises Stop
	mu       sync.Mutex
	stopping bool // Stop has asked QEMU to quit
	killSent bool // kill sent SIGKILL
	stopped  bool
	stopErr  error
	disks    map[string]DiskAddress
	targets  map[int]string
	hotDisks map[string]Disk // hot-plugged disks, for MigrationSpec
	resized  resizeState     // hot-plugged vCPUs and memory (resize.go)
	resizeMu sync.Mutex      // serialises GrowVCPUs and GrowMemory
}

// Start starts QEMU for spec and returns once its QMP socket answers. On
// failure the error carries the tail of QEMU's stderr and nothing is left
// behind: the process is killed and StateDir removed.
func Start(ctx context.Context, spec Spec) (*VM, error) {
	backend, err := tee.Lookup(spec.Hypervisor.TEE)
	if err != nil {
		return nil, err
	}
	qemu, err := spec.Hypervisor.QEMUBinary()
	if err != nil {
		return nil, err
	}
	for _, f := range []struct{ key, path string }{{"hypervisor.kernel", spec.Hypervisor.Kernel}, {"hypervisor.initrd", spec.Hypervisor.Initrd}} {
		if _, err := os.Stat(f.path); err != nil {
			return nil, fmt.Errorf("vm: %s: %w (run `make image` or fix the path)", f.key, err)
		}
	}
	pieces, err := backend.QEMU(spec.Hypervisor)
	if err != nil {
		return nil, err
	}
	if err := CheckQEMUFeatures(ctx, qemu, pieces.QOMTypes); err != nil {
		return nil, err
	}

	useVsock := spec.VsockCID == 0 && !spec.Incoming && exists(vhostVsockDevice)
	attempts := 1
	if useVsock {
		attempts = 5 // a random CID may already be taken by another VM
	}
	for i := 0; ; i++ {
		s := spec
		if useVsock {
			s.VsockCID = 3 + rand.Uint32N(1<<31)
		}
		v, err := start(ctx, qemu, s, backend)
		if err == nil || i+1 >= attempts || !errors.Is(err, ErrVsockCIDInUse) {
			return v, err
		}
		log.G(ctx).WithError(err).Debug("vsock CID in use, retrying with another")
	}
}

func start(ctx context.Context, qemu string, spec Spec, backend tee.Backend) (_ *VM, err error) {
	argv, err := Args(spec, backend)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(spec.StateDir), 0o700); err != nil {
		return nil, fmt.Errorf("vm: creating state dir parent: %w", err)
	}
	if err := os.Mkdir(spec.StateDir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("vm: state dir %s already exists: is a VM with ID %q running? Remove it if not", spec.StateDir, spec.ID)
		}
		return nil, fmt.Errorf("vm: creating state dir: %w", err)
	}
	if err := statedir.WriteIndex(spec.StateDir, statedir.Index{Namespace: spec.Namespace, ID: spec.ID}); err != nil {
		os.RemoveAll(spec.StateDir)
		return nil, fmt.Errorf("vm: %w", err)
	}

	v := &VM{
		spec:     spec,
		argv:     argv,
		output:   newTailBuffer(64 << 10),
		done:     make(chan struct{}),
		disks:    map[string]DiskAddress{},
		targets:  map[int]string{},
		hotDisks: map[string]Disk{},
	}
	for i, d := range spec.Disks {
		v.disks[d.ID] = DiskAddress{Target: i}
		v.targets[i] = d.ID
	}
	v.cmd = exec.Command(qemu, argv[1:]...)
	v.cmd.Args[0] = argv[0]
	v.cmd.Stdout = v.output
	v.cmd.Stderr = v.output
	v.cmd.Dir = spec.StateDir
	v.cmd.ExtraFiles = netFiles(spec.NICs)
	if err := child.Start(v.cmd, spec.DieWithParent, v.supervise); err != nil {
		os.RemoveAll(spec.StateDir)
		return nil, fmt.Errorf("vm: starting %s: %w", qemu, err)
	}

	defer func() {
		if err != nil {
			v.kill()
			<-v.done
			if v.qmp != nil {
				v.qmp.close()
			}
			os.RemoveAll(spec.StateDir)
		}
	}()
	qctx := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		qctx, cancel = context.WithTimeout(ctx, qmpTimeout)
		defer cancel()
	}
	if err := v.connectQMP(qctx); err != nil {
		return nil, err
	}
	log.G(ctx).WithField("pid", v.Pid()).WithField("accel", spec.Accel).WithField("tee", backend.Name()).Debug("vm started")
	return v, nil
}

// connectQMP waits for the QMP socket and connects to it.
func (v *VM) connectQMP(ctx context.Context) error {
	sock := filepath.Join(v.spec.StateDir, QMPSocketName)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-v.done:
			return fmt.Errorf("vm: qemu exited before QMP was ready: %w", v.exitErr)
		case <-ctx.Done():
			return fmt.Errorf("vm: waiting for QMP: %w; qemu output:\n%s", ctx.Err(), v.output.Tail(stderrLines))
		case <-tick.C:
		}
		if !exists(sock) {
			continue
		}
		q, err := dialQMP(ctx, sock)
		if err != nil {
			// The socket file appears before QEMU listens on it.
			continue
		}
		if err := q.Execute(ctx, "query-status", nil, nil); err != nil {
			q.close()
			return fmt.Errorf("vm: query-status: %w", err)
		}
		v.qmp = q
		return nil
	}
}

// supervise reaps QEMU and records why it exited.
func (v *VM) supervise() {
	v.waitErr = v.cmd.Wait()
	v.exitErr = v.describeExit(v.waitErr)
	close(v.done)
}

func (v *VM) describeExit(err error) *ExitError {
	how := "exited with status 0 (the guest shut down, rebooted or panicked)"
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			how = fmt.Sprintf("was killed by signal %v", ws.Signal())
		} else {
			how = fmt.Sprintf("exited with status %d", ee.ExitCode())
		}
	} else if err != nil {
		how = err.Error()
	}
	return &ExitError{
		Pid:     v.cmd.Process.Pid,
		How:     how,
		Stderr:  v.output.Tail(stderrLines),
		Console: fileTail(filepath.Join(v.spec.StateDir, ConsoleLogName), stderrLines),
	}
}

// Pid is QEMU's process ID (also its process group ID).
func (v *VM) Pid() int { return v.cmd.Process.Pid }

// Done is closed once QEMU has exited and been reaped.
func (v *VM) Done() <-chan struct{} { return v.done }

// Err says why QEMU exited; valid after Done is closed. It is nil when the
// VM was stopped with Stop (QEMU quit cleanly or was killed by Stop).
func (v *VM) Err() error {
	select {
	case <-v.done:
	default:
		return nil
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.stopping && (v.waitErr == nil || (v.killSent && killedBySIGKILL(v.waitErr))) {
		return nil
	}
	return v.exitErr
}

func killedBySIGKILL(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// Argv is the QEMU command line the VM runs with.
func (v *VM) Argv() []string { return append([]string(nil), v.argv...) }

// StateDir is the VM's state directory.
func (v *VM) StateDir() string { return v.spec.StateDir }

// ConsolePath is the file receiving the guest's serial console.
func (v *VM) ConsolePath() string { return filepath.Join(v.spec.StateDir, ConsoleLogName) }

// QMP gives typed access to the VM's monitor.
func (v *VM) QMP() *QMP { return v.qmp }

// Stop shuts QEMU down (QMP quit, SIGKILL after a short grace), waits for
// it, and removes the sockets and the state directory. It is idempotent and
// safe to call after QEMU died on its own.
func (v *VM) Stop(ctx context.Context) error {
	v.stopMu.Lock()
	defer v.stopMu.Unlock()
	v.mu.Lock()
	if v.stopped {
		err := v.stopErr
		v.mu.Unlock()
		return err
	}
	v.stopping = true
	v.mu.Unlock()

	select {
	case <-v.done:
	default:
		qctx, cancel := context.WithTimeout(ctx, stopGrace)
		if err := v.qmp.Execute(qctx, "quit", nil, nil); err != nil {
			log.G(ctx).WithError(err).Debug("qmp quit failed, killing qemu")
		}
		select {
		case <-v.done:
		case <-qctx.Done():
		}
		cancel()
		v.kill()
		<-v.done
	}
	v.qmp.close()
	err := os.RemoveAll(v.spec.StateDir)
	if err != nil {
		err = fmt.Errorf("vm: removing state dir: %w", err)
	}
	v.mu.Lock()
	v.stopped = true
	v.stopErr = err
	v.mu.Unlock()
	return err
}

// kill sends SIGKILL to QEMU's process group (QEMU is its leader).
func (v *VM) kill() {
	select {
	case <-v.done:
		return
	default:
	}
	v.mu.Lock()
	v.killSent = true
	v.mu.Unlock()
	if err := syscall.Kill(-v.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		_ = v.cmd.Process.Kill()
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

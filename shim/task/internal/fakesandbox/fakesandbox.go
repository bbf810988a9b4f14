// Package fakesandbox is a pod VM for the task service's unit tests: a
// Host whose root disks are empty files and whose VMs are in memory, with
// a guest agent that keeps containers and processes as c8s-agent does. A
// test makes processes exit (Exit), the VM die (Die) and any call fail
// (Fail), and reads back what the service asked for (Calls).
//
// Host and *Sandbox have the methods of shim/task's Host and Sandbox
// interfaces; Host.Start returns the concrete *Sandbox, so the test wraps
// it to return the interface (this package cannot import shim/task, whose
// tests import it).
package fakesandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs/pkg/errgrpc"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/migrate"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/shim/sandbox"
)

// QEMUPid is the host pid of every fake VM.
const QEMUPid = 4242

// ErrConnClosed is what agent calls return once the VM is gone, as the
// ttrpc client does when its connection drops.
var ErrConnClosed = errors.New("ttrpc: closed")

// Host builds root disks and starts fake VMs.
type Host struct {
	mu       sync.Mutex
	next     *Sandbox
	started  []*Sandbox
	failures map[string]error
	built    []string
	removed  []string
	// images are containerd's (images.go); conversions counts
	// ConvertLayer's calls.
	images      *Images
	conversions int
}

// NewHost returns a Host.
func NewHost() *Host { return &Host{failures: map[string]error{}, images: NewImages()} }

// Next returns the Sandbox that the next Start returns, so that a test can
// set it up (Fail, SetSize, ...) before the service starts it.
func (h *Host) Next() *Sandbox {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.next == nil {
		h.next = newSandbox()
	}
	return h.next
}

// Fail makes every later call of method ("BuildRootfs", "StartSandbox")
// fail with err; a nil err makes it succeed again.
func (h *Host) Fail(method string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failures[method] = err
}

// BuildRootfs writes an empty image.
func (h *Host) BuildRootfs(_ context.Context, _ []mount.Mount, _, image string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.failures["BuildRootfs"]; err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(image), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		return err
	}
	h.built = append(h.built, image)
	return nil
}

// RemoveRootfs deletes an image; a missing one is not an error.
func (h *Host) RemoveRootfs(image string) error {
	h.mu.Lock()
	h.removed = append(h.removed, image)
	h.mu.Unlock()
	if err := os.Remove(image); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Images lists the images built and removed, in order.
func (h *Host) Images() (built, removed []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.built...), append([]string(nil), h.removed...)
}

// Start boots the Sandbox Next returns, with opts.Disks attached.
func (h *Host) Start(_ context.Context, opts sandbox.Options) (*Sandbox, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.failures["StartSandbox"]; err != nil {
		return nil, err
	}
	sb := h.next
	if sb == nil {
		sb = newSandbox()
	}
	h.next = nil
	sb.mu.Lock()
	sb.opts = opts
	for _, d := range opts.Disks {
		sb.attach(d)
	}
	sb.mu.Unlock()
	h.started = append(h.started, sb)
	return sb, nil
}

// Started lists the Sandboxes Start returned.
func (h *Host) Started() []*Sandbox {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*Sandbox(nil), h.started...)
}

// Call is one call the service made to a Sandbox: the method's name and
// its request (nil for calls that take none).
type Call struct {
	Method string
	Req    any
}

// Sandbox is a fake pod VM.
type Sandbox struct {
	mu       sync.Mutex
	opts     sandbox.Options
	done     chan struct{}
	exitErr  error
	stopped  bool
	failures map[string]error
	calls    []Call
	disks    map[string]vm.DiskAddress
	size     vm.Size
	verified *sandbox.Verified
	migrated *sandbox.Migrated
	progress vm.MigrationInfo
	migrates bool

	// The guest.
	nextPid    uint32
	containers map[string]*container
}

func newSandbox() *Sandbox {
	return &Sandbox{
		done:       make(chan struct{}),
		failures:   map[string]error{},
		disks:      map[string]vm.DiskAddress{},
		size:       vm.Size{VCPUs: 1, MaxVCPUs: 1, MemoryMiB: 512, MaxMemoryMiB: 512},
		verified:   &sandbox.Verified{Provider: "fake"},
		nextPid:    100,
		containers: map[string]*container{},
	}
}

// Options are the options the VM was started with.
func (s *Sandbox) Options() sandbox.Options {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts
}

// Fail makes every later call of method (an agent, IO or Sandbox method
// name: "CreateContainer", "AttachDisk", ...) fail with err; a nil err
// makes it succeed again. Agent and IO calls return err as c8s-agent
// sends it, a gRPC status.
func (s *Sandbox) Fail(method string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures[method] = err
}

// call records a call and returns the error set for its method; s.mu is
// held.
func (s *Sandbox) call(method string, req any) error {
	s.calls = append(s.calls, Call{method, req})
	return s.failures[method]
}

// Calls returns the calls made, in order; with methods, only theirs.
func (s *Sandbox) Calls(methods ...string) []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Call
	for _, c := range s.calls {
		if len(methods) == 0 || contains(methods, c.Method) {
			out = append(out, c)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Die ends the VM as if QEMU had exited with err: Done closes, and agent
// calls, pending or new, fail.
func (s *Sandbox) Die(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.end(err)
}

// end closes done once; s.mu is held.
func (s *Sandbox) end(err error) {
	select {
	case <-s.done:
	default:
		s.exitErr = err
		close(s.done)
	}
}

// Stopped reports whether Stop was called.
func (s *Sandbox) Stopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped
}

// Done is closed when the VM has exited.
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

// Stop ends the VM.
func (s *Sandbox) Stop(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.call("Stop", nil)
	s.stopped = true
	s.end(nil)
	return err
}

// Pid is QEMUPid.
func (s *Sandbox) Pid() int { return QEMUPid }

// attach gives d the next LUN; s.mu is held.
func (s *Sandbox) attach(d vm.Disk) vm.DiskAddress {
	addr := vm.DiskAddress{Target: 0, LUN: len(s.disks)}
	s.disks[d.ID] = addr
	return addr
}

// AttachDisk returns where d is, hot-plugging it if it was not attached
// at boot.
func (s *Sandbox) AttachDisk(_ context.Context, d vm.Disk) (vm.DiskAddress, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.call("AttachDisk", d); err != nil {
		return vm.DiskAddress{}, err
	}
	if addr, ok := s.disks[d.ID]; ok {
		return addr, nil
	}
	return s.attach(d), nil
}

// DetachDisk unplugs disk id.
func (s *Sandbox) DetachDisk(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.call("DetachDisk", id); err != nil {
		return err
	}
	if _, ok := s.disks[id]; !ok {
		return fmt.Errorf("disk %q is not attached", id)
	}
	delete(s.disks, id)
	return nil
}

// Disks returns the attached disks by id.
func (s *Sandbox) Disks() map[string]vm.DiskAddress {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]vm.DiskAddress{}
	for id, a := range s.disks {
		out[id] = a
	}
	return out
}

// SetSize sets what Size reports.
func (s *Sandbox) SetSize(size vm.Size) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.size = size
}

// Size reports the VM's size.
func (s *Sandbox) Size() (vm.Size, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.failures["Size"]; err != nil {
		return vm.Size{}, err
	}
	return s.size, nil
}

// Grow grows the VM to at least vcpus and memMiB, within its maxima.
func (s *Sandbox) Grow(_ context.Context, vcpus, memMiB uint32) (vm.Size, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.call("Grow", [2]uint32{vcpus, memMiB}); err != nil {
		return vm.Size{}, err
	}
	if vcpus > s.size.MaxVCPUs || memMiB > s.size.MaxMemoryMiB {
		return vm.Size{}, fmt.Errorf("grow to %d vCPUs and %d MiB: beyond %d and %d", vcpus, memMiB, s.size.MaxVCPUs, s.size.MaxMemoryMiB)
	}
	s.size.VCPUs = max(s.size.VCPUs, vcpus)
	s.size.MemoryMiB = max(s.size.MemoryMiB, memMiB)
	return s.size, nil
}

// SetVerified sets what Attest returns.
func (s *Sandbox) SetVerified(v *sandbox.Verified) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.verified = v
}

// Attest returns what SetVerified set.
func (s *Sandbox) Attest(_ context.Context, cfg config.Config) (*sandbox.Verified, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.call("Attest", cfg); err != nil {
		return nil, err
	}
	return s.verified, nil
}

// HandInitData records the hand-over.
func (s *Sandbox) HandInitData(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.call("HandInitData", nil)
}

// SetMigration sets what Migrate returns and what MigrationProgress
// reports.
func (s *Sandbox) SetMigration(m *sandbox.Migrated, progress vm.MigrationInfo, active bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.migrated, s.progress, s.migrates = m, progress, active
}

// Migrate returns what SetMigration set.
func (s *Sandbox) Migrate(_ context.Context, _ config.Config, _ *migrate.Client, o sandbox.MigrateOptions) (*sandbox.Migrated, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.call("Migrate", o); err != nil {
		return nil, err
	}
	if s.migrated == nil {
		return nil, errors.New("fakesandbox: no migration set")
	}
	return s.migrated, nil
}

// MigrationProgress reports what SetMigration set.
func (s *Sandbox) MigrationProgress() (vm.MigrationInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.progress, s.migrates
}

// agentErr is the error of an agent call, as it crosses the wire: a
// gRPC status (the agent's interceptor), or ErrConnClosed once the VM is
// gone. s.mu is held.
func (s *Sandbox) agentErr(method string, req any) error {
	err := s.call(method, req)
	select {
	case <-s.done:
		return ErrConnClosed
	default:
	}
	return s.wire(err)
}

// wire is err as the agent's ttrpc server sends it.
func (s *Sandbox) wire(err error) error {
	return errgrpc.ToGRPC(err)
}

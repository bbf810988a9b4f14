package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/launcher/vm"
)

// onlineTimeout bounds the wait for the guest to see hot-plugged vCPUs and
// memory (ACPI events, under TCG on a loaded node).
const onlineTimeout = 30 * time.Second

// errMoved: a VM that has moved to another node is driven through that
// node's API, which has no hot-plug.
var errMoved = errors.New("the pod VM has moved to another node, where it cannot be resized yet")

// ErrGuestCannotGrow: the guest could not use what would be hot-plugged.
var ErrGuestCannotGrow = errors.New("the guest cannot grow")

// Size reports the pod VM's vCPUs and memory and how far they can grow.
func (s *Sandbox) Size() (vm.Size, error) {
	v, ok := s.machine().(*vm.VM)
	if !ok {
		return vm.Size{}, errMoved
	}
	return v.Size(), nil
}

// Grow hot-plugs vCPUs and memory until the VM has at least vcpus vCPUs
// and memMiB MiB (zero: leave as is), then waits until the guest has
// brought them online. It returns the VM's new size.
func (s *Sandbox) Grow(ctx context.Context, vcpus, memMiB uint32) (vm.Size, error) {
	v, ok := s.machine().(*vm.VM)
	if !ok {
		return vm.Size{}, errMoved
	}
	// What the guest has online now: the memory it counts (whole memory
	// blocks) need not be the configured size.
	before, err := s.Agent.OnlineCPUMem(ctx, &agent.OnlineCPUMemRequest{})
	if err != nil {
		return v.Size(), fmt.Errorf("ask the guest what it has online: %w", err)
	}
	old := v.Size()
	if vcpus > old.VCPUs && vcpus > before.PossibleVcpus {
		return old, fmt.Errorf("%w: the guest kernel can use at most %d vCPUs (its possible CPUs), not the %d asked: it did not count the VM's hot-pluggable vCPUs "+
			"(Linux 6.12 counts QEMU's only when it detects a hypervisor, as under KVM, not under TCG), so vCPU hot-plug needs hypervisor.accel = \"kvm\"",
			ErrGuestCannotGrow, before.PossibleVcpus, vcpus)
	}
	if err := v.GrowVCPUs(ctx, vcpus); err != nil {
		return v.Size(), err
	}
	if err := v.GrowMemory(ctx, memMiB); err != nil {
		return v.Size(), err
	}
	now := v.Size()
	if now == old {
		return now, nil
	}
	want := &agent.OnlineCPUMemRequest{
		Vcpus:     before.Vcpus + now.VCPUs - old.VCPUs,
		MemoryMib: before.MemoryMib + uint64(now.MemoryMiB-old.MemoryMiB),
		TimeoutMs: uint32(onlineTimeout / time.Millisecond),
	}
	if _, err := s.Agent.OnlineCPUMem(ctx, want); err != nil {
		return now, fmt.Errorf("the pod VM grew to %d vCPUs and %d MiB, but the guest did not bring it all online: %w", now.VCPUs, now.MemoryMiB, err)
	}
	return now, nil
}

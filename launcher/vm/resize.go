package vm

import (
	"context"
	"fmt"
	"sort"
	"strconv"

	"github.com/c8s-dev/c8s/launcher/config"
)

// Growing a running VM: vCPU hot-plug (device_add of the CPU type QEMU
// lists in query-hotpluggable-cpus) and memory hot-plug (a RAM backend and
// a pc-dimm). Only what the command line left room for can be added:
// -smp maxcpus and -m slots,maxmem, from hypervisor.default_maxvcpus and
// default_maxmemory. Neither changes what is measured: SNP and the sim TEE
// measure the boot vCPUs' VMSAs (-smp's first number) and the firmware,
// kernel, initrd and command line, never the possible CPUs or the memory
// map; and config refuses hot-plug capacity for snp and tdx, whose guests
// cannot take it. The guest brings what arrives online (the agent's
// OnlineCPUMem). Nothing is unplugged: a VM does not shrink.

// maxMemorySlots bounds the pc-dimm slots (ACPI's limit is 256).
const maxMemorySlots = 256

// smpOption is -smp: the boot vCPUs, and the hot-plug room if any.
func smpOption(h config.Hypervisor) string {
	n := strconv.FormatUint(uint64(h.DefaultVCPUs), 10)
	if c := h.VCPUCapacity(); c > h.DefaultVCPUs {
		return fmt.Sprintf("%s,maxcpus=%d", n, c)
	}
	return n
}

// memoryOption is -m: the boot memory, and the hot-plug room if any (one
// slot per HotplugMemoryStepMiB of it, at most maxMemorySlots).
func memoryOption(h config.Hypervisor) string {
	c := h.MemoryCapacityMiB()
	if c <= h.DefaultMemoryMiB {
		return fmt.Sprintf("%dM", h.DefaultMemoryMiB)
	}
	return fmt.Sprintf("%dM,slots=%d,maxmem=%dM", h.DefaultMemoryMiB, memorySlots(h), c)
}

func memorySlots(h config.Hypervisor) int {
	room := h.MemoryCapacityMiB() - h.DefaultMemoryMiB
	return int(min(max((room+config.HotplugMemoryStepMiB-1)/config.HotplugMemoryStepMiB, 1), maxMemorySlots))
}

// Size is what a VM has and how far it can grow.
type Size struct {
	VCPUs, MaxVCPUs         uint32
	MemoryMiB, MaxMemoryMiB uint32
}

// resizeState is what was hot-plugged into the VM.
type resizeState struct {
	cpus  []string // device IDs of hot-plugged vCPUs
	dimms []uint32 // sizes in MiB of hot-plugged DIMMs
}

// Size reports the VM's vCPUs and memory now and their capacity.
func (v *VM) Size() Size {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.sizeLocked()
}

func (v *VM) sizeLocked() Size {
	h := v.spec.Hypervisor
	s := Size{
		VCPUs: h.DefaultVCPUs + uint32(len(v.resized.cpus)), MaxVCPUs: h.VCPUCapacity(),
		MemoryMiB: h.DefaultMemoryMiB, MaxMemoryMiB: h.MemoryCapacityMiB(),
	}
	for _, d := range v.resized.dimms {
		s.MemoryMiB += d
	}
	return s
}

// hotpluggableCPU is one entry of query-hotpluggable-cpus.
type hotpluggableCPU struct {
	Type    string           `json:"type"`
	Props   map[string]int64 `json:"props"`
	QOMPath string           `json:"qom-path"`
}

// GrowVCPUs hot-plugs vCPUs until the VM has n. It does nothing when the
// VM has n already, and fails beyond MaxVCPUs.
func (v *VM) GrowVCPUs(ctx context.Context, n uint32) error {
	v.resizeMu.Lock()
	defer v.resizeMu.Unlock()
	size := v.Size()
	if n <= size.VCPUs {
		return nil
	}
	if n > size.MaxVCPUs {
		return fmt.Errorf("vm: %d vCPUs asked, the VM can have at most %d (hypervisor.default_maxvcpus)", n, size.MaxVCPUs)
	}
	var possible []hotpluggableCPU
	if err := v.qmp.Execute(ctx, "query-hotpluggable-cpus", nil, &possible); err != nil {
		return fmt.Errorf("vm: list the VM's hot-pluggable vCPUs: %w", err)
	}
	var free []hotpluggableCPU
	for _, c := range possible {
		if c.QOMPath == "" {
			free = append(free, c)
		}
	}
	// Lowest topology IDs first, so that the guest's CPU numbers follow.
	sort.Slice(free, func(i, j int) bool { return cpuOrder(free[i]) < cpuOrder(free[j]) })
	for have := size.VCPUs; have < n; have++ {
		if len(free) == 0 {
			return fmt.Errorf("vm: QEMU has no free vCPU slot left at %d vCPUs", have)
		}
		c := free[0]
		free = free[1:]
		id := fmt.Sprintf("c8s-cpu%d", have)
		args := map[string]any{"driver": c.Type, "id": id}
		for k, val := range c.Props {
			args[k] = val
		}
		if err := v.qmp.Execute(ctx, "device_add", args, nil); err != nil {
			return fmt.Errorf("vm: hot-plug vCPU %d: %w", have, err)
		}
		v.mu.Lock()
		v.resized.cpus = append(v.resized.cpus, id)
		v.mu.Unlock()
	}
	return nil
}

// cpuOrder sorts hot-pluggable CPUs by socket, die, core and thread.
func cpuOrder(c hotpluggableCPU) int64 {
	return ((c.Props["socket-id"]*1024+c.Props["die-id"])*1024+c.Props["core-id"])*1024 + c.Props["thread-id"]
}

// GrowMemory hot-plugs one DIMM so that the VM has at least mib MiB: the
// missing memory rounded up to config.HotplugMemoryStepMiB (the guest's
// memory block size, so that every block of it can come online). It does
// nothing when the VM has mib already, and fails beyond MaxMemoryMiB.
func (v *VM) GrowMemory(ctx context.Context, mib uint32) error {
	v.resizeMu.Lock()
	defer v.resizeMu.Unlock()
	size := v.Size()
	if mib <= size.MemoryMiB {
		return nil
	}
	add := RoundUpMemory(mib - size.MemoryMiB)
	if size.MemoryMiB+add > size.MaxMemoryMiB {
		return fmt.Errorf("vm: %d MiB asked (%d MiB in steps of %d), the VM can have at most %d MiB (hypervisor.default_maxmemory)",
			mib, size.MemoryMiB+add, config.HotplugMemoryStepMiB, size.MaxMemoryMiB)
	}
	v.mu.Lock()
	n := len(v.resized.dimms)
	v.mu.Unlock()
	if n >= memorySlots(v.spec.Hypervisor) {
		return fmt.Errorf("vm: all %d memory slots are used", n)
	}
	backend := map[string]any{"qom-type": "memory-backend-ram", "id": fmt.Sprintf("c8s-dimm-mem%d", n), "size": uint64(add) << 20}
	if v.spec.SharedFS != nil {
		// virtiofsd maps all of the guest's RAM: shared memory like the rest.
		backend["qom-type"], backend["share"] = "memory-backend-memfd", true
	}
	if err := v.qmp.Execute(ctx, "object-add", backend, nil); err != nil {
		return fmt.Errorf("vm: allocate %d MiB for memory hot-plug: %w", add, err)
	}
	dev := map[string]any{"driver": "pc-dimm", "id": fmt.Sprintf("c8s-dimm%d", n), "memdev": backend["id"]}
	if err := v.qmp.Execute(ctx, "device_add", dev, nil); err != nil {
		_ = v.qmp.Execute(context.WithoutCancel(ctx), "object-del", map[string]any{"id": backend["id"]}, nil)
		return fmt.Errorf("vm: hot-plug a %d MiB DIMM: %w", add, err)
	}
	v.mu.Lock()
	v.resized.dimms = append(v.resized.dimms, add)
	v.mu.Unlock()
	return nil
}

// RoundUpMemory rounds mib up to a multiple of config.HotplugMemoryStepMiB.
func RoundUpMemory(mib uint32) uint32 {
	const step = config.HotplugMemoryStepMiB
	return (mib + step - 1) / step * step
}

package config

import "fmt"

// VCPUCapacity is how many vCPUs a pod VM can grow to: DefaultMaxVCPUs, or
// DefaultVCPUs when that is not above it (no CPU hot-plug).
func (h Hypervisor) VCPUCapacity() uint32 {
	return max(h.DefaultMaxVCPUs, h.DefaultVCPUs)
}

// MemoryCapacityMiB is the memory in MiB a pod VM can grow to:
// DefaultMaxMemoryMiB, or DefaultMemoryMiB when that is not above it (no
// memory hot-plug).
func (h Hypervisor) MemoryCapacityMiB() uint32 {
	return max(h.DefaultMaxMemoryMiB, h.DefaultMemoryMiB)
}

// HotplugRefusal says why a pod VM of this TEE cannot grow at all, or ""
// when it can (within VCPUCapacity and MemoryCapacityMiB).
//
// SEV-SNP: the launch digest covers one VMSA per vCPU present at launch,
// and KVM and QEMU cannot add a vCPU to a launched SNP guest; memory added
// later would have to be made private and validated by the guest
// (PVALIDATE), and confidential guests disable the RAM discard virtio-mem
// relies on. TDX: a TD's vCPUs are fixed when it is finalized, and added
// memory would have to be accepted by the guest (TDG.MEM.PAGE.ACCEPT). The
// QEMU c8s uses (7.2) offers neither.
func (h Hypervisor) HotplugRefusal() string {
	switch h.TEE {
	case "snp":
		return "tee snp cannot grow a running pod VM: the launch measures one VMSA per boot vCPU and KVM/QEMU cannot add vCPUs to a launched SEV-SNP guest, and hot-plugged memory would have to be validated (PVALIDATE) by the guest, which QEMU 7.2 cannot offer"
	case "tdx":
		return "tee tdx cannot grow a running pod VM: a TD's vCPUs are fixed when it is finalized, and hot-plugged memory would have to be accepted (TDG.MEM.PAGE.ACCEPT) by the guest, which QEMU 7.2 cannot offer"
	}
	return ""
}

// validateHotplug checks default_maxvcpus and default_maxmemory.
func (h *Hypervisor) validateHotplug() []error {
	var errs []error
	if h.DefaultMaxVCPUs > MaxVCPUs {
		errs = append(errs, fmt.Errorf("hypervisor.default_maxvcpus %d is above %d", h.DefaultMaxVCPUs, MaxVCPUs))
	}
	if h.DefaultMaxMemoryMiB > MaxMemoryMiB {
		errs = append(errs, fmt.Errorf("hypervisor.default_maxmemory %d MiB is above %d", h.DefaultMaxMemoryMiB, MaxMemoryMiB))
	}
	if why := h.HotplugRefusal(); why != "" {
		if h.DefaultMaxVCPUs > h.DefaultVCPUs {
			errs = append(errs, fmt.Errorf("hypervisor.default_maxvcpus %d: %s; leave it unset and size pods with default_vcpus", h.DefaultMaxVCPUs, why))
		}
		if h.DefaultMaxMemoryMiB > h.DefaultMemoryMiB {
			errs = append(errs, fmt.Errorf("hypervisor.default_maxmemory %d MiB: %s; leave it unset and size pods with default_memory", h.DefaultMaxMemoryMiB, why))
		}
	}
	return errs
}

package discovery

import "github.com/c8s-dev/c8s/launcher/config"

// ConfigOptions returns the Options the c8s config decides: the sim slot
// count (node.sim_slots), the guest memory a sim slot is sized for
// (hypervisor.default_memory) and the GPU CC mode file
// (devices.gpu_cc_modes). Root, CPUID and the KVM probe are left to the
// caller.
func ConfigOptions(c *config.Config) Options {
	return Options{SimSlots: c.Node.SimSlots, SimSlotMemoryMiB: int(c.Hypervisor.DefaultMemoryMiB), GPUCCModeFile: c.Devices.GPUCCModes}
}

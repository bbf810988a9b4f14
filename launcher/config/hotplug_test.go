package config

import (
	"strings"
	"testing"
)

func TestHotplugCapacity(t *testing.T) {
	c, err := Parse([]byte("[hypervisor]\ndefault_vcpus = 2\ndefault_maxvcpus = 4\ndefault_memory = 512\ndefault_maxmemory = 2048\n"))
	if err != nil {
		t.Fatal(err)
	}
	if h := c.Hypervisor; h.VCPUCapacity() != 4 || h.MemoryCapacityMiB() != 2048 || h.HotplugRefusal() != "" {
		t.Errorf("capacity %d vCPUs, %d MiB, refusal %q", h.VCPUCapacity(), h.MemoryCapacityMiB(), h.HotplugRefusal())
	}
	// Unset, or at or below the boot size (a pod annotation may raise
	// default_vcpus past it): no room to grow.
	d := Default().Hypervisor
	if d.VCPUCapacity() != d.DefaultVCPUs || d.MemoryCapacityMiB() != d.DefaultMemoryMiB {
		t.Errorf("defaults have hot-plug room: %d vCPUs, %d MiB", d.VCPUCapacity(), d.MemoryCapacityMiB())
	}
	d.DefaultVCPUs, d.DefaultMaxVCPUs = 8, 4
	if d.VCPUCapacity() != 8 {
		t.Errorf("capacity %d with default_vcpus 8 above default_maxvcpus 4", d.VCPUCapacity())
	}
}

func TestHotplugIsRefusedByConfidentialTEEs(t *testing.T) {
	for _, tee := range []string{"snp", "tdx"} {
		c := validConfig(t)
		c.Hypervisor.TEE = tee
		c.Hypervisor.Firmware = c.Hypervisor.Kernel
		if err := c.Validate(); err != nil {
			t.Fatalf("%s without hot-plug: %v", tee, err)
		}
		c.Hypervisor.DefaultMaxVCPUs, c.Hypervisor.DefaultMaxMemoryMiB = 4, 4096
		err := c.Validate()
		for _, want := range []string{"hypervisor.default_maxvcpus 4: tee " + tee + " cannot grow", "hypervisor.default_maxmemory 4096 MiB: tee " + tee} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: Validate = %v, want it to say %q", tee, err, want)
			}
		}
		if c.Hypervisor.HotplugRefusal() == "" {
			t.Errorf("%s: no refusal", tee)
		}
	}
	c := validConfig(t)
	c.Hypervisor.DefaultMaxVCPUs, c.Hypervisor.DefaultMaxMemoryMiB = 4, 4096
	if err := c.Validate(); err != nil {
		t.Errorf("sim with hot-plug room: %v", err)
	}
	c.Hypervisor.DefaultMaxVCPUs = MaxVCPUs + 1
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "default_maxvcpus") {
		t.Errorf("too many vCPUs: %v", err)
	}
}

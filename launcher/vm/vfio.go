package vm

import (
	"errors"
	"fmt"
	"math/bits"
	"regexp"
	"strconv"

	"github.com/c8s-dev/c8s/launcher/config"
)

// VFIODevice is a host PCI device, such as an NVIDIA GPU in confidential-
// computing mode, cold-plugged into the VM at boot through VFIO: each gets
// its own PCIe root port on the q35 host bridge (pcie.0), since the guest
// driver expects a PCI Express device, and VFIO cannot hot-plug into a
// confidential guest whose firmware has already sized the PCI windows.
//
//	-object iommufd,id=c8s-iommufd0                           (with IOMMUFD)
//	-device pcie-root-port,id=c8s-rp0,bus=pcie.0,chassis=1
//	-device vfio-pci,host=0000:41:00.0,id=c8s-vfio0,bus=c8s-rp0[,iommufd=c8s-iommufd0]
//	-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144         (with OVMF)
//
// # Large BARs
//
// A GPU's 64-bit BARs are far larger than OVMF's default 64-bit PCI MMIO
// window (32 GiB): an H100's BAR1 alone is 128 GiB. Without a larger
// window OVMF leaves the BAR unassigned and the guest driver fails. OVMF
// reads the window size from fw_cfg (opt/ovmf/X-PciMmio64Mb, in MiB); the
// launcher sets it, when the VM boots OVMF (hypervisor.firmware or .igvm:
// always for snp and tdx): each device's 64-bit BARs, rounded up to a
// power of two (its root port's window), summed and rounded up to a power
// of two again, so that naturally aligned windows always fit: 256 GiB
// (262144) for one H100, 512 GiB for two. A
// confidential guest cannot take the host's word for BAR placement after
// boot, so the window must be right at launch.
//
// # SNP and TDX
//
// The argv is the same for the three TEEs; the differences are in what
// surrounds it. SNP and TDX need KVM (the backends say so) and OVMF
// (hence the MMIO window above). The guest's DMA to the GPU goes through
// shared (unencrypted) bounce buffers: the GPU in CC mode encrypts what
// crosses them, and the guest verifies the GPU through its attestation
// report (the key broker does, launcher/broker gpu.go) before trusting
// it. On TDX, TDVF measures the ACPI tables QEMU generates into RTMR[0],
// so the root ports change a GPU pod's RTMR[0]: the owner's reference
// values for GPU pods must come from a VM with the same devices. On SNP
// the launch measurement does not cover PCI devices.
type VFIODevice struct {
	// Host is the device's PCI address, as in sysfs: 0000:41:00.0.
	Host string
	// IOMMUFD opens the device through the kernel's iommufd (/dev/iommu
	// and the device's VFIO cdev) instead of its legacy VFIO group
	// (/dev/vfio/<group>); QEMU 9.0 or later.
	IOMMUFD bool
	// Mem64Bytes is the total size of the device's 64-bit memory BARs (0:
	// not known): it sizes the firmware's 64-bit MMIO window.
	Mem64Bytes uint64
}

// maxVFIODevices bounds the root ports added to pcie.0 (32 slots, some
// taken by the VM's own devices).
const maxVFIODevices = 16

// defaultOVMFMmio64MiB is OVMF's own 64-bit PCI MMIO window (32 GiB): a
// smaller value would shrink it.
const defaultOVMFMmio64MiB = 32 << 10

var hostPCIAddress = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// vfioArgs returns the arguments that cold-plug devs into a VM of machine
// type machine (only q35 has PCI Express), for hypervisor h.
func vfioArgs(machine string, h config.Hypervisor, devs []VFIODevice) ([]string, error) {
	if len(devs) == 0 {
		return nil, nil
	}
	if machine != "q35" {
		return nil, fmt.Errorf("vm: VFIO devices need PCI Express root ports, which machine type %q does not have: use q35", machine)
	}
	if len(devs) > maxVFIODevices {
		return nil, fmt.Errorf("vm: %d VFIO devices, at most %d", len(devs), maxVFIODevices)
	}
	seen := map[string]bool{}
	var errs []error
	iommufd := false
	var mem64 uint64
	for _, d := range devs {
		if !hostPCIAddress.MatchString(d.Host) {
			errs = append(errs, fmt.Errorf("vm: VFIO device %q is not a PCI address like 0000:41:00.0", d.Host))
		}
		if seen[d.Host] {
			errs = append(errs, fmt.Errorf("vm: VFIO device %s given twice", d.Host))
		}
		seen[d.Host] = true
		iommufd = iommufd || d.IOMMUFD
		w := pow2(d.Mem64Bytes)
		if d.Mem64Bytes > 1<<46 || mem64+w < mem64 {
			errs = append(errs, fmt.Errorf("vm: VFIO device %s: 64-bit BARs of %d bytes are more than a VM can place", d.Host, d.Mem64Bytes))
		}
		mem64 += w
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var argv []string
	const iommufdID = "c8s-iommufd0"
	if iommufd {
		argv = append(argv, "-object", "iommufd,id="+iommufdID)
	}
	for i, d := range devs {
		port := fmt.Sprintf("c8s-rp%d", i)
		argv = append(argv, "-device", fmt.Sprintf("pcie-root-port,id=%s,bus=pcie.0,chassis=%d", port, i+1))
		dev := fmt.Sprintf("vfio-pci,host=%s,id=c8s-vfio%d,bus=%s", d.Host, i, port)
		if d.IOMMUFD {
			dev += ",iommufd=" + iommufdID
		}
		argv = append(argv, "-device", dev)
	}
	if (h.Firmware != "" || h.IGVM != "") && mem64 > 0 {
		argv = append(argv, "-fw_cfg", "name=opt/ovmf/X-PciMmio64Mb,string="+strconv.FormatUint(mmio64MiB(mem64), 10))
	}
	return argv, nil
}

// mmio64MiB is the 64-bit MMIO window, in MiB, for root port windows
// totalling n bytes: the next power of two, and no less than OVMF's
// default.
func mmio64MiB(n uint64) uint64 {
	return max(pow2(n)>>20, defaultOVMFMmio64MiB)
}

// pow2 is the smallest power of two at or above n (0 for 0).
func pow2(n uint64) uint64 {
	if n == 0 || n&(n-1) == 0 {
		return n
	}
	return 1 << bits.Len64(n)
}

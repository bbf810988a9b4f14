package sim

import (
	"github.com/c8s-dev/c8s/guest/api/teeparam"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/vm/tee"
)

// Firmware is the firmware a sim VM boots when hypervisor.firmware is
// empty: QEMU's own SeaBIOS (Debian's seabios package), named explicitly so
// that the simulated secure processor measures the very file QEMU loads.
const Firmware = "/usr/share/seabios/bios-256k.bin"

// AttestPort is the virtio-serial port on which the guest asks the
// simulated secure processor for attestation reports.
const AttestPort = "c8s.attest"

// Backend is a plain q35 VM without confidential-guest-support, for
// development and CI machines without SEV-SNP or TDX. It runs under KVM or
// TCG; the host simulates the secure processor on the AttestPort port.
type Backend struct{}

func init() { tee.Register(Backend{}) }

// Name implements tee.Backend.
func (Backend) Name() string { return teeparam.Sim }

// KernelParams implements tee.Backend: c8s.tee=sim, so that the guest
// asks this port for its evidence, and an snp or tdx guest never does.
func (Backend) KernelParams() []string { return []string{teeparam.Format(teeparam.Sim)} }

// FreePageReporting is the virtio-balloon device through which a sim
// guest hands the pages it frees back to the host (the guest's
// virtio_balloon driver reports free blocks of 128 KiB and up, see
// launcher/vm.PageReportingOrder, and QEMU discards them), so
// that a pod's QEMU does not keep resident every page the guest ever
// touched: the kernel's own boot (decompression, init memory, the initrd)
// touches about 116 MiB of a 512 MiB guest and leaves most of it free. A
// running busybox pod's guest RAM resident in QEMU: 134 MiB without, 98 MiB
// with it (and launcher/vm.PageReportingOrder; hack/bench-memory.sh pods).
// The balloon is never inflated (nothing asks it to). Sim only: an SNP or
// TDX guest's private memory cannot be handed back this way, and a
// hardware TEE's guest binds no balloon the host offers (guest/boot).
var FreePageReporting = []string{"-device", "virtio-balloon-pci,id=balloon0,free-page-reporting=on"}

// QEMU implements tee.Backend: the firmware, the kernel parameters, the
// attestation port and the free page reporting device.
func (b Backend) QEMU(h config.Hypervisor) (tee.Pieces, error) {
	fw := h.Firmware
	if fw == "" {
		fw = Firmware
	}
	return tee.Pieces{
		Firmware:     fw,
		KernelParams: b.KernelParams(),
		Ports:        []string{AttestPort, tee.KBSPort},
		Args:         append([]string(nil), FreePageReporting...),
	}, nil
}

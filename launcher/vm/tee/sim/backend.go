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

// QEMU implements tee.Backend: the firmware, the kernel parameters and the
// attestation port.
func (b Backend) QEMU(h config.Hypervisor) (tee.Pieces, error) {
	fw := h.Firmware
	if fw == "" {
		fw = Firmware
	}
	return tee.Pieces{Firmware: fw, KernelParams: b.KernelParams(), Ports: []string{AttestPort, tee.KBSPort}}, nil
}

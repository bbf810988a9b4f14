package tee

import "github.com/c8s-dev/c8s/launcher/config"

// SimFirmware is the firmware a sim VM boots when hypervisor.firmware is
// empty: QEMU's own SeaBIOS (Debian's seabios package), named explicitly so
// that the simulated secure processor measures the very file QEMU loads.
const SimFirmware = "/usr/share/seabios/bios-256k.bin"

// SimAttestPort is the virtio-serial port on which the guest asks the
// simulated secure processor for attestation reports.
const SimAttestPort = "c8s.attest"

// Sim is a plain q35 VM without confidential-guest-support, for development
// and CI machines without SEV-SNP or TDX. It runs under KVM or TCG; the
// host simulates the secure processor on the SimAttestPort port.
type Sim struct{}

func init() { Register(Sim{}) }

// Name implements Backend.
func (Sim) Name() string { return "sim" }

// QEMU implements Backend: the firmware and the attestation port.
func (Sim) QEMU(h config.Hypervisor) (Pieces, error) {
	fw := h.Firmware
	if fw == "" {
		fw = SimFirmware
	}
	return Pieces{Firmware: fw, Ports: []string{SimAttestPort, KBSPort}}, nil
}

package tee

import "github.com/c8s-dev/c8s/launcher/config"

// Sim is a plain q35 VM without confidential-guest-support, for development
// and CI machines without SEV-SNP or TDX. It runs under KVM or TCG. (The
// simulated attestation root comes with a later change.)
type Sim struct{}

func init() { Register(Sim{}) }

// Name implements Backend.
func (Sim) Name() string { return "sim" }

// QEMU implements Backend: only the optional firmware.
func (Sim) QEMU(h config.Hypervisor) (Pieces, error) {
	return Pieces{Firmware: h.Firmware}, nil
}

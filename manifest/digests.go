package manifest

import (
	"fmt"
)

// DigestsSim is the Digests key of the sim TEE's expected launch digests.
const DigestsSim = "sim"

// SimDigests are the launch digests the sim TEE's simulated secure
// processor reports for this image (measurements/sim), one per vCPU count:
// what a verifier pins for every pod shape it accepts.
type SimDigests struct {
	// Firmware is the -bios image the digests assume (path on the build
	// host and sha256); a node must boot the same bytes.
	Firmware FileDigest `json:"firmware"`
	// Cmdline is the full kernel command line the digests assume:
	// Manifest.Cmdline followed by the sim TEE's parameters (c8s.tee=sim),
	// with no hypervisor.kernel_params.
	Cmdline string `json:"cmdline"`
	// VCPUType names the vCPU signature in the VMSAs.
	VCPUType string `json:"vcpu_type"`
	// GuestFeatures is the SEV_FEATURES value of the VMSAs.
	GuestFeatures uint64 `json:"guest_features"`
	// ByVCPUs maps a vCPU count ("1", "2", ...) to the hex SHA-384 digest.
	ByVCPUs map[string]string `json:"by_vcpus"`
	// Boot is the measured boot the sim TEE's modelled RTMRs record for
	// the image's kernel, initrd and sim command line, checked as on TDX.
	Boot *BootDigests `json:"boot,omitempty"`
}

// BootDigests are the measured-boot digests of a direct boot of the
// image (measurements/tdx DirectBoot.Digests): the events a TD's CC event
// log (or the sim TEE's modelled log) must record in RTMR1 and RTMR2.
type BootDigests struct {
	// Kernel is the hex Authenticode SHA-384 of the kernel.
	Kernel string `json:"kernel"`
	// LoadOptions is the hex SHA-384 of the kernel's load options (the
	// command line and " initrd=initrd", UTF-16LE, NUL-terminated).
	LoadOptions string `json:"load_options"`
	// Initrd is the hex SHA-384 of the initrd.
	Initrd string `json:"initrd,omitempty"`
}

// FileDigest names a file and its sha256.
type FileDigest struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
}

// SetSim records the sim digests.
func (m *Manifest) SetSim(d SimDigests) error { return m.setDigests(DigestsSim, d) }

// Sim returns the sim digests, or an error saying the image has none.
func (m *Manifest) Sim() (*SimDigests, error) {
	var d SimDigests
	if err := m.digests(DigestsSim, &d, "SIM_FIRMWARE names the firmware"); err != nil {
		return nil, err
	}
	if err := checkByVCPUs(DigestsSim, d.ByVCPUs); err != nil {
		return nil, err
	}
	return &d, nil
}

// DigestsTDX is the Digests key of the TDX expected measurements.
const DigestsTDX = "tdx"

// TDXDigests are the TDX measurements this image's pods are expected to
// have. MRTD depends only on the TDVF firmware (measurements/tdx); the
// kernel, initrd and command line (root hash and c8s.tee=tdx included) go
// to RTMR1 and RTMR2, predicted under the stated assumptions. Verifiers
// (the shim, the key broker, verify-report) check the TD's CC event log
// against Boot and the registers against RTMR1 and RTMR2. RTMR0 (firmware
// configuration, TD HOB, ACPI tables) is not predicted.
type TDXDigests struct {
	// Firmware is the TDVF image MRTD was computed from.
	Firmware FileDigest `json:"firmware"`
	// Cmdline is the kernel command line RTMR2 is predicted for:
	// Manifest.Cmdline followed by the TDX TEE's parameters (c8s.tee=tdx).
	Cmdline string `json:"cmdline"`
	// MRTD is the hex SHA-384 MRTD.
	MRTD string `json:"mrtd"`
	// RTMR1 and RTMR2 are the predicted hex SHA-384 registers of a direct
	// boot of the image's kernel, initrd and command line.
	RTMR1 string `json:"rtmr1,omitempty"`
	RTMR2 string `json:"rtmr2,omitempty"`
	// RTMRAssumptions say what the RTMR predictions rest on.
	RTMRAssumptions string `json:"rtmr_assumptions,omitempty"`
	// Boot is the kernel, command line and initrd the TD's event log must
	// record.
	Boot *BootDigests `json:"boot,omitempty"`
}

// SetTDX records the TDX digests.
func (m *Manifest) SetTDX(d TDXDigests) error { return m.setDigests(DigestsTDX, d) }

// TDX returns the TDX digests, or an error saying the image has none.
func (m *Manifest) TDX() (*TDXDigests, error) {
	var d TDXDigests
	if err := m.digests(DigestsTDX, &d, "TDX_FIRMWARE names the TDVF"); err != nil {
		return nil, err
	}
	if len(d.MRTD) != 96 {
		return nil, fmt.Errorf("manifest: digests.%s.mrtd %q is not a SHA-384 hex digest", DigestsTDX, d.MRTD)
	}
	return &d, nil
}

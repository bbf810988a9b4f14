package manifest

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/c8s-dev/c8s/guest/api/verity"
)

// Artifact roles of a sealed image, besides RoleKernel and RoleInitrd (the
// first-stage initramfs of a sealed image).
const (
	// RoleRootfs is the root file system followed by its dm-verity hash tree.
	RoleRootfs = "rootfs"
	// RoleInitrdPlain is the unsealed initramfs of the same root tree.
	RoleInitrdPlain = "initrd-plain"
	// RoleUKI is the unified kernel image (systemd-stub, kernel, initrd,
	// command line, os-release, uname).
	RoleUKI = "uki"
	// RoleIGVM is the SEV-SNP IGVM file (firmware, kernel, initrd, command
	// line).
	RoleIGVM = "igvm"
)

// Verity describes the dm-verity protection of the rootfs artefact. Its
// parameters travel on the kernel command line (Cmdline), so the launch
// measurement covers the root hash and with it every block of the root.
type Verity struct {
	verity.Params
	// HashAlgorithm, DataBlockSize and HashBlockSize are those of the tree.
	HashAlgorithm string `json:"hash_algorithm"`
	DataBlockSize int    `json:"data_block_size"`
	HashBlockSize int    `json:"hash_block_size"`
	// UUID is the verity superblock's UUID; FSUUID the file system's. Both
	// are fixed by the build so that equal trees give equal bytes.
	UUID   string `json:"uuid"`
	FSUUID string `json:"fs_uuid"`
}

// Validate checks v against the format the guest's first stage reads.
func (v *Verity) Validate() error {
	if err := v.Params.Validate(); err != nil {
		return fmt.Errorf("manifest verity: %w", err)
	}
	if v.HashAlgorithm != verity.HashAlgorithm || v.DataBlockSize != verity.BlockSize || v.HashBlockSize != verity.BlockSize {
		return fmt.Errorf("manifest verity: %s with %d/%d-byte blocks is not what the guest maps (%s, %d-byte blocks)",
			v.HashAlgorithm, v.DataBlockSize, v.HashBlockSize, verity.HashAlgorithm, verity.BlockSize)
	}
	return nil
}

// Sealed reports whether the image boots a dm-verity root (rootfs artefact
// plus verity parameters).
func (m *Manifest) Sealed() bool {
	_, ok := m.Artifacts[RoleRootfs]
	return ok && m.Verity != nil
}

// RootKernelParams returns the kernel parameters that name the verified
// root, or nil for an unsealed image.
func (m *Manifest) RootKernelParams() []string {
	if !m.Sealed() {
		return nil
	}
	return m.Verity.KernelParams()
}

// DigestsSNP is the Digests key of the SEV-SNP expected launch digests.
const DigestsSNP = "snp"

// SNPDigests are the SEV-SNP launch digests of a direct boot of this
// image's kernel, initrd and command line with Firmware (QEMU
// kernel-hashes=on), one per vCPU count, as measurements/snp computes them.
type SNPDigests struct {
	// Firmware is the AmdSevX64 OVMF the digests assume.
	Firmware FileDigest `json:"firmware"`
	// FirmwareNote says where Firmware comes from when it is not a
	// production build (for example a published test fixture).
	FirmwareNote string `json:"firmware_note,omitempty"`
	// Cmdline is the kernel command line the digests (and the IGVM's
	// kernel hashes) assume: Manifest.Cmdline followed by the SNP TEE's
	// parameters (c8s.tee=snp).
	Cmdline string `json:"cmdline"`
	// VCPUType names the vCPU model whose signature is in the VMSAs.
	VCPUType string `json:"vcpu_type"`
	// GuestFeatures is the SEV_FEATURES value of the VMSAs.
	GuestFeatures uint64 `json:"guest_features"`
	// ByVCPUs maps a vCPU count to the hex SHA-384 launch digest.
	ByVCPUs map[string]string `json:"by_vcpus"`
	// IGVM is the digest of the IGVM artefact launched with IGVMVCPUs
	// vCPUs; it equals ByVCPUs[IGVMVCPUs] (the build checks it).
	IGVM      string `json:"igvm,omitempty"`
	IGVMVCPUs int    `json:"igvm_vcpus,omitempty"`
}

// SetSNP records the SNP digests.
func (m *Manifest) SetSNP(d SNPDigests) error { return m.setDigests(DigestsSNP, d) }

// SNP returns the SNP digests, or an error saying the image has none.
func (m *Manifest) SNP() (*SNPDigests, error) {
	var d SNPDigests
	if err := m.digests(DigestsSNP, &d, "SNP_FIRMWARE names an AmdSevX64 OVMF"); err != nil {
		return nil, err
	}
	if err := checkByVCPUs(DigestsSNP, d.ByVCPUs); err != nil {
		return nil, err
	}
	return &d, nil
}

// DigestsUKI is the Digests key of the UKI's expected measurements.
const DigestsUKI = "uki"

// UKIDigests are what booting the UKI artefact measures.
type UKIDigests struct {
	// PCR11 maps a TPM bank ("sha256", ...) to PCR 11 after systemd-stub
	// measured the UKI's sections (before any boot phase is extended).
	PCR11 map[string]string `json:"pcr11"`
	// Authenticode is the hex Authenticode sha256 of the PE image, what
	// Secure Boot db entries and PCR 4 record.
	Authenticode string `json:"authenticode_sha256"`
}

// SetUKI records the UKI digests.
func (m *Manifest) SetUKI(d UKIDigests) error { return m.setDigests(DigestsUKI, d) }

// UKI returns the UKI digests.
func (m *Manifest) UKI() (*UKIDigests, error) {
	var d UKIDigests
	if err := m.digests(DigestsUKI, &d, "the build makes c8s.efi"); err != nil {
		return nil, err
	}
	if b, err := hex.DecodeString(d.PCR11["sha256"]); err != nil || len(b) != 32 {
		return nil, fmt.Errorf("manifest: digests.%s.pcr11.sha256 %q is not a hex sha256", DigestsUKI, d.PCR11["sha256"])
	}
	return &d, nil
}

func (m *Manifest) setDigests(key string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if m.Digests == nil {
		m.Digests = map[string]json.RawMessage{}
	}
	m.Digests[key] = raw
	return nil
}

func (m *Manifest) digests(key string, v any, hint string) error {
	raw, ok := m.Digests[key]
	if !ok {
		return fmt.Errorf("manifest: no %q digests: rebuild the image with `make image` (%s)", key, hint)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("manifest: digests.%s: %w", key, err)
	}
	return nil
}

func checkByVCPUs(key string, by map[string]string) error {
	for k, v := range by {
		if n, err := strconv.Atoi(k); err != nil || n < 1 {
			return fmt.Errorf("manifest: digests.%s.by_vcpus: key %q is not a vCPU count", key, k)
		}
		if b, err := hex.DecodeString(v); err != nil || len(b) != 48 {
			return fmt.Errorf("manifest: digests.%s.by_vcpus[%s]: %q is not a SHA-384 hex digest", key, k, v)
		}
	}
	return nil
}

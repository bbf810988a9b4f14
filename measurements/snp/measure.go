package snp

import (
	"errors"
	"fmt"

	"github.com/c8s-dev/c8s/measurements/ovmf"
)

// ErrNoKernelHashesSection is returned when a kernel is to be measured but
// the firmware cannot receive its hashes.
var ErrNoKernelHashesSection = errors.New("kernel given but this firmware has no SNP_KERNEL_HASHES section; use an AmdSevX64 OVMF build for direct kernel boot, or drop --kernel")

// Params are the launch parameters of an SNP guest booting OVMF.
type Params struct {
	// VCPUs is the number of vCPUs (at least 1).
	VCPUs int
	// VCPUSig is the vCPU signature QEMU puts in RDX (see CPUSig and
	// VCPUTypeSig). EC2 and GCE ignore it.
	VCPUSig uint64
	// VMM is the VMM type (VMMQEMU when zero).
	VMM VMMType
	// GuestFeatures is the VMSA SEV_FEATURES value; the reference tool's
	// default is 0x1.
	GuestFeatures uint64
	// Kernel, when non-nil, are the hashes of a direct kernel boot.
	Kernel *KernelHashes
	// OVMFHash, when non-nil, is a precomputed OVMF-only hash (OVMFHash)
	// to start from instead of measuring the firmware's bytes.
	OVMFHash *Digest
}

// OVMFHash returns the launch digest after only the firmware's own pages:
// a seed that stands for the firmware in later computations.
func OVMFHash(fw *ovmf.Firmware) (Digest, error) {
	c := NewLaunchDigest()
	if err := c.UpdateNormalPages(fw.GPA(ovmf.FourGiB), fw.Data); err != nil {
		return Digest{}, fmt.Errorf("snp: measuring the firmware: %w", err)
	}
	return c.Digest(), nil
}

// UpdateMetadataSections measures the firmware's SEV metadata sections as
// the VMM populates them: zero (or, on GCE, unmeasured) pages for
// SNP_SEC_MEM, the secrets and CPUID pages (EC2 adds the CPUID pages last),
// the hashes table page for SNP_KERNEL_HASHES (zero pages without a
// kernel), and zero pages for SVSM_CAA.
func UpdateMetadataSections(c *LaunchDigest, fw *ovmf.Firmware, vmm VMMType, kernel *KernelHashes) error {
	vmm = orQEMU(vmm)
	if kernel != nil && !fw.HasSection(ovmf.SectionSNPKernelHashes) {
		return ErrNoKernelHashesSection
	}
	for _, s := range fw.Sections() {
		gpa, size := uint64(s.GPA), uint64(s.Size)
		var err error
		switch s.Type {
		case ovmf.SectionSNPSecMem:
			if vmm == VMMGCE {
				err = c.UpdateUnmeasuredPages(gpa, size)
			} else {
				err = c.UpdateZeroPages(gpa, size)
			}
		case ovmf.SectionSNPSecrets:
			err = c.UpdateSecretsPage(gpa)
		case ovmf.SectionCPUID:
			if vmm != VMMEC2 {
				err = c.UpdateCPUIDPage(gpa)
			}
		case ovmf.SectionSNPKernelHashes:
			err = updateKernelHashes(c, fw, s, kernel)
		case ovmf.SectionSVSMCAA:
			err = c.UpdateZeroPages(gpa, size)
		default:
			err = fmt.Errorf("snp: firmware SEV metadata section at %#x has unknown type %s", s.GPA, s.Type)
		}
		if err != nil {
			return err
		}
	}
	if vmm == VMMEC2 {
		for _, s := range fw.Sections() {
			if s.Type == ovmf.SectionCPUID {
				if err := c.UpdateCPUIDPage(uint64(s.GPA)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func updateKernelHashes(c *LaunchDigest, fw *ovmf.Firmware, s ovmf.Section, kernel *KernelHashes) error {
	if kernel == nil {
		return c.UpdateZeroPages(uint64(s.GPA), uint64(s.Size))
	}
	if s.Size != PageSize {
		return fmt.Errorf("snp: the firmware's SNP_KERNEL_HASHES section is %#x bytes; only a single 4 KiB page is supported", s.Size)
	}
	area, err := fw.SevHashTable()
	if err != nil {
		return fmt.Errorf("snp: kernel given: %w", err)
	}
	page, err := kernel.Page(int(area.GPA % PageSize))
	if err != nil {
		return err
	}
	return c.UpdateNormalPages(uint64(s.GPA), page)
}

// prefix measures everything before the VMSAs.
func prefix(fw *ovmf.Firmware, p Params) (*LaunchDigest, error) {
	var c *LaunchDigest
	if p.OVMFHash != nil {
		c = LaunchDigestFromSeed(*p.OVMFHash)
	} else {
		c = NewLaunchDigest()
		if err := c.UpdateNormalPages(fw.GPA(ovmf.FourGiB), fw.Data); err != nil {
			return nil, fmt.Errorf("snp: measuring the firmware: %w", err)
		}
	}
	if err := UpdateMetadataSections(c, fw, p.VMM, p.Kernel); err != nil {
		return nil, err
	}
	return c, nil
}

// vmsaPages builds the BSP and AP VMSA pages for p.
func vmsaPages(fw *ovmf.Firmware, p Params, vmm VMMType, features uint64, maxVCPUs int) (bsp, ap []byte, err error) {
	eip, err := fw.SevESResetEIP()
	if err != nil {
		return nil, nil, err
	}
	bsp, err = BSPVMSA(vmm, p.VCPUSig, features)
	if err != nil {
		return nil, nil, err
	}
	if maxVCPUs > 1 {
		if ap, err = APVMSA(vmm, p.VCPUSig, features, eip); err != nil {
			return nil, nil, err
		}
	}
	return bsp, ap, nil
}

// checkCounts validates vCPU counts and returns the largest.
func checkCounts(counts []int) (int, error) {
	if len(counts) == 0 {
		return 0, errors.New("snp: no vCPU count given")
	}
	hi := 0
	for _, n := range counts {
		if n < 1 {
			return 0, fmt.Errorf("snp: %d vCPUs: need at least 1", n)
		}
		hi = max(hi, n)
	}
	return hi, nil
}

// LaunchDigestSNP computes the SNP launch digest of a guest booting the
// firmware fw with parameters p.
func LaunchDigestSNP(fw *ovmf.Firmware, p Params) (Digest, error) {
	return single(LaunchDigestsSNP(fw, p, []int{p.VCPUs}))
}

// LaunchDigestsSNP computes the SNP launch digests for several vCPU counts
// at once (p.VCPUs is ignored): the digests share everything up to the
// VMSAs, so the firmware and kernel are measured once. The result is in
// the order of counts.
func LaunchDigestsSNP(fw *ovmf.Firmware, p Params, counts []int) ([]Digest, error) {
	hi, err := checkCounts(counts)
	if err != nil {
		return nil, err
	}
	bsp, ap, err := vmsaPages(fw, p, orQEMU(p.VMM), p.GuestFeatures, hi)
	if err != nil {
		return nil, err
	}
	c, err := prefix(fw, p)
	if err != nil {
		return nil, err
	}
	return appendVMSAs(c, counts, hi, bsp, ap)
}

// appendVMSAs measures hi VMSA pages (bsp, then ap) and returns the digest
// after each count in counts.
func appendVMSAs(c *LaunchDigest, counts []int, hi int, bsp, ap []byte) ([]Digest, error) {
	return perCount(counts, hi, func(i int) (Digest, error) {
		page := ap
		if i == 1 {
			page = bsp
		}
		err := c.UpdateVMSAPage(page)
		return c.Digest(), err
	})
}

// perCount runs step for vCPUs 1..hi in order (each adds that vCPU's VMSA)
// and returns, in the order of counts, the value after counts[k] vCPUs.
func perCount[T any](counts []int, hi int, step func(vcpu int) (T, error)) ([]T, error) {
	after := make([]T, hi+1)
	for i := 1; i <= hi; i++ {
		d, err := step(i)
		if err != nil {
			return nil, err
		}
		after[i] = d
	}
	out := make([]T, len(counts))
	for k, n := range counts {
		out[k] = after[n]
	}
	return out, nil
}

// single returns the only digest of a one-count computation.
func single[T any](ds []T, err error) (T, error) {
	if err != nil {
		var zero T
		return zero, err
	}
	return ds[0], nil
}

// orQEMU defaults an unset VMM type to QEMU.
func orQEMU(vmm VMMType) VMMType {
	if vmm == 0 {
		return VMMQEMU
	}
	return vmm
}

// SVSMParams are the launch parameters of an SNP guest that boots a
// Coconut-SVSM image below OVMF (QEMU only).
type SVSMParams struct {
	VCPUs   int
	VCPUSig uint64
	// VarsSize is the size of the OVMF variable store mapped between the
	// SVSM image and OVMF.
	VarsSize uint64
}

// LaunchDigestsSVSM computes the SNP launch digests of an SVSM guest for
// several vCPU counts (p.VCPUs is ignored): OVMF ends at 4 GiB, the SVSM
// image ends VarsSize bytes below OVMF, both are measured as normal pages,
// then the SVSM's metadata sections, then one SVSM VMSA per vCPU starting
// at the SVSM entry point.
func LaunchDigestsSVSM(ovmfFw, svsm *ovmf.Firmware, p SVSMParams, counts []int) ([]Digest, error) {
	hi, err := checkCounts(counts)
	if err != nil {
		return nil, err
	}
	ovmfGPA := ovmfFw.GPA(ovmf.FourGiB)
	if uint64(len(ovmfFw.Data)) > ovmf.FourGiB || p.VarsSize+uint64(len(svsm.Data)) > ovmfGPA {
		return nil, fmt.Errorf("snp: OVMF (%d bytes), vars (%d bytes) and SVSM (%d bytes) do not fit below 4 GiB",
			len(ovmfFw.Data), p.VarsSize, len(svsm.Data))
	}
	svsmGPA := svsm.GPA(ovmfGPA - p.VarsSize)
	off, err := svsm.SVSMEntryOffset()
	if err != nil {
		return nil, fmt.Errorf("snp: SVSM image: %w", err)
	}
	c := NewLaunchDigest()
	if err := c.UpdateNormalPages(ovmfGPA, ovmfFw.Data); err != nil {
		return nil, fmt.Errorf("snp: measuring OVMF: %w", err)
	}
	if err := c.UpdateNormalPages(svsmGPA, svsm.Data); err != nil {
		return nil, fmt.Errorf("snp: measuring the SVSM image (is --vars-size a 4 KiB multiple?): %w", err)
	}
	if err := UpdateMetadataSections(c, svsm, VMMQEMU, nil); err != nil {
		return nil, fmt.Errorf("snp: SVSM image: %w", err)
	}
	vmsa := SVSMVMSA(uint64(off)+svsmGPA, p.VCPUSig)
	return appendVMSAs(c, counts, hi, vmsa, vmsa)
}

// LaunchDigestSVSM is LaunchDigestsSVSM for p.VCPUs.
func LaunchDigestSVSM(ovmfFw, svsm *ovmf.Firmware, p SVSMParams) (Digest, error) {
	return single(LaunchDigestsSVSM(ovmfFw, svsm, p, []int{p.VCPUs}))
}

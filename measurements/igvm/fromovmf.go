package igvm

import (
	"errors"
	"fmt"

	"github.com/c8s-dev/c8s/measurements/ovmf"
	"github.com/c8s-dev/c8s/measurements/snp"
)

// DefaultSNPPolicy is the SEV-SNP guest policy FromOVMF writes when none is
// given: QEMU's default (SMT allowed, reserved bit 17 set, no debug).
const DefaultSNPPolicy = 0x30000

// SNPMask is the compatibility mask FromOVMF gives the SEV-SNP platform.
const SNPMask = 1

// OVMFBoot describes a QEMU SEV-SNP guest booting OVMF, optionally with a
// direct kernel boot, for FromOVMF.
type OVMFBoot struct {
	// Firmware is the parsed OVMF image, mapped to end at 4 GiB.
	Firmware *ovmf.Firmware
	// Kernel, when non-nil, are the hashes QEMU puts in the SEV hashes
	// table for -kernel/-initrd/-append.
	Kernel *snp.KernelHashes
	// VCPUs is the number of vCPUs (at least 1).
	VCPUs int
	// VCPUSig is the CPUID signature QEMU puts in RDX (snp.VCPUTypeSig).
	VCPUSig uint64
	// GuestFeatures is the VMSA SEV_FEATURES value (0x1 = SNPActive).
	GuestFeatures uint64
	// Policy is the SEV-SNP guest policy; 0 means DefaultSNPPolicy.
	Policy uint64
}

// FromOVMF returns the IGVM file that loads what QEMU loads for b: the
// firmware's pages at 4 GiB minus its size, then its SEV metadata sections in
// metadata order (zero pages for SNP_SEC_MEM and SVSM_CAA, the secrets page,
// the CPUID page, and the SNP_KERNEL_HASHES page holding QEMU's hashes table
// or zero pages without a kernel), then one VMSA per vCPU: the boot
// processor's at the reset vector, the others at the firmware's SEV-ES reset
// block EIP, each at snp.VMSAGPA. Measured with SNPLaunchDigest (default
// options, b.VCPUs vCPUs), it gives the same digest as
// snp.LaunchDigestSNP for the same boot with VMM QEMU.
//
// Firmware pages are always written with their data, so a firmware page of
// zeros stays a normal page; the metadata's zero pages are PAGE_DATA without
// data.
func FromOVMF(b OVMFBoot) (*File, error) {
	fw := b.Firmware
	if fw == nil {
		return nil, errors.New("igvm: no firmware given")
	}
	if b.VCPUs < 1 {
		return nil, fmt.Errorf("igvm: %d vCPUs; an SEV-SNP guest needs at least 1", b.VCPUs)
	}
	if b.VCPUs > 1<<16 {
		return nil, fmt.Errorf("igvm: %d vCPUs; IGVM VP indexes are 16-bit", b.VCPUs)
	}
	if len(fw.Data) == 0 || len(fw.Data)%PageSize != 0 {
		return nil, fmt.Errorf("igvm: the firmware is %d bytes, not a positive multiple of 4 KiB", len(fw.Data))
	}
	if len(fw.Sections()) == 0 {
		return nil, errors.New("igvm: the firmware has no SEV metadata sections, so it cannot boot as an SEV-SNP guest; use an OVMF built with SEV-SNP support (AmdSevX64 or OvmfPkgX64)")
	}
	if b.Kernel != nil && !fw.HasSection(ovmf.SectionSNPKernelHashes) {
		return nil, snp.ErrNoKernelHashesSection
	}
	policy := b.Policy
	if policy == 0 {
		policy = DefaultSNPPolicy
	}
	f := &File{
		FormatVersion:  FormatVersion1,
		Platform:       []Header{&SupportedPlatform{CompatibilityMask: SNPMask, PlatformType: PlatformSEVSNP, PlatformVersion: 1}},
		Initialization: []Header{&GuestPolicy{Policy: policy, CompatibilityMask: SNPMask}},
	}
	page := func(gpa uint64, t PageDataType, data []byte) {
		f.Directives = append(f.Directives, &PageData{GPA: gpa, CompatibilityMask: SNPMask, DataType: t, Data: data})
	}
	base := fw.GPA(ovmf.FourGiB)
	for off := 0; off < len(fw.Data); off += PageSize {
		page(base+uint64(off), PageDataNormal, fw.Data[off:off+PageSize])
	}
	for _, s := range fw.Sections() {
		gpa, size := uint64(s.GPA), uint64(s.Size)
		if gpa%PageSize != 0 || size%PageSize != 0 {
			return nil, fmt.Errorf("igvm: firmware SEV metadata section %s at %#x (%#x bytes) is not page aligned", s.Type, s.GPA, s.Size)
		}
		zero := func() {
			for off := uint64(0); off < size; off += PageSize {
				page(gpa+off, PageDataNormal, nil)
			}
		}
		switch s.Type {
		case ovmf.SectionSNPSecMem, ovmf.SectionSVSMCAA:
			zero()
		case ovmf.SectionSNPSecrets:
			page(gpa, PageDataSecrets, nil)
		case ovmf.SectionCPUID:
			page(gpa, PageDataCPUIDData, nil)
		case ovmf.SectionSNPKernelHashes:
			if b.Kernel == nil {
				zero()
				break
			}
			if size != PageSize {
				return nil, fmt.Errorf("igvm: the firmware's SNP_KERNEL_HASHES section is %#x bytes; only a single 4 KiB page is supported", size)
			}
			area, err := fw.SevHashTable()
			if err != nil {
				return nil, fmt.Errorf("igvm: kernel given: %w", err)
			}
			data, err := b.Kernel.Page(int(area.GPA % PageSize))
			if err != nil {
				return nil, err
			}
			page(gpa, PageDataNormal, data)
		default:
			return nil, fmt.Errorf("igvm: firmware SEV metadata section at %#x has unknown type %s", s.GPA, s.Type)
		}
	}
	bsp, err := snp.BSPVMSA(snp.VMMQEMU, b.VCPUSig, b.GuestFeatures)
	if err != nil {
		return nil, err
	}
	f.Directives = append(f.Directives, &VPContext{GPA: snp.VMSAGPA, CompatibilityMask: SNPMask, VPIndex: 0, Data: bsp})
	if b.VCPUs > 1 {
		eip, err := fw.SevESResetEIP()
		if err != nil {
			return nil, fmt.Errorf("igvm: %d vCPUs need the firmware's SEV-ES reset block: %w", b.VCPUs, err)
		}
		ap, err := snp.APVMSA(snp.VMMQEMU, b.VCPUSig, b.GuestFeatures, eip)
		if err != nil {
			return nil, err
		}
		for i := 1; i < b.VCPUs; i++ {
			f.Directives = append(f.Directives, &VPContext{GPA: snp.VMSAGPA, CompatibilityMask: SNPMask, VPIndex: uint16(i), Data: ap})
		}
	}
	return f, nil
}

// WriteOVMF is FromOVMF followed by Marshal, for callers that want the file
// bytes (such as the guest image build). It measures the written bytes and
// returns their SEV-SNP launch digest, after checking that it equals
// snp.LaunchDigestSNP for the same boot, so a file is never returned that
// would measure differently from the OVMF boot it stands for.
func WriteOVMF(b OVMFBoot) ([]byte, snp.Digest, error) {
	f, err := FromOVMF(b)
	if err != nil {
		return nil, snp.Digest{}, err
	}
	data, err := Marshal(f)
	if err != nil {
		return nil, snp.Digest{}, err
	}
	parsed, err := Parse(data)
	if err != nil {
		return nil, snp.Digest{}, fmt.Errorf("igvm: internal error: the written file does not parse: %w", err)
	}
	m, err := SNPLaunchDigest(parsed, MeasureOptions{VCPUs: b.VCPUs})
	if err != nil {
		return nil, snp.Digest{}, err
	}
	want, err := snp.LaunchDigestSNP(b.Firmware, snp.Params{VCPUs: b.VCPUs, VCPUSig: b.VCPUSig, VMM: snp.VMMQEMU, GuestFeatures: b.GuestFeatures, Kernel: b.Kernel})
	if err != nil {
		return nil, snp.Digest{}, err
	}
	if m.Digest != want {
		return nil, snp.Digest{}, fmt.Errorf("igvm: internal error: the IGVM file measures %s but the OVMF boot %s", m.Digest, want)
	}
	return data, m.Digest, nil
}

// Package sim defines the launch measurement of c8s's `sim` TEE, for
// machines without SEV-SNP or TDX.
//
// A sim pod VM boots its kernel directly under an ordinary firmware
// (QEMU's SeaBIOS, or whatever hypervisor.firmware names), which has no SEV
// metadata to say where QEMU's kernel hashes go. The sim measurement is
// therefore an SNP launch digest (the SHA-384 PAGE_INFO chain of
// measurements/snp) over a fixed, documented layout of the same inputs an
// SNP launch measures:
//
//  1. the firmware image, as normal pages ending at 4 GiB, where QEMU maps
//     the -bios image;
//  2. QEMU's SEV hashes table (SHA-256 of kernel, initrd and command line,
//     exactly as `kernel-hashes=on` builds it), at offset 0 of one normal
//     page at HashesGPA;
//  3. one VMSA per vCPU, all at the reset vector (SeaBIOS has no SEV-ES
//     AP reset block), for the given vCPU signature and SEV features.
//
// So the digest changes with every byte of firmware, kernel, initrd and
// command line, and with the vCPU count, as a real SNP digest does. It is
// pure: bytes and parameters in, digests out.
package sim

import (
	"errors"
	"fmt"

	"github.com/c8s-dev/c8s/measurements/snp"
)

// HashesGPA is where the sim layout places the kernel hashes page: the
// last page below 8 MiB, which the sim layout reserves for it.
const HashesGPA = 0x7ff000

// DefaultFeatures are the SEV features measured when Params leaves them
// zero (SNP active, as sev-snp-measure's default).
const DefaultFeatures = 0x1

// Params are the inputs of a sim launch.
type Params struct {
	// Firmware is the firmware image mapped below 4 GiB (a multiple of
	// 4 KiB, such as SeaBIOS's 256 KiB bios-256k.bin).
	Firmware []byte
	// Kernel holds the SHA-256 of the kernel, initrd and command line
	// (snp.NewKernelHashes).
	Kernel snp.KernelHashes
	// VCPUSig is the vCPU signature in the VMSAs (snp.VCPUTypeSig).
	VCPUSig uint32
	// Features is SEV_FEATURES (DefaultFeatures when zero).
	Features uint64
}

// LaunchDigests returns the sim launch digest for each vCPU count in
// counts, in that order.
func LaunchDigests(p Params, counts []int) ([]snp.Digest, error) {
	if len(p.Firmware) == 0 {
		return nil, errors.New("sim: no firmware image: the sim measurement covers the -bios image QEMU boots")
	}
	if len(p.Firmware)%snp.PageSize != 0 || len(p.Firmware) > 16<<20 {
		return nil, fmt.Errorf("sim: firmware image of %d bytes: it must be a multiple of 4 KiB and at most 16 MiB", len(p.Firmware))
	}
	hi := 0
	for _, n := range counts {
		if n < 1 || n > 512 {
			return nil, fmt.Errorf("sim: %d vCPUs: the count must be between 1 and 512", n)
		}
		hi = max(hi, n)
	}
	if hi == 0 {
		return nil, errors.New("sim: no vCPU count given")
	}
	features := p.Features
	if features == 0 {
		features = DefaultFeatures
	}
	vmsa, err := snp.BSPVMSA(snp.VMMQEMU, uint64(p.VCPUSig), features)
	if err != nil {
		return nil, err
	}
	c := snp.NewLaunchDigest()
	if err := c.UpdateNormalPages(1<<32-uint64(len(p.Firmware)), p.Firmware); err != nil {
		return nil, err
	}
	page, err := p.Kernel.Page(0)
	if err != nil {
		return nil, err
	}
	if err := c.UpdatePage(snp.PageNormal, HashesGPA, page); err != nil {
		return nil, err
	}
	after := make([]snp.Digest, hi+1)
	for i := 1; i <= hi; i++ {
		if err := c.UpdateVMSAPage(vmsa); err != nil {
			return nil, err
		}
		after[i] = c.Digest()
	}
	out := make([]snp.Digest, len(counts))
	for k, n := range counts {
		out[k] = after[n]
	}
	return out, nil
}

// LaunchDigest returns the sim launch digest for vcpus vCPUs.
func LaunchDigest(p Params, vcpus int) (snp.Digest, error) {
	ds, err := LaunchDigests(p, []int{vcpus})
	if err != nil {
		return snp.Digest{}, err
	}
	return ds[0], nil
}

package snp

import (
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/c8s-dev/c8s/measurements/ovmf"
)

// SEVDigest is an SEV or SEV-ES launch digest (SHA-256).
type SEVDigest [sha256.Size]byte

// String returns the lower-case hex form of d.
func (d SEVDigest) String() string { return fmt.Sprintf("%x", d[:]) }

// ErrNoSevHashTable is returned when a kernel is to be measured under SEV or
// SEV-ES but the firmware reserves no place for QEMU's hashes table.
var ErrNoSevHashTable = errors.New("kernel given but this firmware has no SEV hash table (its SEV_HASH_TABLE_RV entry is missing or 0); use an AmdSevX64 OVMF build for direct kernel boot, or drop --kernel")

// LaunchDigestSEV computes the SEV launch digest: the SHA-256 of the
// firmware followed, for a direct kernel boot, by QEMU's hashes table.
func LaunchDigestSEV(fw *ovmf.Firmware, kernel *KernelHashes) (SEVDigest, error) {
	var d SEVDigest
	if kernel != nil && !fw.SupportsSevHashTable() {
		return d, ErrNoSevHashTable
	}
	h := sha256.New()
	h.Write(fw.Data)
	if kernel != nil {
		h.Write(kernel.Table())
	}
	h.Sum(d[:0])
	return d, nil
}

// SEVESParams are the launch parameters of an SEV-ES guest.
type SEVESParams struct {
	VCPUs   int
	VCPUSig uint64
	// VMM is the VMM type (VMMQEMU when zero).
	VMM    VMMType
	Kernel *KernelHashes
}

// LaunchDigestsSEVES computes the SEV-ES launch digests for several vCPU
// counts (p.VCPUs is ignored): the SHA-256 of the firmware, the hashes
// table for a direct kernel boot, then each vCPU's VMSA page (SEV_FEATURES
// 0).
func LaunchDigestsSEVES(fw *ovmf.Firmware, p SEVESParams, counts []int) ([]SEVDigest, error) {
	hi, err := checkCounts(counts)
	if err != nil {
		return nil, err
	}
	bsp, ap, err := vmsaPages(fw, Params{VCPUSig: p.VCPUSig}, orQEMU(p.VMM), 0, hi)
	if err != nil {
		return nil, err
	}
	if p.Kernel != nil && !fw.SupportsSevHashTable() {
		return nil, ErrNoSevHashTable
	}
	h := sha256.New()
	h.Write(fw.Data)
	if p.Kernel != nil {
		h.Write(p.Kernel.Table())
	}
	return perCount(counts, hi, func(i int) (SEVDigest, error) {
		if i == 1 {
			h.Write(bsp)
		} else {
			h.Write(ap)
		}
		var d SEVDigest
		h.Sum(d[:0])
		return d, nil
	})
}

// LaunchDigestSEVES is LaunchDigestsSEVES for p.VCPUs.
func LaunchDigestSEVES(fw *ovmf.Firmware, p SEVESParams) (SEVDigest, error) {
	return single(LaunchDigestsSEVES(fw, p, []int{p.VCPUs}))
}

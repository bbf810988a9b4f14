package snp

import (
	"crypto/sha512"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"runtime"
	"sync"
)

// PageSize is the size of the pages the launch digest covers.
const PageSize = 4096

// DigestSize is the size of an SNP launch digest (SHA-384).
const DigestSize = sha512.Size384

// Digest is an SNP launch digest or a PAGE_INFO contents hash.
type Digest [DigestSize]byte

// String returns the lower-case hex form of d.
func (d Digest) String() string { return hex.EncodeToString(d[:]) }

// ParseDigest parses a 96-digit hex SHA-384 digest, such as the output of
// the OVMF-only hash.
func ParseDigest(s string) (Digest, error) {
	var d Digest
	b, err := hex.DecodeString(s)
	if err != nil {
		return d, fmt.Errorf("snp: digest %q is not hex: %v", s, err)
	}
	if len(b) != DigestSize {
		return d, fmt.Errorf("snp: digest %q is %d bytes, want %d (SHA-384)", s, len(b), DigestSize)
	}
	copy(d[:], b)
	return d, nil
}

// PageType is the PAGE_TYPE of SNP_LAUNCH_UPDATE (SNP firmware ABI,
// Table "Page Types").
type PageType uint8

// Page types.
const (
	PageNormal     PageType = 0x01
	PageVMSA       PageType = 0x02
	PageZero       PageType = 0x03
	PageUnmeasured PageType = 0x04
	PageSecrets    PageType = 0x05
	PageCPUID      PageType = 0x06
)

// String names the page type.
func (t PageType) String() string {
	switch t {
	case PageNormal:
		return "normal"
	case PageVMSA:
		return "vmsa"
	case PageZero:
		return "zero"
	case PageUnmeasured:
		return "unmeasured"
	case PageSecrets:
		return "secrets"
	case PageCPUID:
		return "cpuid"
	}
	return fmt.Sprintf("pagetype(%#x)", uint8(t))
}

// VMSAGPA is the GPA a VMSA page is measured at: the RMP records it at
// (u64)-1, page aligned with the bits above 51 cleared.
const VMSAGPA = 0xFFFFFFFFF000

// pageInfoSize is sizeof(PAGE_INFO).
const pageInfoSize = 0x70

// PageInfo is the PAGE_INFO structure (SNP firmware ABI, "Layout of the
// PAGE_INFO structure") minus the running digest it chains from.
type PageInfo struct {
	// Contents is the SHA-384 of the page for normal and VMSA pages and
	// zero for every other page type.
	Contents Digest
	Type     PageType
	// IsIMI marks a page added by an incoming migration image.
	IsIMI bool
	// VMPL3Perms, VMPL2Perms and VMPL1Perms are the RMP permission masks
	// granted to the lower VMPLs.
	VMPL3Perms, VMPL2Perms, VMPL1Perms uint8
	GPA                                uint64
}

// LaunchDigest is the running SNP launch digest: each page added to the
// guest extends it as digest = SHA-384(PAGE_INFO), where PAGE_INFO starts
// with the previous digest. The zero value is not ready; use
// NewLaunchDigest or LaunchDigestFromSeed. A LaunchDigest is not safe for
// concurrent use.
type LaunchDigest struct {
	ld  Digest
	buf [pageInfoSize]byte
}

// NewLaunchDigest returns a launch digest starting from all zeros, the
// state of a fresh SNP_LAUNCH_START.
func NewLaunchDigest() *LaunchDigest { return &LaunchDigest{} }

// LaunchDigestFromSeed returns a launch digest that continues from seed, for
// example a precomputed OVMF-only hash (see OVMFHash).
func LaunchDigestFromSeed(seed Digest) *LaunchDigest { return &LaunchDigest{ld: seed} }

// Clone returns an independent copy of the current state.
func (c *LaunchDigest) Clone() *LaunchDigest {
	d := *c
	return &d
}

// Digest returns the current launch digest.
func (c *LaunchDigest) Digest() Digest { return c.ld }

// UpdatePageInfo extends the digest with one PAGE_INFO. It is the primitive
// every other update method uses.
func (c *LaunchDigest) UpdatePageInfo(pi PageInfo) {
	b := c.buf[:]
	copy(b[0:48], c.ld[:])
	copy(b[48:96], pi.Contents[:])
	binary.LittleEndian.PutUint16(b[96:], pageInfoSize)
	b[98] = byte(pi.Type)
	b[99] = 0
	if pi.IsIMI {
		b[99] = 1
	}
	b[100] = pi.VMPL3Perms
	b[101] = pi.VMPL2Perms
	b[102] = pi.VMPL1Perms
	b[103] = 0
	binary.LittleEndian.PutUint64(b[104:], pi.GPA)
	c.ld = sha512.Sum384(b)
}

// Update extends the digest with one page of type t at gpa whose PAGE_INFO
// contents field is contents (the page's SHA-384 for normal and VMSA pages,
// zero otherwise).
func (c *LaunchDigest) Update(t PageType, gpa uint64, contents Digest) {
	c.UpdatePageInfo(PageInfo{Contents: contents, Type: t, GPA: gpa})
}

// UpdatePage extends the digest with one 4 KiB page of type t at gpa.
// For PageNormal and PageVMSA, page holds the page's bytes: at most
// PageSize, a shorter page being zero-padded as the hardware sees it. For
// every other type the contents are not measured and page must be empty.
// gpa must be page aligned.
func (c *LaunchDigest) UpdatePage(t PageType, gpa uint64, page []byte) error {
	if gpa%PageSize != 0 {
		return fmt.Errorf("snp: %s page GPA %#x is not 4 KiB aligned", t, gpa)
	}
	switch t {
	case PageNormal, PageVMSA:
		if len(page) > PageSize {
			return fmt.Errorf("snp: %s page at %#x has %d bytes, more than a 4 KiB page", t, gpa, len(page))
		}
		c.Update(t, gpa, HashPage(page))
	case PageZero, PageUnmeasured, PageSecrets, PageCPUID:
		if len(page) != 0 {
			return fmt.Errorf("snp: %s page at %#x: contents of this page type are not measured, pass none", t, gpa)
		}
		c.Update(t, gpa, Digest{})
	default:
		return fmt.Errorf("snp: unknown page type %#x at %#x", uint8(t), gpa)
	}
	return nil
}

// HashPage returns the SHA-384 of a 4 KiB page whose first len(page) bytes
// are page and the rest zero. page must not exceed PageSize.
func HashPage(page []byte) Digest {
	if len(page) == PageSize {
		return sha512.Sum384(page)
	}
	var full [PageSize]byte
	copy(full[:], page)
	return sha512.Sum384(full[:])
}

// parallelThreshold is the size above which UpdateNormalPages hashes pages
// on several goroutines. The chain itself stays sequential.
const parallelThreshold = 256 * PageSize

// UpdateNormalPages measures data as consecutive normal pages from gpa.
// len(data) must be a multiple of 4 KiB.
func (c *LaunchDigest) UpdateNormalPages(gpa uint64, data []byte) error {
	if len(data)%PageSize != 0 {
		return fmt.Errorf("snp: %d bytes of normal pages at %#x is not a multiple of 4 KiB", len(data), gpa)
	}
	if gpa%PageSize != 0 {
		return fmt.Errorf("snp: normal pages GPA %#x is not 4 KiB aligned", gpa)
	}
	for _, h := range hashPages(data) {
		c.Update(PageNormal, gpa, h)
		gpa += PageSize
	}
	return nil
}

// hashPages returns the SHA-384 of every 4 KiB page of data, using all
// available CPUs for large inputs.
func hashPages(data []byte) []Digest {
	n := len(data) / PageSize
	hashes := make([]Digest, n)
	workers := runtime.GOMAXPROCS(0)
	if len(data) < parallelThreshold || workers < 2 {
		for i := range hashes {
			hashes[i] = sha512.Sum384(data[i*PageSize : (i+1)*PageSize])
		}
		return hashes
	}
	var wg sync.WaitGroup
	per := (n + workers - 1) / workers
	for lo := 0; lo < n; lo += per {
		hi := min(lo+per, n)
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			for i := lo; i < hi; i++ {
				hashes[i] = sha512.Sum384(data[i*PageSize : (i+1)*PageSize])
			}
		}(lo, hi)
	}
	wg.Wait()
	return hashes
}

func (c *LaunchDigest) updateEmptyPages(t PageType, gpa, length uint64) error {
	if length%PageSize != 0 || gpa%PageSize != 0 {
		return fmt.Errorf("snp: %s pages at %#x, length %#x: GPA and length must be 4 KiB multiples", t, gpa, length)
	}
	for off := uint64(0); off < length; off += PageSize {
		c.Update(t, gpa+off, Digest{})
	}
	return nil
}

// UpdateZeroPages measures length bytes of zero pages from gpa. Both must
// be 4 KiB multiples.
func (c *LaunchDigest) UpdateZeroPages(gpa, length uint64) error {
	return c.updateEmptyPages(PageZero, gpa, length)
}

// UpdateUnmeasuredPages measures length bytes of unmeasured pages from gpa.
// Both must be 4 KiB multiples.
func (c *LaunchDigest) UpdateUnmeasuredPages(gpa, length uint64) error {
	return c.updateEmptyPages(PageUnmeasured, gpa, length)
}

// UpdateSecretsPage measures the secrets page at gpa.
func (c *LaunchDigest) UpdateSecretsPage(gpa uint64) error {
	return c.UpdatePage(PageSecrets, gpa, nil)
}

// UpdateCPUIDPage measures the CPUID page at gpa.
func (c *LaunchDigest) UpdateCPUIDPage(gpa uint64) error {
	return c.UpdatePage(PageCPUID, gpa, nil)
}

// UpdateVMSAPage measures one VMSA page (see BuildVMSA), at VMSAGPA.
func (c *LaunchDigest) UpdateVMSAPage(vmsa []byte) error {
	if len(vmsa) != PageSize {
		return fmt.Errorf("snp: VMSA page has %d bytes, want %d", len(vmsa), PageSize)
	}
	c.Update(PageVMSA, VMSAGPA, sha512.Sum384(vmsa))
	return nil
}

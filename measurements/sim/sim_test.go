package sim

import (
	"bytes"
	"crypto/sha512"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/measurements/snp"
)

func params(t *testing.T) Params {
	t.Helper()
	fw := bytes.Repeat([]byte("SeaBIOS!"), 2*snp.PageSize/8)
	sig, err := snp.VCPUTypeSig("EPYC-v4")
	if err != nil {
		t.Fatal(err)
	}
	return Params{
		Firmware: fw,
		Kernel:   snp.NewKernelHashes([]byte("kernel"), []byte("initrd"), "console=ttyS0"),
		VCPUSig:  sig,
	}
}

// pageInfo hashes one PAGE_INFO as the SNP ABI lays it out (written here
// from the ABI, independently of measurements/snp).
func pageInfo(cur [48]byte, contents [48]byte, pageType byte, gpa uint64) [48]byte {
	var b [0x70]byte
	copy(b[0:], cur[:])
	copy(b[48:], contents[:])
	binary.LittleEndian.PutUint16(b[96:], 0x70)
	b[98] = pageType
	binary.LittleEndian.PutUint64(b[104:], gpa)
	return sha512.Sum384(b[:])
}

func TestLayoutMatchesTheDocumentedPageSequence(t *testing.T) {
	p := params(t)
	vmsa, err := snp.BSPVMSA(snp.VMMQEMU, uint64(p.VCPUSig), DefaultFeatures)
	if err != nil {
		t.Fatal(err)
	}
	var d [48]byte
	base := uint64(1<<32 - len(p.Firmware))
	for off := 0; off < len(p.Firmware); off += snp.PageSize {
		d = pageInfo(d, sha512.Sum384(p.Firmware[off:off+snp.PageSize]), 1, base+uint64(off))
	}
	hashes, _ := p.Kernel.Page(0)
	d = pageInfo(d, sha512.Sum384(hashes), 1, HashesGPA)
	const vmsaGPA = 0xFFFFFFFFF000 // where SNP measures VMSAs
	one := pageInfo(d, sha512.Sum384(vmsa), 2, vmsaGPA)
	two := pageInfo(one, sha512.Sum384(vmsa), 2, vmsaGPA)

	got, err := LaunchDigests(p, []int{2, 1})
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != snp.Digest(two) || got[1] != snp.Digest(one) {
		t.Fatalf("sim digests\n got %s, %s\nwant %x, %x", got[0], got[1], two, one)
	}
}

func TestEveryInputChangesTheDigest(t *testing.T) {
	base, err := LaunchDigest(params(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	changes := map[string]func(*Params){
		"firmware byte": func(p *Params) { p.Firmware = append([]byte(nil), p.Firmware...); p.Firmware[100] ^= 1 },
		"kernel":        func(p *Params) { p.Kernel = snp.NewKernelHashes([]byte("kernel2"), []byte("initrd"), "console=ttyS0") },
		"initrd":        func(p *Params) { p.Kernel = snp.NewKernelHashes([]byte("kernel"), []byte("initrd2"), "console=ttyS0") },
		"cmdline":       func(p *Params) { p.Kernel = snp.NewKernelHashes([]byte("kernel"), []byte("initrd"), "console=ttyS1") },
		"features":      func(p *Params) { p.Features = 0x21 },
		"vcpu type":     func(p *Params) { p.VCPUSig, _ = snp.VCPUTypeSig("EPYC-Milan") },
	}
	for name, change := range changes {
		p := params(t)
		change(&p)
		d, err := LaunchDigest(p, 1)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if d == base {
			t.Errorf("changing the %s left the digest unchanged", name)
		}
	}
	if two, _ := LaunchDigest(params(t), 2); two == base {
		t.Error("the vCPU count does not change the digest")
	}
}

func TestBadInput(t *testing.T) {
	p := params(t)
	for name, tc := range map[string]struct {
		p      Params
		counts []int
		want   string
	}{
		"no firmware":    {Params{Kernel: p.Kernel}, []int{1}, "no firmware"},
		"odd firmware":   {Params{Firmware: make([]byte, 100), Kernel: p.Kernel}, []int{1}, "multiple of 4 KiB"},
		"zero vCPUs":     {p, []int{0}, "between 1 and 512"},
		"no vCPU counts": {p, nil, "no vCPU count"},
	} {
		if _, err := LaunchDigests(tc.p, tc.counts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one containing %q", name, err, tc.want)
		}
	}
}

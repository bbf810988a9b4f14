package snp

import (
	"crypto/sha256"
	"crypto/sha512"
	"os"
	"testing"

	"github.com/c8s-dev/c8s/measurements/ovmf"
)

// Benchmarks of the SNP digest. BenchmarkSNPOVMFFull measures Debian's
// full-size OvmfPkgX64 image (/usr/share/ovmf/OVMF.fd, 2 MiB, no kernel
// hashes section). A full-size AmdSevX64 image is not available here, so
// BenchmarkSNPKernel measures the AmdSev fixture suffix with a synthetic
// 8 MiB kernel and 32 MiB initrd, hashing included: the cost of a direct
// kernel boot measurement is dominated by those hashes. The Floor
// benchmarks hash the same bytes without anything else, for comparison.

const (
	benchKernelSize = 8 << 20
	benchInitrdSize = 32 << 20
)

func benchInputs() (kernel, initrd []byte) {
	kernel = make([]byte, benchKernelSize)
	initrd = make([]byte, benchInitrdSize)
	for i := range kernel {
		kernel[i] = byte(i>>8) ^ byte(i)
	}
	for i := range initrd {
		initrd[i] = byte(i>>12) + byte(i)
	}
	return kernel, initrd
}

func BenchmarkSNPOVMFFull(b *testing.B) {
	data, err := os.ReadFile("/usr/share/ovmf/OVMF.fd")
	if err != nil {
		b.Skipf("full-size OVMF not available: %v", err)
	}
	fw, err := ovmf.Parse(data)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := LaunchDigestSNP(fw, Params{VCPUs: 8, VCPUSig: epycV4, GuestFeatures: 1}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSNPOVMFFullFloorSHA384(b *testing.B) {
	data, err := os.ReadFile("/usr/share/ovmf/OVMF.fd")
	if err != nil {
		b.Skipf("full-size OVMF not available: %v", err)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		sha512.Sum384(data)
	}
}

func BenchmarkSNPKernel(b *testing.B) {
	amd := loadFW(b, "ovmf_AmdSev_suffix.bin")
	kernel, initrd := benchInputs()
	b.SetBytes(int64(len(amd.Data) + len(kernel) + len(initrd)))
	for b.Loop() {
		k := NewKernelHashes(kernel, initrd, "console=ttyS0")
		if _, err := LaunchDigestSNP(amd, Params{VCPUs: 8, VCPUSig: epycV4, GuestFeatures: 1, Kernel: &k}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSNPKernelFloorSHA256 is the hashing the kernel case cannot avoid.
func BenchmarkSNPKernelFloorSHA256(b *testing.B) {
	kernel, initrd := benchInputs()
	b.SetBytes(int64(len(kernel) + len(initrd)))
	for b.Loop() {
		sha256.Sum256(kernel)
		sha256.Sum256(initrd)
	}
}

// BenchmarkSNPKernelFloorSHA384 hashes the same bytes with SHA-384.
func BenchmarkSNPKernelFloorSHA384(b *testing.B) {
	kernel, initrd := benchInputs()
	b.SetBytes(int64(len(kernel) + len(initrd)))
	for b.Loop() {
		sha512.Sum384(kernel)
		sha512.Sum384(initrd)
	}
}

package igvm

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/measurements/internal/fixtures"
	"github.com/c8s-dev/c8s/measurements/ovmf"
	"github.com/c8s-dev/c8s/measurements/snp"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// goldenIGVM is the IGVM file FromOVMF writes for the AmdSev fixture with
// kernel = initrd = empty, append "console=ttyS0 loglevel=7", 1 vCPU,
// EPYC-v4, features 0x1. It is also a seed of FuzzParse.
const goldenIGVM = "testdata/amdsev-kc-1vcpu.igvm"

func firmware(t *testing.T, name string) *ovmf.Firmware {
	t.Helper()
	fw, err := ovmf.Parse(fixtures.Read(t, "snp", name))
	if err != nil {
		t.Fatal(err)
	}
	return fw
}

func epycV4(t *testing.T) uint64 {
	t.Helper()
	sig, err := snp.VCPUTypeSig("EPYC-v4")
	if err != nil {
		t.Fatal(err)
	}
	return uint64(sig)
}

// TestFromOVMFVectors writes IGVM files for the published sev-snp-measure
// vectors and checks that measuring them gives both the published digest and
// the snp package's digest for the same OVMF boot.
func TestFromOVMFVectors(t *testing.T) {
	empty := snp.NewKernelHashes(nil, nil, "")
	kc := snp.NewKernelHashes(nil, nil, "console=ttyS0 loglevel=7")
	cases := []struct {
		fixture  string
		vcpus    int
		kernel   *snp.KernelHashes
		features uint64
		want     string
	}{
		{"ovmf_AmdSev_suffix.bin", 1, &kc, 0x1, "6d287813eb5222d770f75005c664e34c204f385ce832cc2ce7d0d6f354454362f390ef83a92046c042e706363b4b08fa"},
		{"ovmf_AmdSev_suffix.bin", 1, &kc, 0x21, "803f691094946e42068aaa3a8f9e26a5c89f36f7b73ecfb28c653360fe4b3aba7e534442e7e1e17895dfe778d0228977"},
		{"ovmf_AmdSev_suffix.bin", 1, &empty, 0x1, "ddc5224521617a536ee7ce9dd6224d1b58a8d4fda1c741f3ac99fc4bfa04ba6e9fc98646d4a07a9079397fa3852819b5"},
		{"ovmf_AmdSev_suffix.bin", 4, &empty, 0x21, "4953b1fb416fa874980e8442b3706d345926d5f38879134e00813c5d7abcbe78eafe7b422907be0b4698e2414a631942"},
		{"ovmf_AmdSev_suffix.bin", 4, &empty, 0x1, "5061fffb019493a903613d56d54b94912a1a2f9e4502385f5c194616753720a92441310ba6c4933de877c36e23046ad5"},
		{"ovmf_AmdSev_suffix.bin", 1, nil, 0x21, "e1e1ca029dd7973ab9513295be68198472dcd4fc834bd9af9b63f6e8a1674dbf281a9278a4a2ebe0eed9f22adbcd0e2b"},
		{"ovmf_OvmfX64_suffix.bin", 1, nil, 0x1, "da0296de8193586a5512078dcd719eccecbd87e2b825ad4148c44f665dc87df21e5b49e21523a9ad993afdb6a30b4005"},
	}
	sig := epycV4(t)
	for _, c := range cases {
		fw := firmware(t, c.fixture)
		boot := OVMFBoot{Firmware: fw, Kernel: c.kernel, VCPUs: c.vcpus, VCPUSig: sig, GuestFeatures: c.features}
		f, err := FromOVMF(boot)
		if err != nil {
			t.Fatal(err)
		}
		m := measureBytes(t, f, MeasureOptions{})
		ref, err := snp.LaunchDigestSNP(fw, snp.Params{VCPUs: c.vcpus, VCPUSig: sig, VMM: snp.VMMQEMU, GuestFeatures: c.features, Kernel: c.kernel})
		if err != nil {
			t.Fatal(err)
		}
		if m.Digest.String() != c.want || ref.String() != c.want {
			t.Errorf("%s %d vCPUs kernel=%v features %#x: IGVM %s, snp %s, published %s", c.fixture, c.vcpus, c.kernel != nil, c.features, m.Digest, ref, c.want)
		}
		if len(m.VMSAs) != c.vcpus {
			t.Errorf("%d VMSAs measured, want %d", len(m.VMSAs), c.vcpus)
		}
		// igvmmeasure measures the same file to the same digest: the VMSAs
		// are last and at the GPA KVM uses.
		if im := measureBytes(t, f, MeasureOptions{Loader: LoaderIGVMMeasure}); im.Digest != m.Digest {
			t.Errorf("igvmmeasure rules give %s, qemu rules %s", im.Digest, m.Digest)
		}
	}
}

// TestFromOVMFGolden compares the written file with the golden one.
func TestFromOVMFGolden(t *testing.T) {
	kc := snp.NewKernelHashes(nil, nil, "console=ttyS0 loglevel=7")
	b, digest, err := WriteOVMF(OVMFBoot{Firmware: firmware(t, "ovmf_AmdSev_suffix.bin"), Kernel: &kc, VCPUs: 1, VCPUSig: epycV4(t), GuestFeatures: 1})
	if err != nil {
		t.Fatal(err)
	}
	if want := "6d287813eb5222d770f75005c664e34c204f385ce832cc2ce7d0d6f354454362f390ef83a92046c042e706363b4b08fa"; digest.String() != want {
		t.Errorf("WriteOVMF digest %s, want %s", digest, want)
	}
	if *update {
		if err := os.MkdirAll(filepath.Dir(goldenIGVM), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(goldenIGVM, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(goldenIGVM)
	if err != nil {
		t.Fatalf("%v (run go test ./measurements/igvm -update to create it)", err)
	}
	if !bytes.Equal(b, want) {
		t.Errorf("FromOVMF output differs from %s (run with -update if the change is intended)", goldenIGVM)
	}
	g, err := Parse(want)
	if err != nil {
		t.Fatal(err)
	}
	// 1 firmware page, 0x9000+0x3000+0xf000 of SNP_SEC_MEM, secrets, CPUID,
	// CAA and the hashes page, then the BSP VMSA.
	if n := len(g.Directives); n != 1+9+3+15+4+1 {
		t.Errorf("%d directives", n)
	}
}

// TestFromOVMFRealKernel measures a direct boot of the host's kernel both
// ways.
func TestFromOVMFRealKernel(t *testing.T) {
	kernels, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(kernels) == 0 {
		t.Skip("no /boot/vmlinuz-* on this machine (install linux-image-amd64)")
	}
	kernel, err := os.ReadFile(kernels[0])
	if err != nil {
		t.Fatal(err)
	}
	initrd := bytes.Repeat([]byte("initrd"), 1000)
	k := snp.NewKernelHashes(kernel, initrd, "console=ttyS0 root=/dev/vda")
	fw := firmware(t, "ovmf_AmdSev_suffix.bin")
	for _, vcpus := range []int{1, 2} {
		f, err := FromOVMF(OVMFBoot{Firmware: fw, Kernel: &k, VCPUs: vcpus, VCPUSig: epycV4(t), GuestFeatures: 0x21})
		if err != nil {
			t.Fatal(err)
		}
		ref, err := snp.LaunchDigestSNP(fw, snp.Params{VCPUs: vcpus, VCPUSig: epycV4(t), VMM: snp.VMMQEMU, GuestFeatures: 0x21, Kernel: &k})
		if err != nil {
			t.Fatal(err)
		}
		if got := measureBytes(t, f, MeasureOptions{}).Digest; got != ref {
			t.Errorf("%s, %d vCPUs: IGVM %s, snp %s", kernels[0], vcpus, got, ref)
		}
	}
}

// TestFromOVMFDebianFirmware writes the IGVM file of Debian's whole 2 MiB
// OvmfPkgX64 image (no kernel: it has no SNP_KERNEL_HASHES section).
func TestFromOVMFDebianFirmware(t *testing.T) {
	const path = "/usr/share/ovmf/OVMF.fd"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Skipf("%v (install the ovmf package)", err)
	}
	fw, err := ovmf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, vcpus := range []int{1, 3} {
		b, digest, err := WriteOVMF(OVMFBoot{Firmware: fw, VCPUs: vcpus, VCPUSig: epycV4(t), GuestFeatures: 1})
		if err != nil {
			t.Fatal(err)
		}
		ref, err := snp.LaunchDigestSNP(fw, snp.Params{VCPUs: vcpus, VCPUSig: epycV4(t), VMM: snp.VMMQEMU, GuestFeatures: 1})
		if err != nil {
			t.Fatal(err)
		}
		if digest != ref {
			t.Errorf("%d vCPUs: IGVM %s, snp %s", vcpus, digest, ref)
		}
		f, err := Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := SNPLaunchDigest(f, MeasureOptions{}); err != nil || m.Digest != ref || m.Pages[snp.PageNormal] != len(data)/PageSize {
			t.Errorf("%d vCPUs: measuring the file: %v, %v", vcpus, m, err)
		}
	}
}

func TestFromOVMFErrors(t *testing.T) {
	k := snp.NewKernelHashes(nil, nil, "")
	x64 := firmware(t, "ovmf_OvmfX64_suffix.bin")
	if _, err := FromOVMF(OVMFBoot{Firmware: x64, Kernel: &k, VCPUs: 1}); err != snp.ErrNoKernelHashesSection {
		t.Errorf("OvmfX64 with a kernel: %v", err)
	}
	if _, err := FromOVMF(OVMFBoot{Firmware: x64, VCPUs: 0}); err == nil || !strings.Contains(err.Error(), "at least 1") {
		t.Errorf("0 vCPUs: %v", err)
	}
	if _, err := FromOVMF(OVMFBoot{VCPUs: 1}); err == nil {
		t.Error("no firmware accepted")
	}
}

package snp

import (
	"errors"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/measurements/internal/fixtures"
	"github.com/c8s-dev/c8s/measurements/ovmf"
)

// The expected values in this file are the published test expectations of
// virtee/sev-snp-measure v0.0.13 and google/gce-tcb-verifier, as listed in
// testdata/snp/VECTORS.md.

const cmdlineC = "console=ttyS0 loglevel=7"

func loadFW(t testing.TB, name string) *ovmf.Firmware {
	t.Helper()
	fw, err := ovmf.Parse(fixtures.Read(t, "snp", name))
	if err != nil {
		t.Fatalf("parse %s: %v", name, err)
	}
	return fw
}

// emptyKernel is "K": kernel = initrd = an empty file, with cmdline.
func emptyKernel(cmdline string) *KernelHashes {
	k := NewKernelHashes(nil, nil, cmdline)
	return &k
}

var epycV4 = uint64(mustSig("EPYC-v4"))

func mustSig(name string) uint32 {
	s, err := VCPUTypeSig(name)
	if err != nil {
		panic(err)
	}
	return s
}

func TestSNPVectors(t *testing.T) {
	amd := loadFW(t, "ovmf_AmdSev_suffix.bin")
	x64 := loadFW(t, "ovmf_OvmfX64_suffix.bin")
	cases := []struct {
		name     string
		fw       *ovmf.Firmware
		vcpus    int
		vmm      VMMType
		sig      uint64
		kernel   *KernelHashes
		features uint64
		want     string
	}{
		{"AmdSev/1/K,C/0x21", amd, 1, VMMQEMU, epycV4, emptyKernel(cmdlineC), 0x21, "803f691094946e42068aaa3a8f9e26a5c89f36f7b73ecfb28c653360fe4b3aba7e534442e7e1e17895dfe778d0228977"},
		{"AmdSev/1/K,C/0x1", amd, 1, VMMQEMU, epycV4, emptyKernel(cmdlineC), 0x1, "6d287813eb5222d770f75005c664e34c204f385ce832cc2ce7d0d6f354454362f390ef83a92046c042e706363b4b08fa"},
		{"AmdSev/1/K/0x21", amd, 1, VMMQEMU, epycV4, emptyKernel(""), 0x21, "329c8ce0972ae52343b64d34a434a86f245dfd74f5ed7aae15d22efc78fb9683632b9b50e4e1d7fa41179ef98a7ef198"},
		{"AmdSev/1/K/0x1", amd, 1, VMMQEMU, epycV4, emptyKernel(""), 0x1, "ddc5224521617a536ee7ce9dd6224d1b58a8d4fda1c741f3ac99fc4bfa04ba6e9fc98646d4a07a9079397fa3852819b5"},
		{"AmdSev/1/nokernel/0x21", amd, 1, VMMQEMU, epycV4, nil, 0x21, "e1e1ca029dd7973ab9513295be68198472dcd4fc834bd9af9b63f6e8a1674dbf281a9278a4a2ebe0eed9f22adbcd0e2b"},
		{"AmdSev/1/nokernel/0x1", amd, 1, VMMQEMU, epycV4, nil, 0x1, "19358ba9a7615534a9a1e2f0dfc29384dcd4dcb7062ff9c6013b26869a5fc6ecabe033c48dd6f6db5d6d76e7c5df632d"},
		{"AmdSev/4/K/0x21", amd, 4, VMMQEMU, epycV4, emptyKernel(""), 0x21, "4953b1fb416fa874980e8442b3706d345926d5f38879134e00813c5d7abcbe78eafe7b422907be0b4698e2414a631942"},
		{"AmdSev/4/K/0x1", amd, 4, VMMQEMU, epycV4, emptyKernel(""), 0x1, "5061fffb019493a903613d56d54b94912a1a2f9e4502385f5c194616753720a92441310ba6c4933de877c36e23046ad5"},
		{"AmdSev/1/ec2/K/0x21", amd, 1, VMMEC2, epycV4, emptyKernel(""), 0x21, "0ce9ccc06bab55eebe8abc234f3df6514883977a68a591b71052498ab52b2f1aa415db338033946ef93aa8278c0d67fb"},
		{"AmdSev/1/ec2/K/0x1", amd, 1, VMMEC2, epycV4, emptyKernel(""), 0x1, "0883bd0eeb716e65b7b977a321c278d1e51b33b5c655fab985443bbcc65c086b9c15e8a0bd8811050dec7e24964e5056"},
		{"AmdSev/1/gce/K/0x1", amd, 1, VMMGCE, 0, emptyKernel(""), 0x1, "5da7106cf14cf46b1725ebab123eb9e53bd46a1e9f400cd0c08e7827b04b688ea8b4e403c8404efed4397ea5d5d0722e"},
		{"AmdSev/4/gce/K/0x1", amd, 4, VMMGCE, 0, emptyKernel(""), 0x1, "5c5debf100fc339f90276e761ee1f1658d08922c3b20e2a2e6c7a6c3370b2452a15a00eae11886a93d6fd1e7ab81e29d"},
		{"OvmfX64/1/nokernel/0x21", x64, 1, VMMQEMU, epycV4, nil, 0x21, "28797ae0afaba4005a81e629acebfb59e6687949d6be44007cd5506823b0dd66f146aaae26ff291eed7b493d8a64c385"},
		{"OvmfX64/1/nokernel/0x1", x64, 1, VMMQEMU, epycV4, nil, 0x1, "da0296de8193586a5512078dcd719eccecbd87e2b825ad4148c44f665dc87df21e5b49e21523a9ad993afdb6a30b4005"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := Params{VCPUs: c.vcpus, VCPUSig: c.sig, VMM: c.vmm, GuestFeatures: c.features, Kernel: c.kernel}
			got, err := LaunchDigestSNP(c.fw, p)
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != c.want {
				t.Errorf("launch digest = %s\nwant             %s", got, c.want)
			}
		})
	}
}

func TestSVSMVectors(t *testing.T) {
	ovmfFw := loadFW(t, "svsm_ovmf.fd")
	svsm := loadFW(t, "svsm.bin")
	p := SVSMParams{VCPUSig: epycV4, VarsSize: 540672}
	got, err := LaunchDigestsSVSM(ovmfFw, svsm, p, []int{4, 2})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"27d154c27b7b359c935e250ec6fee72aa0ae8c1225e3b0e1cf46a9567e938066d7d6f94bbdc4a857818bdb79277a44b2",
		"9b94745036aafddf4f7f8b00c7513abb5b7703178cb95aaa57928bd963d68d3bfcb715d6019b9167ee2517b11b0d9be7",
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("SVSM digest %d = %s, want %s", i, got[i], want[i])
		}
	}
}

func TestOVMFHashVector(t *testing.T) {
	amd := loadFW(t, "ovmf_AmdSev_suffix.bin")
	h, err := OVMFHash(amd)
	if err != nil {
		t.Fatal(err)
	}
	const want = "086e2e9149ebf45abdc3445fba5b2da8270bdbb04094d7a2c37faaa4b24af3aa16aff8c374c2a55c467a50da6d466b74"
	if h.String() != want {
		t.Fatalf("OVMF hash = %s, want %s", h, want)
	}
	// The seed stands for the firmware: the rest of the chain must give the
	// same digest as measuring the firmware's bytes.
	p := Params{VCPUs: 4, VCPUSig: epycV4, GuestFeatures: 0x21, Kernel: emptyKernel("")}
	full, err := LaunchDigestSNP(amd, p)
	if err != nil {
		t.Fatal(err)
	}
	p.OVMFHash = &h
	seeded, err := LaunchDigestSNP(amd, p)
	if err != nil {
		t.Fatal(err)
	}
	if seeded != full {
		t.Errorf("seeded digest %s differs from full digest %s", seeded, full)
	}
}

func TestOvmfX64KernelFails(t *testing.T) {
	x64 := loadFW(t, "ovmf_OvmfX64_suffix.bin")
	_, err := LaunchDigestSNP(x64, Params{VCPUs: 1, VCPUSig: epycV4, GuestFeatures: 1, Kernel: emptyKernel("")})
	if !errors.Is(err, ErrNoKernelHashesSection) {
		t.Fatalf("err = %v, want ErrNoKernelHashesSection", err)
	}
	if !strings.Contains(err.Error(), "kernel given but this firmware has no SNP_KERNEL_HASHES section") {
		t.Errorf("error message %q does not name the missing section", err)
	}
	if _, err := LaunchDigestSEV(x64, emptyKernel("")); !errors.Is(err, ErrNoSevHashTable) {
		t.Errorf("SEV with kernel on OvmfX64: err = %v, want ErrNoSevHashTable", err)
	}
}

func TestSEVVectors(t *testing.T) {
	amd := loadFW(t, "ovmf_AmdSev_suffix.bin")
	x64 := loadFW(t, "ovmf_OvmfX64_suffix.bin")
	// "kernel only": an empty kernel, no initrd, no --append.
	kernelOnly := NewKernelHashes(nil, nil, "")
	cases := []struct {
		name   string
		fw     *ovmf.Firmware
		kernel *KernelHashes
		want   string
	}{
		{"AmdSev/K,C", amd, emptyKernel(cmdlineC), "82a3ee5d537c3620628270c292ae30cb40c3c878666a7890ee7ef2a08fb535ff"},
		{"AmdSev/kernel only", amd, &kernelOnly, "77f613d7bbcdf12a73782ea9e88b0172aeda50d1a54201cb903594ff52846898"},
		{"OvmfX64/no kernel", x64, nil, "b4c021e085fb83ceffe6571a3d357b4a98773c83c474e47f76c876708fe316da"},
	}
	for _, c := range cases {
		got, err := LaunchDigestSEV(c.fw, c.kernel)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got.String() != c.want {
			t.Errorf("%s: SEV digest = %s, want %s", c.name, got, c.want)
		}
	}
}

func TestSEVESVectors(t *testing.T) {
	amd := loadFW(t, "ovmf_AmdSev_suffix.bin")
	got, err := LaunchDigestsSEVES(amd, SEVESParams{VCPUSig: epycV4, Kernel: emptyKernel("")}, []int{1, 4})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"13810ae661ea11e2bb205621f582fee268f0367c8f97bc297b7fadef3e12002c",
		"0dccbcaba8e90b261bd0d2e1863a2f9da714768b7b2a19363cd6ae35aa90de91",
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("SEV-ES digest %d = %s, want %s", i, got[i], want[i])
		}
	}
}

// TestChainPrimitives checks the PAGE_INFO chain against the published tests
// of google/gce-tcb-verifier.
func TestChainPrimitives(t *testing.T) {
	data := make([]byte, 3*PageSize)
	lgtm := []byte(strings.Repeat("LGTM", 4))
	copy(data, lgtm)
	copy(data[len(data)-len(lgtm):], lgtm)
	c := NewLaunchDigest()
	if err := c.UpdateNormalPages(0, data); err != nil {
		t.Fatal(err)
	}
	if got, want := c.Digest().String(), "cba1cd767c33b30f96271837dbbae4081a945464a5af397b9b0336b5d8759ee88cc6b62c05d915c4424a9ac5747437d4"; got != want {
		t.Errorf("normal pages digest = %s, want %s", got, want)
	}
	// The same pages one at a time through UpdatePage.
	c2 := NewLaunchDigest()
	for i := 0; i < 3; i++ {
		if err := c2.UpdatePage(PageNormal, uint64(i*PageSize), data[i*PageSize:(i+1)*PageSize]); err != nil {
			t.Fatal(err)
		}
	}
	if c2.Digest() != c.Digest() {
		t.Errorf("UpdatePage chain %s differs from UpdateNormalPages %s", c2.Digest(), c.Digest())
	}

	z := NewLaunchDigest()
	if err := z.UpdateZeroPages(0x9000, 3*PageSize); err != nil {
		t.Fatal(err)
	}
	if got, want := z.Digest().String(), "4bfe18477ba370a50329da74b9621e721c4f29663176e08fbcf088a17c1bc45f133898b86d5082acbe202a6e9419808a"; got != want {
		t.Errorf("zero pages digest = %s, want %s", got, want)
	}
}

func TestParseDigest(t *testing.T) {
	const s = "086e2e9149ebf45abdc3445fba5b2da8270bdbb04094d7a2c37faaa4b24af3aa16aff8c374c2a55c467a50da6d466b74"
	d, err := ParseDigest(s)
	if err != nil || d.String() != s {
		t.Fatalf("ParseDigest = %s, %v", d, err)
	}
	for _, bad := range []string{"", "zz", s[:94], s + "00"} {
		if _, err := ParseDigest(bad); err == nil {
			t.Errorf("ParseDigest(%q) succeeded", bad)
		}
	}
}

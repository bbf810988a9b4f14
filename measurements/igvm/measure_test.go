package igvm

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/measurements/snp"
)

// snpFile is a File for the SEV-SNP platform (mask 1) with directives ds.
func snpFile(ds ...Header) *File {
	return &File{
		FormatVersion:  1,
		Platform:       []Header{&SupportedPlatform{CompatibilityMask: 1, PlatformType: PlatformSEVSNP, PlatformVersion: 1}},
		Initialization: []Header{&GuestPolicy{Policy: DefaultSNPPolicy, CompatibilityMask: 1}},
		Directives:     ds,
	}
}

// measureBytes marshals f, parses it back and measures it, so every test
// goes through the file format.
func measureBytes(t *testing.T, f *File, opt MeasureOptions) *Measurement {
	t.Helper()
	m, err := SNPLaunchDigest(mustParse(t, f), opt)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func mustDigest(t *testing.T, s string) snp.Digest {
	t.Helper()
	d, err := snp.ParseDigest(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestChainPrimitiveVectors measures the gce-tcb-verifier chain vectors of
// VECTORS.md written as IGVM page data.
func TestChainPrimitiveVectors(t *testing.T) {
	// "LGTM"x4 at the start of the first page and the end of the third.
	lgtm := bytes.Repeat([]byte("LGTM"), 4)
	region := make([]byte, 3*PageSize)
	copy(region, lgtm)
	copy(region[len(region)-len(lgtm):], lgtm)
	var normal, zero []Header
	for i := uint64(0); i < 3; i++ {
		normal = append(normal, &PageData{GPA: i * PageSize, CompatibilityMask: 1, Data: region[i*PageSize : (i+1)*PageSize]})
		zero = append(zero, &PageData{GPA: 0x9000 + i*PageSize, CompatibilityMask: 1})
	}
	opt := MeasureOptions{Loader: LoaderIGVMMeasure}
	if got, want := measureBytes(t, snpFile(normal...), opt).Digest, mustDigest(t, "cba1cd767c33b30f96271837dbbae4081a945464a5af397b9b0336b5d8759ee88cc6b62c05d915c4424a9ac5747437d4"); got != want {
		t.Errorf("three normal pages = %s, want %s", got, want)
	}
	m := measureBytes(t, snpFile(zero...), opt)
	if want := mustDigest(t, "4bfe18477ba370a50329da74b9621e721c4f29663176e08fbcf088a17c1bc45f133898b86d5082acbe202a6e9419808a"); m.Digest != want {
		t.Errorf("three zero pages = %s, want %s", m.Digest, want)
	}
	if m.Pages[snp.PageZero] != 3 || len(m.Pages) != 1 {
		t.Errorf("page counts = %v", m.Pages)
	}
	// As normal zero pages the same file measures differently, and like
	// normal pages of zeros.
	opt.NormalZeroPages = true
	want := snp.NewLaunchDigest()
	if err := want.UpdateNormalPages(0x9000, make([]byte, 3*PageSize)); err != nil {
		t.Fatal(err)
	}
	if got := measureBytes(t, snpFile(zero...), opt).Digest; got != want.Digest() {
		t.Errorf("normal zero pages = %s, want %s", got, want.Digest())
	}
}

// TestPageTypes checks each PAGE_DATA kind against the snp chain directly.
func TestPageTypes(t *testing.T) {
	data := bytes.Repeat([]byte{0x5A}, 100) // short data is zero-padded
	f := snpFile(
		&PageData{GPA: 0x1000, CompatibilityMask: 1, Data: data},
		&PageData{GPA: 0x2000, CompatibilityMask: 1, Flags: PageUnmeasured, Data: data},
		&PageData{GPA: 0x3000, CompatibilityMask: 1, DataType: PageDataSecrets},
		&PageData{GPA: 0x4000, CompatibilityMask: 1, DataType: PageDataCPUIDData},
		&PageData{GPA: 0x5000, CompatibilityMask: 1, DataType: PageDataCPUIDXF},
		&PageData{GPA: 0x6000, CompatibilityMask: 2, Data: data}, // another platform
		&PageData{GPA: 0x200000, CompatibilityMask: 1, Flags: PageIs2MB, Data: data},
	)
	f.Platform = append(f.Platform, &SupportedPlatform{CompatibilityMask: 2, PlatformType: PlatformTDX, PlatformVersion: 1})
	c := snp.NewLaunchDigest()
	steps := []error{
		c.UpdatePage(snp.PageNormal, 0x1000, data),
		c.UpdatePage(snp.PageUnmeasured, 0x2000, nil),
		c.UpdatePage(snp.PageSecrets, 0x3000, nil),
		c.UpdatePage(snp.PageCPUID, 0x4000, nil),
		c.UpdatePage(snp.PageCPUID, 0x5000, nil),
		c.UpdatePage(snp.PageNormal, 0x200000, data),
		c.UpdateNormalPages(0x201000, make([]byte, PageSize2M-PageSize)),
	}
	if err := errors.Join(steps...); err != nil {
		t.Fatal(err)
	}
	m := measureBytes(t, f, MeasureOptions{Loader: LoaderIGVMMeasure})
	if m.Digest != c.Digest() {
		t.Errorf("digest = %s, want %s", m.Digest, c.Digest())
	}
	if m.Pages[snp.PageNormal] != 513 || m.Pages[snp.PageCPUID] != 2 {
		t.Errorf("page counts = %v", m.Pages)
	}
}

// TestQEMURegionOrder checks QEMU's deferred page regions: a parameter
// insert right after a run of pages is measured before them, while
// igvmmeasure keeps file order.
func TestQEMURegionOrder(t *testing.T) {
	data := bytes.Repeat([]byte{1}, PageSize)
	vmsa := bytes.Repeat([]byte{2}, PageSize)
	f := snpFile(
		&ParameterArea{NumberOfBytes: 2 * PageSize, Index: 7},
		&PageData{GPA: 0x1000, CompatibilityMask: 1, Data: data},
		&PageData{GPA: 0x2000, CompatibilityMask: 1, Data: data},
		&ParameterInsert{GPA: 0x10000, CompatibilityMask: 1, Index: 7},
		&VPContext{GPA: 0x20000, CompatibilityMask: 1, Data: vmsa},
		&PageData{GPA: 0x3000, CompatibilityMask: 1, Data: data},
	)
	qemu := snp.NewLaunchDigest()
	if err := errors.Join(
		qemu.UpdateUnmeasuredPages(0x10000, 2*PageSize),
		qemu.UpdateNormalPages(0x1000, append(data, data...)),
		qemu.UpdateNormalPages(0x3000, data),
		qemu.UpdateVMSAPage(vmsa),
	); err != nil {
		t.Fatal(err)
	}
	m := measureBytes(t, f, MeasureOptions{})
	if m.Digest != qemu.Digest() {
		t.Errorf("qemu order digest = %s, want %s", m.Digest, qemu.Digest())
	}
	if len(m.Notes) != 2 || !strings.Contains(m.Notes[0], "SEV_FEATURES is 0x202020202020202") || !strings.Contains(m.Notes[1], "0x20000") {
		t.Errorf("notes = %q, want one about SEV_FEATURES and one about the VMSA GPA", m.Notes)
	}
	file := snp.NewLaunchDigest()
	if err := errors.Join(
		file.UpdateNormalPages(0x1000, append(data, data...)),
		file.UpdateUnmeasuredPages(0x10000, PageSize),
		file.UpdatePage(snp.PageVMSA, 0x20000, vmsa),
		file.UpdateNormalPages(0x3000, data),
	); err != nil {
		t.Fatal(err)
	}
	if got := measureBytes(t, f, MeasureOptions{Loader: LoaderIGVMMeasure}).Digest; got != file.Digest() {
		t.Errorf("igvmmeasure order digest = %s, want %s", got, file.Digest())
	}
}

func TestVCPUs(t *testing.T) {
	bsp, err := snp.BSPVMSA(snp.VMMQEMU, 0x800f12, 0x21)
	if err != nil {
		t.Fatal(err)
	}
	ap := bytes.Repeat([]byte{3}, PageSize)
	f := snpFile(
		&PageData{GPA: 0, CompatibilityMask: 1},
		&VPContext{GPA: snp.VMSAGPA, CompatibilityMask: 1, VPIndex: 1, Data: ap},
		&VPContext{GPA: snp.VMSAGPA, CompatibilityMask: 1, VPIndex: 0, Data: bsp},
	)
	base := snp.NewLaunchDigest()
	if err := base.UpdateZeroPages(0, PageSize); err != nil {
		t.Fatal(err)
	}
	// Two vCPUs: KVM measures vCPU 0 then vCPU 1, whatever the file order.
	two := base.Clone()
	if err := errors.Join(two.UpdateVMSAPage(bsp), two.UpdateVMSAPage(ap)); err != nil {
		t.Fatal(err)
	}
	if m := measureBytes(t, f, MeasureOptions{}); m.Digest != two.Digest() || len(m.VMSAs) != 2 {
		t.Errorf("default vCPUs: %s (%d VMSAs), want %s", m.Digest, len(m.VMSAs), two.Digest())
	} else if len(m.Notes) != 2 || !strings.Contains(m.Notes[0], "VP 0: SEV_FEATURES is 0x21") {
		t.Errorf("notes = %q, want SEV_FEATURES notes for both VPs", m.Notes)
	}
	// Three vCPUs: the third starts from the reset state, with the BSP's
	// SEV_FEATURES, which is the BSP VMSA itself for signature 0x800f12.
	if _, err := SNPLaunchDigest(mustParse(t, f), MeasureOptions{VCPUs: 3}); err == nil || !strings.Contains(err.Error(), "vCPU 2 has no VP context") {
		t.Errorf("3 vCPUs without a signature: %v", err)
	}
	three := two.Clone()
	if err := three.UpdateVMSAPage(bsp); err != nil {
		t.Fatal(err)
	}
	m, err := SNPLaunchDigest(mustParse(t, f), MeasureOptions{VCPUs: 3, ResetVCPUSig: 0x800f12})
	if err != nil || m.Digest != three.Digest() || m.VMSAs[2].FromFile {
		t.Errorf("3 vCPUs: %v %v, want %s", m, err, three.Digest())
	}
	if _, err := SNPLaunchDigest(mustParse(t, f), MeasureOptions{VCPUs: 1}); err == nil || !strings.Contains(err.Error(), "VP index 1") {
		t.Errorf("1 vCPU with a context for VP 1: %v", err)
	}
}

func mustParse(t *testing.T, f *File) *File {
	t.Helper()
	b, err := Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	g, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestIDBlock(t *testing.T) {
	f := snpFile(&PageData{GPA: 0, CompatibilityMask: 1, Data: []byte{1}})
	m := measureBytes(t, f, MeasureOptions{Loader: LoaderIGVMMeasure})
	if m.IDBlock != nil || m.CheckIDBlock() != nil {
		t.Fatal("no ID block, but CheckIDBlock complains")
	}
	if m.Policy == nil || *m.Policy != DefaultSNPPolicy {
		t.Errorf("policy = %v", m.Policy)
	}
	id := &SNPIDBlock{CompatibilityMask: 1, LD: m.Digest}
	f.Directives = append(f.Directives, id)
	if err := measureBytes(t, f, MeasureOptions{Loader: LoaderIGVMMeasure}).CheckIDBlock(); err != nil {
		t.Errorf("matching ID block: %v", err)
	}
	id.LD[0] ^= 1
	err := measureBytes(t, f, MeasureOptions{Loader: LoaderIGVMMeasure}).CheckIDBlock()
	if !errors.Is(err, ErrIDBlockMismatch) || !strings.Contains(err.Error(), m.Digest.String()) {
		t.Errorf("mismatching ID block: %v", err)
	}
}

func TestMeasureErrors(t *testing.T) {
	noSNP := &File{Platform: []Header{&SupportedPlatform{CompatibilityMask: 1, PlatformType: PlatformTDX}}}
	if _, err := SNPLaunchDigest(noSNP, MeasureOptions{}); err == nil || !strings.Contains(err.Error(), "no SUPPORTED_PLATFORM header for sev-snp") {
		t.Errorf("no SNP platform: %v", err)
	}
	cases := []struct {
		name string
		d    []Header
		want string
	}{
		{"undeclared area", []Header{&ParameterInsert{CompatibilityMask: 1, Index: 3}}, "undeclared parameter area 3"},
		{"insert twice", []Header{&ParameterArea{NumberOfBytes: PageSize, Index: 1}, &ParameterInsert{CompatibilityMask: 1, Index: 1}, &ParameterInsert{GPA: PageSize, CompatibilityMask: 1, Index: 1}}, "inserted twice"},
		{"short vmsa", []Header{&VPContext{CompatibilityMask: 1, Data: []byte{1}}}, "want a 4096-byte page"},
		{"bad data type", []Header{&PageData{CompatibilityMask: 1, DataType: 9}}, "unknown data type"},
		{"two id blocks", []Header{&SNPIDBlock{CompatibilityMask: 1}, &SNPIDBlock{CompatibilityMask: 1}}, "more than one SNP ID block"},
	}
	for _, c := range cases {
		_, err := SNPLaunchDigest(snpFile(c.d...), MeasureOptions{Loader: LoaderIGVMMeasure})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	// QEMU refuses directive types it does not handle; the measurement says so.
	vmsa := make([]byte, PageSize)
	vmsa[0x3B0] = 1 // SEV_FEATURES = SNPActive
	m, err := SNPLaunchDigest(snpFile(&ErrorRange{CompatibilityMask: 1}, &VPContext{CompatibilityMask: 1, GPA: snp.VMSAGPA, Data: vmsa}), MeasureOptions{})
	if err != nil || len(m.Notes) != 1 || !strings.Contains(m.Notes[0], "ERROR_RANGE") {
		t.Errorf("ERROR_RANGE note: %v, %v", m, err)
	}
}

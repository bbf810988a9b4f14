package snp

import (
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/measurements/ovmf"
)

func TestCPUSig(t *testing.T) {
	cases := []struct {
		name string
		want uint32
	}{
		{"EPYC-v4", 0x800f12},
		{"EPYC-Rome", 0x830f10},
		{"EPYC-Milan", 0xa00f11},
		{"EPYC-Genoa", 0xa10f10},
		{"EPYC-Turin", 0xb00f00},
	}
	for _, c := range cases {
		got, err := VCPUTypeSig(c.name)
		if err != nil || got != c.want {
			t.Errorf("VCPUTypeSig(%s) = %#x, %v; want %#x", c.name, got, err, c.want)
		}
	}
	if got := CPUSig(6, 0x55, 7); got != 0x50657 {
		t.Errorf("CPUSig(6, 0x55, 7) = %#x, want 0x50657", got)
	}
	if _, err := VCPUTypeSig("epyc-v4"); err == nil || !strings.Contains(err.Error(), "EPYC-Milan") {
		t.Errorf("unknown type error = %v, want one listing the known types", err)
	}
	if n := len(VCPUTypes()); n != 16 {
		t.Errorf("%d vCPU types, want the reference tool's 16", n)
	}
}

func TestBuildVMSAFields(t *testing.T) {
	u64 := func(b []byte, off int) uint64 { return binary.LittleEndian.Uint64(b[off:]) }
	u16 := func(b []byte, off int) uint16 { return binary.LittleEndian.Uint16(b[off:]) }
	bsp, err := BSPVMSA(VMMQEMU, 0x800f12, 0x21)
	if err != nil {
		t.Fatal(err)
	}
	if len(bsp) != PageSize {
		t.Fatalf("VMSA is %d bytes", len(bsp))
	}
	for _, c := range []struct {
		name string
		got  uint64
		want uint64
	}{
		{"cs.selector", uint64(u16(bsp, 0x10)), 0xf000},
		{"cs.attrib", uint64(u16(bsp, 0x12)), 0x9b},
		{"cs.base", u64(bsp, 0x18), 0xffff0000},
		{"rip", u64(bsp, 0x178), 0xfff0},
		{"rdx", u64(bsp, 0x310), 0x800f12},
		{"sev_features", u64(bsp, 0x3b0), 0x21},
		{"g_pat", u64(bsp, 0x268), 0x0007040600070406},
		{"mxcsr", uint64(binary.LittleEndian.Uint32(bsp[0x408:])), 0x1f80},
		{"x87_fcw", uint64(u16(bsp, 0x410)), 0x37f},
	} {
		if c.got != c.want {
			t.Errorf("QEMU BSP %s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
	ap, err := APVMSA(VMMEC2, 0x800f12, 1, 0x80b004)
	if err != nil {
		t.Fatal(err)
	}
	if u64(ap, 0x18) != 0x800000 || u64(ap, 0x178) != 0xb004 || u16(ap, 0x12) != 0x9b || u64(ap, 0x310) != 0x600 || u16(ap, 0x410) != 0 {
		t.Errorf("EC2 AP VMSA fields wrong: cs.base %#x rip %#x cs.attrib %#x rdx %#x", u64(ap, 0x18), u64(ap, 0x178), u16(ap, 0x12), u64(ap, 0x310))
	}
	ec2BSP, _ := BSPVMSA(VMMEC2, 0, 1)
	if u16(ec2BSP, 0x12) != 0x9a {
		t.Errorf("EC2 BSP cs.attrib = %#x, want 0x9a", u16(ec2BSP, 0x12))
	}
	gce, _ := BSPVMSA(VMMGCE, 0x800f12, 1)
	if u64(gce, 0x268) != 0x00070106 || u64(gce, 0x310) != 0x600 {
		t.Errorf("GCE g_pat/rdx = %#x/%#x", u64(gce, 0x268), u64(gce, 0x310))
	}
	if _, err := BuildVMSA(VMSAParams{VMM: 7}); err == nil {
		t.Error("BuildVMSA accepted VMM type 7")
	}
	if _, err := APVMSA(VMMQEMU, 0, 1, 0); err == nil {
		t.Error("APVMSA accepted reset EIP 0")
	}
	svsm := SVSMVMSA(0xffc00000, 0xa00f11)
	if u64(svsm, 0x178) != 0xffc00000 || u64(svsm, 0x3b0) != SVSMFeatures || u64(svsm, 0x158) != 0x11 || u16(svsm, 0x410) != 0 {
		t.Error("SVSM VMSA rip, features, cr0 or fcw wrong")
	}
}

func TestParseVMMType(t *testing.T) {
	for s, want := range map[string]VMMType{"QEMU": VMMQEMU, "qemu": VMMQEMU, "ec2": VMMEC2, "GCE": VMMGCE} {
		if got, err := ParseVMMType(s); err != nil || got != want {
			t.Errorf("ParseVMMType(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseVMMType("kvm"); err == nil {
		t.Error("ParseVMMType(kvm) succeeded")
	}
}

func TestKernelHashesTable(t *testing.T) {
	k := NewKernelHashes([]byte("kernel"), nil, "ro")
	tab := k.Table()
	if len(tab) != 176 || HashTableSize != 176 {
		t.Fatalf("table is %d bytes, HashTableSize %d; want 176 (168 padded to 16)", len(tab), HashTableSize)
	}
	if !bytes.Equal(tab[:16], HashTableHeaderGUID[:]) || binary.LittleEndian.Uint16(tab[16:]) != 168 {
		t.Error("table header wrong")
	}
	entry := func(i int) []byte { return tab[18+i*50 : 18+(i+1)*50] }
	wantHashes := [][32]byte{sha256.Sum256([]byte("ro\x00")), sha256.Sum256(nil), sha256.Sum256([]byte("kernel"))}
	for i, g := range []ovmf.GUID{HashTableCmdlineGUID, HashTableInitrdGUID, HashTableKernelGUID} {
		e := entry(i)
		if !bytes.Equal(e[:16], g[:]) || binary.LittleEndian.Uint16(e[16:]) != 50 || !bytes.Equal(e[18:], wantHashes[i][:]) {
			t.Errorf("entry %d = %x", i, e)
		}
	}
	if !bytes.Equal(tab[168:], make([]byte, 8)) {
		t.Error("padding is not zero")
	}
	if CmdlineHash("") != sha256.Sum256([]byte{0}) {
		t.Error("empty command line must hash as a lone NUL")
	}
	p, err := k.Page(0xc00)
	if err != nil || len(p) != PageSize || !bytes.Equal(p[0xc00:0xc00+176], tab) {
		t.Errorf("Page(0xc00) = %d bytes, %v", len(p), err)
	}
	if _, err := k.Page(PageSize - 100); err == nil {
		t.Error("Page accepted an offset where the table does not fit")
	}
}

func TestUpdatePageErrors(t *testing.T) {
	c := NewLaunchDigest()
	for _, tc := range []struct {
		t    PageType
		gpa  uint64
		page []byte
		want string
	}{
		{PageNormal, 0x1001, nil, "aligned"},
		{PageNormal, 0, make([]byte, PageSize+1), "more than"},
		{PageZero, 0, []byte{1}, "not measured"},
		{PageType(9), 0, nil, "unknown page type"},
	} {
		if err := c.UpdatePage(tc.t, tc.gpa, tc.page); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("UpdatePage(%v, %#x, %d bytes) = %v, want %q", tc.t, tc.gpa, len(tc.page), err, tc.want)
		}
	}
	if err := c.UpdateNormalPages(0, make([]byte, 100)); err == nil {
		t.Error("UpdateNormalPages accepted a partial page")
	}
	if err := c.UpdateZeroPages(0, 100); err == nil {
		t.Error("UpdateZeroPages accepted a partial page")
	}
	if err := c.UpdateVMSAPage(make([]byte, 10)); err == nil {
		t.Error("UpdateVMSAPage accepted a short VMSA")
	}
	if c.Digest() != (Digest{}) {
		t.Error("failed updates changed the digest")
	}
}

func TestShortPageIsZeroPadded(t *testing.T) {
	a, b := NewLaunchDigest(), NewLaunchDigest()
	full := make([]byte, PageSize)
	copy(full, "hello")
	if err := a.UpdatePage(PageNormal, 0x2000, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := b.UpdatePage(PageNormal, 0x2000, full); err != nil {
		t.Fatal(err)
	}
	if a.Digest() != b.Digest() {
		t.Error("short page digest differs from zero-padded page digest")
	}
}

// TestPageInfoLayout recomputes one PAGE_INFO by hand.
func TestPageInfoLayout(t *testing.T) {
	var seed, contents Digest
	seed[0], contents[47] = 0xaa, 0xbb
	c := LaunchDigestFromSeed(seed)
	c.UpdatePageInfo(PageInfo{Contents: contents, Type: PageVMSA, IsIMI: true, VMPL3Perms: 3, VMPL2Perms: 2, VMPL1Perms: 1, GPA: 0x1122334455667000})
	pi := append(append([]byte{}, seed[:]...), contents[:]...)
	pi = append(pi, 0x70, 0x00, 0x02, 0x01, 3, 2, 1, 0)
	pi = binary.LittleEndian.AppendUint64(pi, 0x1122334455667000)
	if want := Digest(sha512.Sum384(pi)); c.Digest() != want {
		t.Errorf("digest = %s, want %s", c.Digest(), want)
	}
	clone := c.Clone()
	c.Update(PageZero, 0, Digest{})
	if clone.Digest() == c.Digest() {
		t.Error("Clone shares state with the original")
	}
}

// TestParallelHashing checks that the multi-goroutine page hashing used for
// large ranges gives the sequential chain.
func TestParallelHashing(t *testing.T) {
	data := make([]byte, parallelThreshold+5*PageSize)
	for i := range data {
		data[i] = byte(i * 7 / 3)
	}
	a := NewLaunchDigest()
	if err := a.UpdateNormalPages(0x100000, data); err != nil {
		t.Fatal(err)
	}
	b := NewLaunchDigest()
	for off := 0; off < len(data); off += PageSize {
		b.Update(PageNormal, 0x100000+uint64(off), sha512.Sum384(data[off:off+PageSize]))
	}
	if a.Digest() != b.Digest() {
		t.Error("parallel and sequential page hashing differ")
	}
}

func TestMeasureErrors(t *testing.T) {
	amd := loadFW(t, "ovmf_AmdSev_suffix.bin")
	if _, err := LaunchDigestsSNP(amd, Params{VCPUSig: epycV4}, nil); err == nil {
		t.Error("no vCPU counts accepted")
	}
	if _, err := LaunchDigestSNP(amd, Params{VCPUs: 0, VCPUSig: epycV4}); err == nil || !strings.Contains(err.Error(), "at least 1") {
		t.Errorf("0 vCPUs: %v", err)
	}
	// A firmware whose metadata has an unknown section type.
	data := append([]byte(nil), amd.Data...)
	binary.LittleEndian.PutUint32(data[amd.Metadata.Offset+16+8:], 0x77)
	bad, err := ovmf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LaunchDigestSNP(bad, Params{VCPUs: 1, VCPUSig: epycV4}); err == nil || !strings.Contains(err.Error(), "unknown type") {
		t.Errorf("unknown section type: %v", err)
	}
	// A firmware that is not a whole number of pages.
	short := &ovmf.Firmware{Data: amd.Data[100:], Table: amd.Table, Metadata: amd.Metadata}
	if _, err := LaunchDigestSNP(short, Params{VCPUs: 1, VCPUSig: epycV4}); err == nil || !strings.Contains(err.Error(), "multiple of 4 KiB") {
		t.Errorf("partial-page firmware: %v", err)
	}
	if _, err := OVMFHash(short); err == nil {
		t.Error("OVMFHash accepted a partial-page firmware")
	}
	// SVSM mode needs the SVSM_INFO entry and room below 4 GiB.
	ovmfFw, svsm := loadFW(t, "svsm_ovmf.fd"), loadFW(t, "svsm.bin")
	if _, err := LaunchDigestSVSM(ovmfFw, amd, SVSMParams{VCPUs: 1, VarsSize: 0x84000}); err == nil || !strings.Contains(err.Error(), "SVSM_INFO") {
		t.Errorf("SVSM image without SVSM_INFO: %v", err)
	}
	if _, err := LaunchDigestSVSM(ovmfFw, svsm, SVSMParams{VCPUs: 1, VarsSize: 1 << 40}); err == nil || !strings.Contains(err.Error(), "do not fit") {
		t.Errorf("huge vars size: %v", err)
	}
	if _, err := LaunchDigestSVSM(ovmfFw, svsm, SVSMParams{VCPUs: 1, VarsSize: 100}); err == nil {
		t.Error("unaligned vars size accepted")
	}
}

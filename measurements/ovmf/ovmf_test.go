package ovmf

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/measurements/internal/fixtures"
)

func TestGUIDRoundTrip(t *testing.T) {
	const s = "96b582de-1fb2-45f7-baea-a366c55a082d"
	g, err := ParseGUID(s)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{0xde, 0x82, 0xb5, 0x96, 0xb2, 0x1f, 0xf7, 0x45, 0xba, 0xea, 0xa3, 0x66, 0xc5, 0x5a, 0x08, 0x2d}
	if string(g[:]) != string(want) {
		t.Errorf("ParseGUID(%s) = %x, want %x", s, g, want)
	}
	if g.String() != s {
		t.Errorf("String() = %s, want %s", g, s)
	}
	for _, bad := range []string{"", "96b582de1fb245f7baeaa366c55a082d", "96b582de-1fb2-45f7-baea-a366c55a082g", "96b582de-1fb2-45f7-baeaa-366c55a082d"} {
		if _, err := ParseGUID(bad); err == nil {
			t.Errorf("ParseGUID(%q) succeeded", bad)
		}
	}
}

func TestParseAmdSev(t *testing.T) {
	f, err := Parse(fixtures.Read(t, "snp", "ovmf_AmdSev_suffix.bin"))
	if err != nil {
		t.Fatal(err)
	}
	eip, err := f.SevESResetEIP()
	if err != nil || eip != 0x80b004 {
		t.Errorf("SevESResetEIP = %#x, %v; want 0x80b004", eip, err)
	}
	ht, err := f.SevHashTable()
	if err != nil || ht != (HashTableArea{GPA: 0x810c00, Size: 0x400}) {
		t.Errorf("SevHashTable = %+v, %v", ht, err)
	}
	if !f.SupportsSevHashTable() {
		t.Error("SupportsSevHashTable = false")
	}
	tdx, ok := f.TableEntry(TDXMetadataOffsetGUID)
	if !ok || binary.LittleEndian.Uint32(tdx) != 0x9d0 {
		t.Errorf("TDX metadata offset entry = %x, %v", tdx, ok)
	}
	want := []Section{
		{0x800000, 0x9000, SectionSNPSecMem},
		{0x80a000, 0x3000, SectionSNPSecMem},
		{0x80d000, 0x1000, SectionSNPSecrets},
		{0x80e000, 0x1000, SectionCPUID},
		{0x80f000, 0x1000, SectionSVSMCAA},
		{0x810000, 0x1000, SectionSNPKernelHashes},
		{0x811000, 0xf000, SectionSNPSecMem},
	}
	got := f.Sections()
	if len(got) != len(want) {
		t.Fatalf("sections = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("section %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if !f.HasSection(SectionSNPKernelHashes) {
		t.Error("HasSection(SNP_KERNEL_HASHES) = false")
	}
	if f.GPA(FourGiB) != 0xfffff000 {
		t.Errorf("GPA = %#x", f.GPA(FourGiB))
	}
}

func TestParseOvmfX64(t *testing.T) {
	f, err := Parse(fixtures.Read(t, "snp", "ovmf_OvmfX64_suffix.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if f.HasSection(SectionSNPKernelHashes) {
		t.Error("OvmfX64 claims a SNP_KERNEL_HASHES section")
	}
	if f.SupportsSevHashTable() {
		t.Error("OvmfX64 claims SEV hash table support (its GPA is 0)")
	}
}

func TestParseMalformed(t *testing.T) {
	good := fixtures.Read(t, "snp", "ovmf_AmdSev_suffix.bin")
	mutate := func(f func(b []byte) []byte) []byte {
		b := append([]byte(nil), good...)
		return f(b)
	}
	n := len(good)
	footer := n - 0x20 - 18
	cases := []struct {
		name string
		fw   []byte
		want string
	}{
		{"empty", nil, "too short"},
		{"truncated", good[:40], "too short"},
		{"no footer", make([]byte, 4096), "no OVMF footer table"},
		{"footer size too small", mutate(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[footer:], 3); return b }), "smaller than its own"},
		{"footer size too large", mutate(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[footer:], 0xffff); return b }), "only"},
		{"entry size zero", mutate(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[footer-18:], 0); return b }), "smaller than its"},
		{"entry size too large", mutate(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[footer-18:], 0x1000); return b }), "remain"},
		{"metadata offset", mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[0xf6e:], 0x10000); return b }), "outside"},
		{"metadata signature", mutate(func(b []byte) []byte { b[n-0x554] = 'X'; return b }), "signature"},
		{"metadata version", mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[n-0x554+8:], 2); return b }), "version"},
		{"metadata count", mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[n-0x554+12:], 1000); return b }), "do not fit"},
		{"metadata past end", mutate(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[n-0x554+4:], 0xffffffff)
			binary.LittleEndian.PutUint32(b[n-0x554+12:], 1000)
			return b
		}), "past the end"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.fw)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse error = %v, want one containing %q", err, c.want)
			}
		})
	}
	if _, err := Parse(make([]byte, 100)); !errors.Is(err, ErrNoFooterTable) {
		t.Errorf("Parse(zeros) = %v, want ErrNoFooterTable", err)
	}
}

func TestMissingEntries(t *testing.T) {
	// A footer table holding only itself: no entries at all.
	fw := make([]byte, 4096)
	footer := len(fw) - 0x20 - 18
	binary.LittleEndian.PutUint16(fw[footer:], 18)
	copy(fw[footer+2:], FooterTableGUID[:])
	f, err := Parse(fw)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Table) != 0 || f.Metadata != nil {
		t.Errorf("empty table parsed as %+v", f)
	}
	if _, err := f.SevESResetEIP(); err == nil || !strings.Contains(err.Error(), "SEV-ES reset block") {
		t.Errorf("SevESResetEIP error = %v", err)
	}
	if _, ok := f.TableEntry(TDXMetadataOffsetGUID); ok {
		t.Error("TableEntry found a TDX entry in an empty table")
	}
}

package tdx

// Reference values:
//
//   - Debian 12's /usr/share/ovmf/OVMF.fd (package ovmf 2022.11-6+deb12u2)
//     carries TDX metadata. Its MRTD below was computed independently with
//     google/gce-tcb-verifier's tdx package (commit 74582c0, fetched from
//     GitHub and built outside this repository with a small main calling
//     tdx.MRTD(tdx.LaunchOptionsDefault(""), fw)); that implementation adds
//     and extends page by page, the PerPage ordering.
//   - virtee/tdx-measure publishes the MRTD of Ubuntu 25.04's OVMF.fd
//     (sha256 9e807cb2...b446bf) as 7357a10d...837e1114, see
//     testdata/snp/VECTORS.md. That firmware is not on this
//     machine, so that vector cannot be checked here.

import (
	"bytes"
	"crypto/sha512"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/measurements/ovmf"
)

const debianOVMF = "/usr/share/ovmf/OVMF.fd"

// debianOVMFMRTD: see the file comment for how it was obtained.
const debianOVMFMRTD = "4c7206f0f483c524f12c366c711e9049030a8d47c471ee5aa9c4999a08de4057fb887fed0744d5631a212967fb231c47"

func readOVMF(t *testing.T) []byte {
	t.Helper()
	fw, err := os.ReadFile(debianOVMF)
	if err != nil {
		t.Skipf("%s is missing (Debian package ovmf; run hack/install-deps.sh): %v", debianOVMF, err)
	}
	return fw
}

func TestDebianOVMF(t *testing.T) {
	fw := readOVMF(t)
	md, err := Parse(fw)
	if err != nil {
		t.Fatal(err)
	}
	bfv, ok := md.Section(SectionBFV)
	if !ok || bfv.Attributes != AttrMRExtend || bfv.MemoryAddress+bfv.MemoryDataSize != 1<<32 {
		t.Errorf("BFV section %+v (found %v): want MR.EXTEND and ending at 4 GiB", bfv, ok)
	}
	if _, ok := md.Section(SectionTDHOB); !ok {
		t.Error("no TD_HOB section")
	}
	var extended, raw uint64
	for _, s := range md.Sections {
		if s.Attributes&AttrMRExtend != 0 {
			extended += s.MemoryDataSize
		}
		raw += uint64(s.RawDataSize)
	}
	if raw != uint64(len(fw)) {
		t.Errorf("firmware volumes cover %d bytes of the %d-byte image", raw, len(fw))
	}
	t.Logf("%d sections, %d KiB extended", len(md.Sections), extended>>10)

	got, err := MRTD(fw, md, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if hex.EncodeToString(got[:]) != debianOVMFMRTD {
		t.Errorf("MRTD %x, want %s (gce-tcb-verifier)", got, debianOVMFMRTD)
	}
	// The image cut to its last 64 KiB still has the footer table and the
	// metadata, but the firmware volumes no longer fit.
	if _, err := FirmwareMRTD(fw[len(fw)-0x10000:], Options{}); err == nil || !strings.Contains(err.Error(), "runs past the end") {
		t.Errorf("MRTD of a truncated image: %v, want a runs-past-the-end error", err)
	}
	two, err := FirmwareMRTD(fw, Options{Ordering: TwoPass})
	if err != nil {
		t.Fatal(err)
	}
	if two == got {
		t.Error("two-pass ordering gave the per-page MRTD although the BFV spans many pages")
	}
}

// fwBuilder lays out a synthetic firmware image with a TDVF descriptor and
// an OVMF footer table pointing at it.
type fwBuilder struct {
	size     int
	descOff  int
	sections []Section
	noTDX    bool
	// offset overrides the TDX metadata offset (from the end) when set.
	offset uint32
}

func footerEntry(g ovmf.GUID, data []byte) []byte {
	e := append([]byte(nil), data...)
	e = binary.LittleEndian.AppendUint16(e, uint16(len(data)+18))
	return append(e, g[:]...)
}

func (b fwBuilder) build() []byte {
	fw := make([]byte, b.size)
	for i := range fw {
		fw[i] = byte(i*13 + i>>8)
	}
	d := fw[b.descOff:]
	copy(d, "TDVF")
	binary.LittleEndian.PutUint32(d[4:], uint32(16+32*len(b.sections)))
	binary.LittleEndian.PutUint32(d[8:], 1)
	binary.LittleEndian.PutUint32(d[12:], uint32(len(b.sections)))
	for i, s := range b.sections {
		e := d[16+32*i:]
		binary.LittleEndian.PutUint32(e, s.DataOffset)
		binary.LittleEndian.PutUint32(e[4:], s.RawDataSize)
		binary.LittleEndian.PutUint64(e[8:], s.MemoryAddress)
		binary.LittleEndian.PutUint64(e[16:], s.MemoryDataSize)
		binary.LittleEndian.PutUint32(e[24:], uint32(s.Type))
		binary.LittleEndian.PutUint32(e[28:], s.Attributes)
	}
	var table []byte
	if !b.noTDX {
		off := uint32(b.size - b.descOff)
		if b.offset != 0 {
			off = b.offset
		}
		table = append(table, footerEntry(ovmf.TDXMetadataOffsetGUID, binary.LittleEndian.AppendUint32(nil, off))...)
	}
	table = append(table, footerEntry(ovmf.FooterTableGUID, nil)...)
	binary.LittleEndian.PutUint16(table[len(table)-18:], uint16(len(table)))
	copy(fw[b.size-0x20-len(table):], table)
	return fw
}

// smallFirmware: a 16 KiB image mapped below 4 GiB and measured, a
// two-page TD HOB, a three-page PAGE.AUG section and a measured payload
// shorter than its memory.
func smallFirmware() fwBuilder {
	return fwBuilder{size: 0x4000, descOff: 0x1000, sections: []Section{
		{DataOffset: 0, RawDataSize: 0x4000, MemoryAddress: 0xffffc000, MemoryDataSize: 0x4000, Type: SectionBFV, Attributes: AttrMRExtend},
		{MemoryAddress: 0x800000, MemoryDataSize: 0x2000, Type: SectionTDHOB},
		{MemoryAddress: 0x900000, MemoryDataSize: 0x3000, Type: SectionPermMem, Attributes: AttrPageAug},
		// Raw data shorter than memory: the rest is zero.
		{DataOffset: 0x100, RawDataSize: 0x80, MemoryAddress: 0xa00000, MemoryDataSize: 0x1000, Type: SectionPayload, Attributes: AttrMRExtend},
	}}
}

// expectedMRTD writes the TDX module's records for the synthetic image
// directly from the TDX module specification's description.
func expectedMRTD(fw []byte, twoPass, skipAug bool) [48]byte {
	h := sha512.New384()
	rec := func(op string, gpa uint64) {
		b := make([]byte, 128)
		copy(b, op)
		binary.LittleEndian.PutUint64(b[16:], gpa)
		h.Write(b)
	}
	ext := func(gpa uint64, page []byte) {
		for c := 0; c < 4096; c += 256 {
			rec("MR.EXTEND", gpa+uint64(c))
			h.Write(page[c : c+256])
		}
	}
	bfv := fw
	payload := make([]byte, 4096)
	copy(payload, fw[0x100:0x180])
	if twoPass {
		for p := 0; p < 4; p++ {
			rec("MEM.PAGE.ADD", 0xffffc000+uint64(p)*4096)
		}
		for p := 0; p < 4; p++ {
			ext(0xffffc000+uint64(p)*4096, bfv[p*4096:])
		}
	} else {
		for p := 0; p < 4; p++ {
			rec("MEM.PAGE.ADD", 0xffffc000+uint64(p)*4096)
			ext(0xffffc000+uint64(p)*4096, bfv[p*4096:])
		}
	}
	rec("MEM.PAGE.ADD", 0x800000)
	rec("MEM.PAGE.ADD", 0x801000)
	if !skipAug {
		for p := uint64(0); p < 3; p++ {
			rec("MEM.PAGE.ADD", 0x900000+p*4096)
		}
	}
	rec("MEM.PAGE.ADD", 0xa00000)
	ext(0xa00000, payload)
	var out [48]byte
	copy(out[:], h.Sum(nil))
	return out
}

func TestMRTDOrderings(t *testing.T) {
	fw := smallFirmware().build()
	for _, o := range []Options{{}, {Ordering: TwoPass}, {SkipPageAug: true}, {Ordering: TwoPass, SkipPageAug: true}} {
		got, err := FirmwareMRTD(fw, o)
		if err != nil {
			t.Fatal(err)
		}
		if want := expectedMRTD(fw, o.Ordering == TwoPass, o.SkipPageAug); got != want {
			t.Errorf("%+v: MRTD %x, want %x", o, got, want)
		}
	}
	// Debian's OVMF has no PAGE.AUG section, so both conventions agree.
	if ovmf, err := os.ReadFile(debianOVMF); err == nil {
		a, errA := FirmwareMRTD(ovmf, Options{})
		b, errB := FirmwareMRTD(ovmf, Options{SkipPageAug: true})
		if errA != nil || errB != nil || a != b {
			t.Errorf("Debian OVMF: %x (%v) with PAGE.AUG sections added, %x (%v) skipped", a, errA, b, errB)
		}
	}
}

func TestParseErrors(t *testing.T) {
	mod := func(f func(b *fwBuilder)) []byte {
		b := smallFirmware()
		f(&b)
		return b.build()
	}
	good := smallFirmware().build()
	cases := []struct {
		name string
		fw   []byte
		want string
	}{
		{"empty", nil, "too short"},
		{"truncated", good[:len(good)-100], "no OVMF footer table"},
		{"no TDX entry", mod(func(b *fwBuilder) { b.noTDX = true }), "no TDX metadata"},
		{"bad signature", func() []byte { f := append([]byte(nil), good...); f[0x1000] = 'X'; return f }(), "no TDVF descriptor"},
		{"misaligned", mod(func(b *fwBuilder) { b.sections[1].MemoryAddress += 8 }), "not 4 KiB aligned"},
		{"odd size", mod(func(b *fwBuilder) { b.sections[1].MemoryDataSize = 0x1800 }), "not a multiple of 4 KiB"},
		{"raw past end", mod(func(b *fwBuilder) { b.sections[3].DataOffset = 0x3fc0 }), "runs past the end"},
		{"raw larger than memory", mod(func(b *fwBuilder) { b.sections[3].RawDataSize = 0x2000 }), "exceeds memory size"},
		{"overlap", mod(func(b *fwBuilder) { b.sections[2].MemoryAddress = 0x801000 }), "overlap"},
		{"aug and extend", mod(func(b *fwBuilder) { b.sections[2].Attributes |= AttrMRExtend }), "both MR.EXTEND and PAGE.AUG"},
		{"unknown attribute", mod(func(b *fwBuilder) { b.sections[1].Attributes = 8 }), "unknown attributes"},
		{"wraps", mod(func(b *fwBuilder) { b.sections[1].MemoryAddress = 0xfffffffffffff000 }), "overflows"},
		{"no sections", mod(func(b *fwBuilder) { b.sections = nil }), "declares 0 sections"},
		{"descriptor at end", func() []byte {
			// A TDVF descriptor in the last 0x20 bytes, after the footer
			// table, where its section table cannot fit.
			f := mod(func(b *fwBuilder) { b.offset = 0x20 })
			copy(f[len(f)-0x20:], "TDVF\x90\x00\x00\x00\x01\x00\x00\x00\x04\x00\x00\x00")
			return f
		}(), "runs past the end"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.fw)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse error %v, want one containing %q", err, c.want)
			}
		})
	}
	if _, err := Parse(mod(func(b *fwBuilder) { b.noTDX = true })); !errors.Is(err, ErrNoTDXMetadata) {
		t.Errorf("missing entry: %v, want ErrNoTDXMetadata", err)
	}
	for _, e := range [][]byte{nil, {1, 2}, {0xff, 0xff, 0xff, 0xff}, {4, 0, 0, 0}} {
		if _, err := ParseMetadata(good, e); err == nil {
			t.Errorf("ParseMetadata accepted offset entry %x", e)
		}
	}
	huge := mod(func(b *fwBuilder) {
		b.sections[1].MemoryAddress = 1 << 44
		b.sections[1].MemoryDataSize = 1 << 40
		b.sections[1].Attributes = AttrMRExtend
	})
	if _, err := FirmwareMRTD(huge, Options{}); err == nil || !strings.Contains(err.Error(), "limits") {
		t.Errorf("FirmwareMRTD of a 1 TiB section: %v, want a limit error", err)
	}
	// Metadata built by hand skips Parse's checks; sizes whose sum wraps
	// around must still be refused before any hashing.
	wrap := &Metadata{Sections: []Section{
		{MemoryDataSize: 1 << 63, Attributes: AttrMRExtend},
		{MemoryAddress: 1 << 63, MemoryDataSize: 1 << 63, Attributes: AttrMRExtend},
	}}
	if _, err := MRTD(good, wrap, Options{}); err == nil || !strings.Contains(err.Error(), "limits") {
		t.Errorf("MRTD with wrapping sizes: %v, want a limit error", err)
	}
}

func TestDirectBoot(t *testing.T) {
	lo := DirectBoot{Cmdline: "ro", Initrd: []byte{1}}.LoadOptions()
	want := []byte("r\x00o\x00 \x00i\x00n\x00i\x00t\x00r\x00d\x00=\x00i\x00n\x00i\x00t\x00r\x00d\x00\x00\x00")
	if !bytes.Equal(lo, want) {
		t.Errorf("load options %q, want %q", lo, want)
	}
	if lo := (DirectBoot{}).LoadOptions(); lo != nil {
		t.Errorf("no cmdline and no initrd gave load options %q", lo)
	}
	if r := (DirectBoot{}).RTMR2(); len(r.Events) != 0 || r.Value != [48]byte{} {
		t.Errorf("empty direct boot RTMR2 %+v, want no events and zero", r)
	}
	r2 := DirectBoot{Cmdline: "console=ttyS0", Initrd: []byte("initrd")}.RTMR2()
	if len(r2.Events) != 2 || !strings.Contains(r2.Events[0].Description, `"console=ttyS0 initrd=initrd"`) {
		t.Errorf("RTMR2 events %+v", r2.Events)
	}
	// RTMR = SHA384(SHA384(0^48 || d0) || d1).
	step := func(r, d []byte) []byte { s := sha512.Sum384(append(append([]byte(nil), r...), d...)); return s[:] }
	manual := step(step(make([]byte, 48), r2.Events[0].Digest), r2.Events[1].Digest)
	if !bytes.Equal(r2.Value[:], manual) {
		t.Errorf("RTMR2 %x, manual replay %x", r2.Value, manual)
	}

	if _, err := (DirectBoot{Kernel: []byte("not a PE")}).RTMR1(); err == nil {
		t.Error("RTMR1 accepted a kernel that is not a PE image")
	}
}

func FuzzParse(f *testing.F) {
	f.Add(smallFirmware().build())
	b := smallFirmware()
	b.sections = b.sections[:2]
	f.Add(b.build())
	f.Fuzz(func(t *testing.T, fw []byte) {
		md, err := Parse(fw)
		if err != nil {
			return
		}
		// Keep executions fast: hashing large (valid) sections teaches the
		// fuzzer nothing, and the limit checks run before any hashing.
		total := uint64(0)
		for _, s := range md.Sections {
			total += s.MemoryDataSize
		}
		if total > 1<<20 {
			md.Sections[0].MemoryDataSize = 1 << 40
		}
		_, _ = MRTD(fw, md, Options{})
		_, _ = MRTD(fw, md, Options{Ordering: TwoPass, SkipPageAug: true})
	})
}

func BenchmarkMRTDDebianOVMF(b *testing.B) {
	fw, err := os.ReadFile(debianOVMF)
	if err != nil {
		b.Skipf("%s: %v", debianOVMF, err)
	}
	b.SetBytes(int64(len(fw)))
	for b.Loop() {
		if _, err := FirmwareMRTD(fw, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

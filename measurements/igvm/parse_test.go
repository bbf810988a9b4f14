package igvm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"reflect"
	"strings"
	"testing"
)

// handFile assembles an IGVM file byte by byte, independently of Marshal:
// one SEV-SNP platform (mask 1), a guest policy, one page of data at GPA
// 0x1000 and one VP context.
func handFile(t *testing.T) []byte {
	t.Helper()
	b := handFileBytes()
	if len(b) != 136+2*PageSize {
		t.Fatalf("hand-built file is %d bytes; the variable headers must be 112", len(b))
	}
	return b
}

func handFileBytes() []byte {
	le := binary.LittleEndian
	var vh []byte
	tlv := func(typ HeaderType, body []byte) {
		vh = le.AppendUint32(vh, uint32(typ))
		vh = le.AppendUint32(vh, uint32(len(body)))
		vh = append(vh, body...)
		for len(vh)%8 != 0 {
			vh = append(vh, 0)
		}
	}
	const varOff = 24
	// Platform: mask 1, VTL 0, SEV-SNP, version 1, no shared boundary.
	tlv(TypeSupportedPlatform, []byte{1, 0, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	policy := le.AppendUint64(nil, 0x30000)
	policy = le.AppendUint32(policy, 1)
	tlv(TypeGuestPolicy, le.AppendUint32(policy, 0))
	// Directives are laid out below with data offsets computed by hand:
	// the variable headers are 24+24+32+32 = 112 bytes, so data starts at
	// 24 + 112 = 136.
	const dataStart = varOff + 112
	pd := le.AppendUint64(nil, 0x1000)
	pd = le.AppendUint32(pd, 1)
	pd = le.AppendUint32(pd, dataStart)
	pd = le.AppendUint32(pd, uint32(PageUnmeasured))
	pd = le.AppendUint16(pd, uint16(PageDataNormal))
	tlv(TypePageData, le.AppendUint16(pd, 0))
	vp := le.AppendUint64(nil, 0xFFFFFFFFF000)
	vp = le.AppendUint32(vp, 1)
	vp = le.AppendUint32(vp, dataStart+PageSize)
	vp = le.AppendUint16(vp, 0)
	tlv(TypeVPContext, le.AppendUint16(vp, 0))
	page := bytes.Repeat([]byte{0xAB}, PageSize)
	vmsa := bytes.Repeat([]byte{0xCD}, PageSize)
	total := dataStart + 2*PageSize
	out := le.AppendUint32(nil, Magic)
	out = le.AppendUint32(out, 1)
	out = le.AppendUint32(out, varOff)
	out = le.AppendUint32(out, uint32(len(vh)))
	out = le.AppendUint32(out, uint32(total))
	out = le.AppendUint32(out, 0)
	out = append(out, vh...)
	sum := crc32.ChecksumIEEE(out)
	le.PutUint32(out[20:], sum)
	out = append(out, page...)
	return append(out, vmsa...)
}

func TestParseHandBuilt(t *testing.T) {
	f, err := Parse(handFile(t))
	if err != nil {
		t.Fatal(err)
	}
	if f.FormatVersion != 1 || len(f.Platform) != 1 || len(f.Initialization) != 1 || len(f.Directives) != 2 {
		t.Fatalf("parsed %+v", f)
	}
	mask, err := f.PlatformMask(PlatformSEVSNP)
	if err != nil || mask != 1 {
		t.Fatalf("PlatformMask = %#x, %v", mask, err)
	}
	if _, err := f.PlatformMask(PlatformTDX); err == nil || !strings.Contains(err.Error(), "sev-snp") {
		t.Errorf("PlatformMask(TDX) error = %v", err)
	}
	if gp := f.Initialization[0].(*GuestPolicy); gp.Policy != 0x30000 || gp.CompatibilityMask != 1 {
		t.Errorf("policy = %+v", gp)
	}
	pd := f.Directives[0].(*PageData)
	if pd.GPA != 0x1000 || pd.Flags != PageUnmeasured || pd.FileOffset != 136 || !bytes.Equal(pd.Data, bytes.Repeat([]byte{0xAB}, PageSize)) {
		t.Errorf("page data = gpa %#x flags %v off %#x", pd.GPA, pd.Flags, pd.FileOffset)
	}
	vp := f.Directives[1].(*VPContext)
	if vp.GPA != 0xFFFFFFFFF000 || len(vp.Data) != PageSize || vp.Data[0] != 0xCD {
		t.Errorf("vp context = gpa %#x, %d bytes", vp.GPA, len(vp.Data))
	}
	// Marshal lays the file out exactly like the hand-built one.
	out, err := Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, handFile(t)) {
		t.Error("Marshal(Parse(file)) differs from the hand-built file")
	}
}

// allHeaders is a File with one of every header type the package knows.
func allHeaders() *File {
	page := bytes.Repeat([]byte{7}, PageSize)
	id := &SNPIDBlock{CompatibilityMask: 1, AuthorKeyEnabled: 1, Version: 1, GuestSVN: 3, IDKeyAlgorithm: 1, AuthorKeyAlgorithm: 1}
	id.LD[0], id.FamilyID[1], id.ImageID[2] = 1, 2, 3
	id.IDKeySignature.R[0], id.IDKeySignature.S[71] = 4, 5
	id.IDPublicKey = SNPPublicKey{Curve: 2}
	id.IDPublicKey.QX[3], id.IDPublicKey.QY[4] = 6, 7
	id.AuthorKeySignature.R[9] = 8
	id.AuthorPublicKey = SNPPublicKey{Curve: 2}
	id.AuthorPublicKey.QY[71] = 9
	return &File{
		FormatVersion: 1,
		Platform: []Header{
			&SupportedPlatform{CompatibilityMask: 1, PlatformType: PlatformSEVSNP, PlatformVersion: 1},
			&SupportedPlatform{CompatibilityMask: 2, PlatformType: PlatformTDX, PlatformVersion: 1, HighestVTL: 0, SharedGPABoundary: 1 << 47},
			&Unknown{HeaderType: 0x55 | OptionalBit, Body: []byte{1, 2, 3}},
		},
		Initialization: []Header{
			&GuestPolicy{Policy: 0x30000, CompatibilityMask: 1},
			&RelocatableRegion{CompatibilityMask: 2, VPIndex: 1, VTL: 2, Flags: 3, RelocationAlignment: 0x200000, RegionGPA: 0x400000, RegionSize: 0x1000, MinimumGPA: 0x200000, MaximumGPA: 0x800000},
			&PageTableRelocation{CompatibilityMask: 2, VPIndex: 0, VTL: 0, GPA: 0x10000, Size: 0x4000, UsedSize: 0x2000},
			&CorimData{Kind: TypeCorimDocument, CompatibilityMask: 1, Data: []byte("corim")},
			&CCAPolicy{CompatibilityMask: 2, AttributesRequiredZeroes: 1, AttributesRequiredOnes: 2, HashAlgorithm: 2, LFAPolicy: 1},
		},
		Directives: []Header{
			&ParameterArea{NumberOfBytes: PageSize, Index: 0},
			&ParameterArea{NumberOfBytes: PageSize, Index: 1, InitialData: page},
			&Parameter{Kind: TypeVPCount, Index: 0, ByteOffset: 0},
			&Parameter{Kind: TypeMemoryMap, Index: 1, ByteOffset: 8},
			&Parameter{Kind: TypeEnvironmentInfo, Index: 0, ByteOffset: 4},
			&Parameter{Kind: TypeCommandLine, Index: 1, ByteOffset: 16},
			&ParameterInsert{GPA: 0x2000, CompatibilityMask: 3, Index: 0},
			&ParameterInsert{GPA: 0x3000, CompatibilityMask: 3, Index: 1},
			&PageData{GPA: 0x4000, CompatibilityMask: 3, Data: page},
			&PageData{GPA: 0x5000, CompatibilityMask: 1, Flags: PageUnmeasured},
			&PageData{GPA: 0x200000, CompatibilityMask: 1, Flags: PageIs2MB},
			&PageData{GPA: 0x6000, CompatibilityMask: 1, DataType: PageDataSecrets},
			&PageData{GPA: 0x7000, CompatibilityMask: 1, DataType: PageDataCPUIDData, Data: page},
			&RequiredMemory{GPA: 0x100000, CompatibilityMask: 3, NumberOfBytes: 0x100000, Flags: 1},
			&ErrorRange{GPA: 0x8000, CompatibilityMask: 1, SizeBytes: 0x1000},
			&VPContext{GPA: 0xFFFFFFFFF000, CompatibilityMask: 1, VPIndex: 0, Data: bytes.Repeat([]byte{9}, PageSize)},
			&VBSMeasurement{CompatibilityMask: 2, Body: make([]byte, 860)},
			id,
		},
	}
}

// clearOffsets zeroes the FileOffset fields Parse fills in and turns empty
// data into nil, so a parsed file compares equal to the one marshalled.
func clearOffsets(f *File) {
	for _, hs := range [][]Header{f.Platform, f.Initialization, f.Directives} {
		for _, h := range hs {
			switch h := h.(type) {
			case *PageData:
				h.FileOffset = 0
			case *VPContext:
				h.FileOffset = 0
			case *ParameterArea:
				h.FileOffset = 0
			case *CorimData:
				h.FileOffset = 0
			}
		}
	}
}

func TestRoundTripAllHeaders(t *testing.T) {
	in := allHeaders()
	b, err := Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	// The data is stored once: the repeated page, the VMSA, "corim".
	if want := 24 + 3*PageSize; len(b) > want+2000 {
		t.Errorf("file is %d bytes; identical pages should be stored once", len(b))
	}
	clearOffsets(out)
	if !reflect.DeepEqual(in, out) {
		for i := range in.Directives {
			if !reflect.DeepEqual(in.Directives[i], out.Directives[i]) {
				t.Errorf("directive %d: wrote %+v, read %+v", i, in.Directives[i], out.Directives[i])
			}
		}
		t.Fatal("round trip changed the file")
	}
	b2, err := Marshal(out)
	if err != nil || !bytes.Equal(b, b2) {
		t.Errorf("second Marshal differs (%v)", err)
	}
	snp := Filter(out.Directives, 1)
	tdx := Filter(out.Directives, 2)
	if len(snp) != 17 || len(tdx) != 11 {
		t.Errorf("Filter: %d SEV-SNP and %d TDX directives, want 17 and 11", len(snp), len(tdx))
	}
}

func TestVersion2(t *testing.T) {
	f := allHeaders()
	f.FormatVersion = 2
	b, err := Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if out.FormatVersion != 2 || out.PageSize != PageSize || out.Architecture != 0 {
		t.Errorf("v2 header = %d %d %d", out.FormatVersion, out.PageSize, out.Architecture)
	}
	binary.LittleEndian.PutUint32(b[28:], 65536)
	fixSum(b)
	if _, err := Parse(b); err == nil || !strings.Contains(err.Error(), "page size") {
		t.Errorf("64K page size: %v", err)
	}
}

// fixSum recomputes the checksum of an edited file.
func fixSum(b []byte) {
	le := binary.LittleEndian
	fixed := fixedHeaderSizeV1
	if le.Uint32(b[4:]) == 2 {
		fixed = fixedHeaderSizeV2
	}
	off, size := le.Uint32(b[8:]), le.Uint32(b[12:])
	le.PutUint32(b[20:], 0)
	crc := crc32.NewIEEE()
	crc.Write(b[:fixed])
	crc.Write(b[off : off+size])
	le.PutUint32(b[20:], crc.Sum32())
}

func TestParseErrors(t *testing.T) {
	good := handFile(t)
	le := binary.LittleEndian
	edit := func(fn func(b []byte) []byte, resum bool) []byte {
		b := fn(append([]byte(nil), good...))
		if resum {
			fixSum(b)
		}
		return b
	}
	// Offsets into the hand-built file: platform at 24, policy at 48,
	// page data at 72 (body at 80), VP context at 104 (body at 112).
	cases := []struct {
		name string
		file []byte
		want string
	}{
		{"empty", nil, "truncated fixed header"},
		{"short", good[:20], "truncated fixed header"},
		{"bad magic", edit(func(b []byte) []byte { b[0] = 'X'; return b }, false), "not an IGVM file"},
		{"version 3", edit(func(b []byte) []byte { le.PutUint32(b[4:], 3); return b }, true), "unsupported format version 3"},
		{"bad checksum", edit(func(b []byte) []byte { b[60]++; return b }, false), "checksum mismatch"},
		{"truncated file", good[:len(good)-1], "says the file has"},
		{"trailing data", append(append([]byte(nil), good...), 0), "says the file has"},
		{"var headers past end", edit(func(b []byte) []byte { le.PutUint32(b[12:], uint32(len(b))); return b }, false), "truncated variable headers"},
		{"unaligned var offset", edit(func(b []byte) []byte { le.PutUint32(b[8:], 28); return b }, false), "8-byte aligned"},
		{"truncated header", edit(func(b []byte) []byte { le.PutUint32(b[12:], 84); return b }, true), "a type/length pair needs 8"},
		{"length past end", edit(func(b []byte) []byte { le.PutUint32(b[108:], 200); return b }, true), "runs past the end of the variable headers"},
		{"wrong length", edit(func(b []byte) []byte { le.PutUint32(b[28:], 12); return b }, true), "length 12, the structure is 16 bytes"},
		{"nonzero padding", edit(func(b []byte) []byte { b[135] = 1; return b }, true), "non-zero alignment padding"},
		{"page offset past end", edit(func(b []byte) []byte { le.PutUint32(b[92:], uint32(len(b)-100)); return b }, true), "data offset past the end"},
		{"page offset in headers", edit(func(b []byte) []byte { le.PutUint32(b[92:], 64); return b }, true), "points into the headers"},
		{"vp without data", edit(func(b []byte) []byte { le.PutUint32(b[124:], 0); return b }, true), "has no data"},
		{"vp offset past end", edit(func(b []byte) []byte { le.PutUint32(b[124:], uint32(len(b)+1)); return b }, true), "data offset past the end"},
		{"unaligned page gpa", edit(func(b []byte) []byte { le.PutUint64(b[80:], 0x1800); return b }, true), "not aligned"},
		{"section order", edit(func(b []byte) []byte { le.PutUint32(b[104:], uint32(TypeGuestPolicy)); return b }, true), "sections must be in the order"},
		{"unknown required type", edit(func(b []byte) []byte { le.PutUint32(b[72:], 0x3F0); return b }, true), "unknown header type 0x3f0"},
		{"no section", edit(func(b []byte) []byte { le.PutUint32(b[72:], 0x250); return b }, true), "in no section's type range"},
		{"two-bit platform mask", edit(func(b []byte) []byte { b[32] = 3; return b }, true), "exactly one bit"},
		{"reserved policy", edit(func(b []byte) []byte { b[68] = 1; return b }, true), "reserved field"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.file)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Parse error = %v, want one containing %q", err, c.want)
			}
		})
	}
	if _, err := Parse(edit(func(b []byte) []byte { b[0] = 'X'; return b }, false)); !errors.Is(err, ErrNotIGVM) {
		t.Errorf("bad magic is not ErrNotIGVM: %v", err)
	}
	if _, err := Parse(edit(func(b []byte) []byte { b[60]++; return b }, false)); !errors.Is(err, ErrChecksum) {
		t.Errorf("bad checksum is not ErrChecksum: %v", err)
	}
	// An unknown type with the optional bit set is kept.
	f, err := Parse(edit(func(b []byte) []byte { le.PutUint32(b[72:], 0x3F0|uint32(OptionalBit)); return b }, true))
	if err != nil {
		t.Fatal(err)
	}
	if u, ok := f.Directives[0].(*Unknown); !ok || len(u.Body) != 24 {
		t.Errorf("optional unknown header parsed as %#v", f.Directives[0])
	}
}

func TestMarshalErrors(t *testing.T) {
	cases := []struct {
		name string
		f    *File
		want string
	}{
		{"wrong section", &File{Platform: []Header{&GuestPolicy{}}}, "initialization header"},
		{"big page", &File{Directives: []Header{&PageData{Data: make([]byte, PageSize+1)}}}, "at most one 4 KiB page"},
		{"unaligned 2M", &File{Directives: []Header{&PageData{GPA: 0x1000, Flags: PageIs2MB}}}, "not aligned"},
		{"empty vp", &File{Directives: []Header{&VPContext{}}}, "VP context data"},
		{"unknown required", &File{Directives: []Header{&Unknown{HeaderType: 0x3F0}}}, "optional bit"},
		{"parameter kind", &File{Directives: []Header{&Parameter{Kind: TypePageData}}}, "not a parameter header"},
		{"nil", &File{Directives: []Header{nil}}, "is nil"},
	}
	for _, c := range cases {
		if _, err := Marshal(c.f); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Marshal error = %v, want %q", c.name, err, c.want)
		}
	}
}
